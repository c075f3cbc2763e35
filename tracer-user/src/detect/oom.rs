//! Out of device memory: an allocation that failed with `CUDA_ERROR_OUT_OF_MEMORY` fires
//! `CudatraceGpuOutOfMemory` for its process at the next window (a fact, not a trend: no
//! pending), naming the processes holding the most device memory on its GPU (a process on
//! several GPUs by what it holds on that one, where its devices are known); it resolves once
//! `resolve_after_s` pass without another such failure. A process that exits after its failure
//! (an OOM, then a crash: the common case) keeps its alert here for that long too.
use std::time::SystemTime;

use super::{classify, fact, Detector, ProcessSignals, Processes};
use crate::{
    alert::{AlertChange, AlertState, Cause, Party, Severity},
    config::DetectConfig,
    event::{Detail, Event},
    identity::{Identity, ProcessRef},
    nvml::GpuSample,
};

/// Exited processes whose out-of-memory alert is kept at most; past it the oldest resolves.
const MAX_GONE: usize = 256;

/// One process's failed allocations.
#[derive(Default)]
pub struct Oom {
    /// Failures since the last window.
    pub new: u64,
    /// Bytes the latest failure asked for.
    pub asked: u64,
    /// Monotonic seconds of the window that last saw one.
    pub last: f64,
    /// The alert, while firing.
    pub record: Option<AlertChange>,
}

/// An exited process's out-of-memory state: its names and the memory it held at its exit.
pub struct Gone {
    who: Owned,
    memory_bytes: u64,
    oom: Oom,
}

impl Gone {
    /// Its alert, while firing.
    pub fn record(&self) -> Option<&AlertChange> {
        self.oom.record.as_ref()
    }
}

/// Counts `ev` when it is an allocation the device refused for want of memory.
pub fn observe(s: &mut ProcessSignals, ev: &Event) {
    if ev.result != tracer_common::results::CUDA_ERROR_OUT_OF_MEMORY {
        return;
    }
    if let Detail::Alloc { bytes, .. } = ev.detail {
        s.oom.new += 1;
        s.oom.asked = bytes;
    }
}

/// A process's names, owned, so that the table can change while an alert is made.
struct Owned {
    pid: u32,
    comm: String,
    identity: Identity,
    workload: String,
}

impl Owned {
    fn of(p: ProcessRef<'_>) -> Owned {
        Owned {
            pid: p.pid,
            comm: p.comm.to_owned(),
            identity: p.identity.clone(),
            workload: p.workload.to_owned(),
        }
    }

    fn view(&self) -> ProcessRef<'_> {
        ProcessRef {
            pid: self.pid,
            comm: &self.comm,
            identity: &self.identity,
            workload: &self.workload,
        }
    }
}

/// Who holds device memory: (party, its GPUs, bytes, bytes per GPU where all are known).
type Holding = Vec<(Party, classify::GpuSet, u64, Vec<(String, u64)>)>;

impl Detector {
    /// Keeps the out-of-memory state of a process that exits (`memory_bytes`: what it held).
    pub(super) fn oom_exited(&mut self, who: ProcessRef<'_>, memory_bytes: u64, oom: Oom) {
        if oom.new == 0 && oom.record.is_none() {
            return;
        }
        if self.gone_oom.len() >= MAX_GONE {
            let old = self.gone_oom.remove(0);
            if let Some(mut r) = old.oom.record {
                r.state = AlertState::Resolved;
                r.reason = Some("victim_exited");
                self.outbox.push(r);
            }
        }
        self.gone_oom.push(Gone {
            who: Owned::of(who),
            memory_bytes,
            oom,
        });
    }

    /// The window's out-of-memory alerts: new failures fire (or refresh) them, quiet ones
    /// resolve after `resolve_after_s`.
    pub(super) fn out_of_memory(
        &mut self,
        processes: &mut impl Processes,
        at: (f64, SystemTime),
        cfg: &DetectConfig,
        gpus: &[GpuSample],
    ) {
        let mut holding: Holding = processes
            .tracked()
            .filter(|p| p.memory_bytes > 0 && !p.exited)
            .map(|p| {
                let set = classify::gpus_of(p.pid, p.identity, gpus);
                let on = classify::memory_per_gpu(&p, gpus);
                (Party::of(p.view(), None), set, p.memory_bytes, on)
            })
            .collect();
        for g in self.gone_oom.iter().filter(|g| g.memory_bytes > 0) {
            let set = classify::gpus_of(g.who.pid, &g.who.identity, gpus);
            holding.push((
                Party::of(g.who.view(), None),
                set,
                g.memory_bytes,
                Vec::new(),
            ));
        }
        let named: Vec<Owned> = processes
            .tracked()
            .filter(|p| {
                p.signals
                    .is_some_and(|s| s.oom.new > 0 || s.oom.record.is_some())
            })
            .map(|p| Owned::of(p.view()))
            .collect();
        for (pid, _comm, _, slot) in processes.slots_mut() {
            if let (Some(s), Some(who)) = (slot.as_deref_mut(), named.iter().find(|w| w.pid == pid))
            {
                self.outbox
                    .extend(step(&mut s.oom, who, &holding, at, cfg, gpus));
            }
        }
        let mut gone = std::mem::take(&mut self.gone_oom);
        for g in &mut gone {
            self.outbox
                .extend(step(&mut g.oom, &g.who, &holding, at, cfg, gpus));
        }
        gone.retain(|g| g.oom.record.is_some() || g.oom.new > 0);
        self.gone_oom = gone;
    }
}

/// One window of one process's failures: the change to send, if any.
fn step(
    o: &mut Oom,
    who: &Owned,
    holding: &Holding,
    (now, now_wall): (f64, SystemTime),
    cfg: &DetectConfig,
    gpus: &[GpuSample],
) -> Option<AlertChange> {
    if o.new == 0 {
        if o.record.is_some() && now - o.last >= cfg.resolve_after_s as f64 {
            let r = o.record.take().expect("checked");
            return Some(fact::resolved(r, "no_more_failures", now_wall));
        }
        return None;
    }
    let vset = classify::gpus_of(who.pid, &who.identity, gpus);
    // A process on several GPUs holds, on the victim's, what it allocated there.
    let mut holders: Vec<(Party, u64, String)> = holding
        .iter()
        .filter_map(|(party, set, bytes, on)| {
            let gpu = vset.shared_with(set)?;
            let bytes = match on.is_empty() {
                true => *bytes,
                false => on.iter().find(|(g, _)| *g == gpu).map_or(0, |(_, b)| *b),
            };
            (bytes > 0).then(|| (party.clone(), bytes, gpu))
        })
        .collect();
    holders.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.pid.cmp(&b.0.pid)));
    holders.truncate(5);
    let total: u64 = holders.iter().map(|h| h.1).sum();
    let gpu = holders
        .first()
        .map_or_else(|| vset.label(), |h| h.2.clone());
    let aggressors: Vec<Party> = holders
        .into_iter()
        .map(|(mut p, bytes, _)| {
            p.share = Some((bytes as f64 / total.max(1) as f64 * 1000.0).round() / 1000.0);
            p
        })
        .collect();
    let evidence = fact::evidence(
        ("out_of_memory", "bytes"),
        o.asked as f64,
        o.new,
        cfg.window_s,
    );
    o.new = 0;
    o.last = now;
    if let Some(r) = o.record.as_mut() {
        // Still failing: who holds the memory is refreshed, nothing is sent.
        r.aggressors = aggressors;
        r.evidence = evidence;
        return None;
    }
    let r = fact::firing(
        (Cause::OutOfMemory, Severity::Critical),
        gpu,
        (Party::of(who.view(), None), aggressors),
        evidence,
        now_wall,
    );
    o.record = Some(r.clone());
    Some(r)
}
