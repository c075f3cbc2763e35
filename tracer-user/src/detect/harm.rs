//! `CudatraceProbeHarm`: cudatrace's own probe harmed a process (`probe::harm` judged the
//! fault). Critical at once, with the evidence (site, instruction, kernel, signal); it stays
//! firing while the daemon runs, since the breaker stays open until an operator clears it.
use std::time::SystemTime;

use super::{fact, Detector, Slot};
use crate::{
    alert::{Cause, Party, Severity},
    identity::ProcessRef,
    probe::harm::Harm,
};

impl Detector {
    /// Fires `CudatraceProbeHarm` for `victim`, harmed as `h` says.
    pub fn probe_harm(&mut self, victim: Party, h: &Harm, now_wall: SystemTime) {
        let evidence = crate::alert::Evidence {
            chain: vec![h.line()],
            ..fact::evidence(("probe_harm", "faults"), 1.0, 1, 0)
        };
        let rec = fact::firing(
            (Cause::ProbeHarm, Severity::Critical),
            String::new(),
            (victim, Vec::new()),
            evidence,
            now_wall,
        );
        self.outbox.push(rec);
    }

    /// A process a probe harmed exited: its alerts resolve, but its death is not its own, so
    /// it does not count toward its workload's restarts.
    pub fn exited_after_harm(
        &mut self,
        who: ProcessRef<'_>,
        memory_bytes: u64,
        slot: &mut Slot,
        now_wall: SystemTime,
    ) {
        self.release(who, memory_bytes, slot, now_wall);
    }
}
