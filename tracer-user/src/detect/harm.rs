//! `CudatraceProbeHarm`: cudatrace's own probe harmed a process (`probe::harm` judged the
//! fault, `probe::scope` found it corroborated). Critical at once, with the evidence (site,
//! instruction, kernel, signal, basis); it stays firing while the daemon runs, since the breaker
//! stays open until an operator clears it. `CudatraceProbeHarmSuspected`: the same judgement from
//! one tenant while others use the library, uncorroborated; a warning naming that tenant.
use std::time::SystemTime;

use super::{fact, Detector, Slot};
use crate::{
    alert::{Cause, Party, Severity},
    identity::ProcessRef,
    probe::harm::Harm,
};

impl Detector {
    /// Fires `CudatraceProbeHarm` for `victim`, harmed as `h` says (its breaker opened), or
    /// `CudatraceProbeHarmSuspected` (a warning naming the tenant; nothing detached) when
    /// nothing corroborated it.
    pub fn probe_harm(&mut self, victim: Party, h: &Harm, now_wall: SystemTime) {
        let (cause, severity, chain) = match &h.basis {
            Some(b) => (
                Cause::ProbeHarm,
                Severity::Critical,
                vec![h.line(), b.describe()],
            ),
            None => (
                Cause::ProbeHarmSuspected,
                Severity::Warning,
                vec![
                    h.line(),
                    format!(
                        "tenant {} alone: other tenants use {} and nothing corroborates it; its probes stay",
                        h.tenant, h.library
                    ),
                ],
            ),
        };
        let evidence = crate::alert::Evidence {
            chain,
            ..fact::evidence((cause.as_str(), "faults"), 1.0, 1, 0)
        };
        let rec = fact::firing(
            (cause, severity),
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
