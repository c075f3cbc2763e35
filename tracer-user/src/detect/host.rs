//! The parties outside the traced processes: cgroups whose CPU use rose (CPU preemptors) and
//! processes NVML lists on the victim's GPU without traced calls (untraced work).
use super::{
    causes::Causal,
    change::{Change, Measure},
    classify::{round3, GpuSet, Seen, Thresholds},
};
use crate::{alert::Party, identity, nvml::GpuSample};

fn party(pid: u32, change: Change, rel: f64) -> (Party, f64) {
    let comm = identity::comm(pid);
    let p = Party {
        pid,
        comm: comm.to_string(),
        namespace: None,
        pod: None,
        container: None,
        share: None,
        workload: None,
        change: Some(change),
        cgroup: None,
        start_time: identity::start_time(pid).unwrap_or(0),
    };
    (p, rel)
}

/// The parties of `named` (each with its rise), shares made of their rises, biggest first (at
/// most five).
pub(super) fn ranked(mut named: Vec<(Party, f64)>) -> Vec<Party> {
    let total: f64 = named.iter().map(|(_, r)| r).sum();
    named.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.pid.cmp(&b.0.pid)));
    named.truncate(5);
    named
        .into_iter()
        .map(|(mut p, r)| {
            p.share = Some(round3(r / total.max(f64::MIN_POSITIVE)));
            p
        })
        .collect()
}

/// Cgroups other than the victim's whose CPU use rose by `cpu_preemptor_min` CPUs and by the
/// rise ratio since the victim's breach began (arrived ones included), biggest rise first.
pub fn preemptors(c: &Causal<'_>, limits: &Thresholds) -> Vec<Party> {
    let mut named = Vec::new();
    for (path, (now, pid)) in &c.nows.cgroups {
        let Some(pid) = *pid else { continue };
        // The root holds every task's use: it is no one's preemptor.
        if path == "/" {
            continue;
        }
        // Its own cgroup, or one above it (whose use includes its own).
        if c.victim_cgroup
            .is_some_and(|v| v == path || v.starts_with(&format!("{path}/")))
        {
            continue;
        }
        let before = c.reference.cgroups.get(path).copied();
        let change = Change {
            measure: Measure::CpuSecondsPerS,
            before: before.unwrap_or(0.0),
            now: *now,
            arrived: before.is_none(),
        };
        if change.rise() < limits.cpu_preemptor_min
            || *now <= change.before * (1.0 + limits.rise.ratio)
        {
            continue;
        }
        let (mut p, rel) = party(pid, change, change.rise());
        p.cgroup = Some(path.clone());
        named.push((p, rel));
    }
    ranked(named)
}

/// Processes NVML lists on the victim's GPU that have no traced calls and whose SM
/// utilization rose by `untraced_min_sm` points; and whether, with none named, the GPU's own
/// utilization rose by twice that.
pub fn untraced(
    vset: &GpuSet,
    everyone: &[Seen<'_>],
    gpus: &[GpuSample],
    c: &Causal<'_>,
    limits: &Thresholds,
) -> (Vec<Party>, bool) {
    let traced = |pid: u32| everyone.iter().any(|s| s.process.pid == pid);
    let mut named = Vec::new();
    for g in gpus.iter().filter(|g| vset.holds(g.index)) {
        for p in g.processes.iter().filter(|p| !traced(p.pid)) {
            let Some(now) = c.nows.sm.get(&p.pid).copied() else {
                continue;
            };
            let before = c.reference.sm.get(&p.pid).copied();
            let change = Change {
                measure: Measure::SmUtilPct,
                before: before.unwrap_or(0.0),
                now,
                arrived: before.is_none(),
            };
            if change.rise() >= limits.untraced_min_sm
                && !named.iter().any(|(x, _): &(Party, f64)| x.pid == p.pid)
            {
                named.push(party(p.pid, change, change.rise()));
            }
        }
    }
    if !named.is_empty() {
        return (ranked(named), false);
    }
    let busier = gpus.iter().filter(|g| vset.holds(g.index)).any(|g| {
        let now = c.nows.gpu.get(&g.index).copied().unwrap_or(0.0);
        let before = c.reference.gpu.get(&g.index).copied();
        before.is_some_and(|b| now - b >= 2.0 * limits.untraced_min_sm)
    });
    (Vec::new(), busier)
}
