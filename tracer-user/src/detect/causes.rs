//! Why a victim's signal rose, decided in one documented order (docs/alerts.md, "How a cause
//! is decided"): starvation, memory pressure, copy then compute contention by the parties whose
//! submitted work rose, the victim's own workload change, CPU contention, untraced work,
//! throttling, the driver, unexplained. Each cause names only parties that changed, with their
//! before and now; an unchanged neighbour is never named, whatever its size.
use super::{
    change::{Change, Measure},
    classify::{gpus_of, vouched, GpuSet, Seen, Thresholds, Verdict, THROTTLE_BITS},
    signals::Signal,
    verdict::{Nows, Reference, Steps, TRACED},
};
use crate::{
    alert::{Cause, Party},
    nvml::{GpuSample, REASONS},
};

/// The reference and the facts now that a verdict compares, and the victim's cgroup.
pub struct Causal<'a> {
    /// Before the victim's breach.
    pub reference: &'a Reference,
    /// Since it began.
    pub nows: &'a Nows,
    /// The victim's cgroup (its own CPU use is not a preemptor).
    pub victim_cgroup: Option<&'a str>,
}

/// Parties named with their relative rise (their rise over the measure's total now), and
/// whether their change is in what they ask per step (they arrived, or each launch, step or
/// copy of theirs grew) rather than only in their pace.
type Named = Vec<(Party, f64, bool)>;

/// The parties of `named`, shares made of their relative rises, biggest first (at most five).
fn ranked(named: Named) -> Vec<Party> {
    super::host::ranked(named.into_iter().map(|(p, r, _)| (p, r)).collect())
}

/// Traced processes on the victim's GPU whose `measures` rose: each with its largest change.
fn risen(
    signal: Signal,
    victim: &Seen<'_>,
    others: &[(Seen<'_>, GpuSet)],
    vset: &GpuSet,
    measures: &[Measure],
    (c, limits): (&Causal<'_>, &Thresholds),
) -> (Named, Option<String>) {
    let sharing: Vec<(&Seen<'_>, String)> = others
        .iter()
        .filter_map(|(s, set)| vset.shared_with(set).map(|g| (s, g)))
        .collect();
    let mut named = Named::new();
    let mut gpu = None;
    for m in measures {
        let i = TRACED.iter().position(|t| t == m).unwrap_or(0);
        let now = |pid: u32| c.nows.traced.get(&pid).map_or(0.0, |a| a[i]);
        let total: f64 =
            now(victim.process.pid) + sharing.iter().map(|(s, _)| now(s.process.pid)).sum::<f64>();
        for (s, g) in &sharing {
            let pid = s.process.pid;
            let before = c.reference.traced.get(&pid).and_then(|a| a[i]);
            let change = Change {
                measure: *m,
                before: before.unwrap_or(0.0),
                now: now(pid),
                arrived: before.is_none(),
            };
            if !limits.rise.rose(&change, total) {
                continue;
            }
            let rel = change.rise() / total.max(f64::MIN_POSITIVE);
            let per_step = change.arrived
                || matches!(
                    (c.reference.steps.get(&pid), c.nows.steps.get(&pid)),
                    (Some(b), Some(n)) if victim_grew(signal, b, n, limits.rise.ratio)
                );
            match named.iter_mut().find(|(p, _, _)| p.pid == pid) {
                Some(entry) if entry.1 >= rel => {}
                Some(entry) => {
                    entry.0.change = Some(change);
                    entry.1 = rel;
                    entry.2 = per_step;
                }
                None => {
                    let mut p = Party::of(s.process, None);
                    p.change = Some(change);
                    named.push((p, rel, per_step));
                    gpu.get_or_insert_with(|| g.clone());
                }
            }
        }
    }
    (named, gpu)
}

/// Whether `now` rose over `before` by the ratio.
fn grew(before: Option<f64>, now: Option<f64>, ratio: f64) -> bool {
    matches!((before, now), (Some(b), Some(n)) if b > 0.0 && n > b * (1.0 + ratio))
}

/// Whether the victim's own work per step grew (what its signal's kind depends on).
pub fn victim_grew(signal: Signal, before: &Steps, now: &Steps, ratio: f64) -> bool {
    match signal {
        Signal::CopyTime => grew(before.bytes_per_copy, now.bytes_per_copy, ratio),
        _ => {
            grew(before.threads_per_launch, now.threads_per_launch, ratio)
                || grew(before.launches_per_step, now.launches_per_step, ratio)
        }
    }
}

fn words(p: &Party) -> String {
    let what = p
        .change
        .as_ref()
        .map_or_else(String::new, |c| format!(": {}", c.words()));
    format!("{} (pid {}){what}", crate::text::printable(&p.comm), p.pid)
}

/// Classifies why `victim`'s `signal` breached, given every process's last window (`everyone`
/// may include the victim), the latest NVML sample (empty without NVML) and the facts before
/// and since its breach began.
pub fn classify(
    signal: Signal,
    victim: &Seen<'_>,
    everyone: &[Seen<'_>],
    gpus: &[GpuSample],
    limits: Thresholds,
    c: &Causal<'_>,
) -> Verdict {
    let vset = gpus_of(victim.process.pid, victim.process.identity, gpus);
    let mine: Vec<&GpuSample> = gpus.iter().filter(|g| vset.holds(g.index)).collect();
    let memory_ratio = mine
        .iter()
        .filter_map(|g| Some(g.memory_used? as f64 / g.memory_total.filter(|t| *t > 0)? as f64))
        .max_by(f64::total_cmp);
    let utilization = mine
        .iter()
        .filter_map(|g| g.sm_util)
        .max()
        .map(|u| f64::from(u) / 100.0);
    let mut reasons: Vec<&'static str> = REASONS
        .iter()
        .filter(|(bit, _)| {
            bit & THROTTLE_BITS != 0 && mine.iter().any(|g| g.reasons.is_some_and(|r| r & bit != 0))
        })
        .map(|(_, name)| *name)
        .collect();
    reasons.dedup();
    let others: Vec<(Seen<'_>, GpuSet)> = everyone
        .iter()
        .filter(|s| s.process.pid != victim.process.pid && vouched(s.process.pid, gpus))
        .map(|s| (*s, gpus_of(s.process.pid, s.process.identity, gpus)))
        .collect();
    let run_delay = c
        .nows
        .run_delay
        .map(|n| (c.reference.run_delay.unwrap_or(0.0), n));
    let throttled = (c.nows.throttled > 0).then_some(c.nows.throttled);
    let mut chain = Vec::new();
    if let Some(u) = utilization {
        chain.push(format!(
            "NVML: GPU {} SM utilization {:.0}%",
            vset.label(),
            u * 100.0
        ));
    }
    let verdict = |cause, aggressors: Vec<Party>, gpu: Option<String>, mut chain: Vec<String>| {
        chain.extend(aggressors.iter().map(|a| format!("changed: {}", words(a))));
        Verdict {
            cause,
            gpu: gpu.unwrap_or_else(|| vset.label()),
            aggressors,
            memory_ratio,
            utilization,
            reasons: reasons.clone(),
            run_delay,
            throttled,
            chain,
        }
    };
    // 1. Starvation: a call stuck behind work known unfinished.
    let (who, gpu) = super::starved::holders(victim, everyone, gpus);
    if !who.is_empty() {
        chain.push("a call of the victim is stuck behind older unfinished work".into());
        return verdict(Cause::Starvation, who, gpu, chain);
    }
    // 2. Memory pressure, by the memory held.
    if memory_ratio.is_some_and(|r| r >= limits.memory_pressure_ratio) {
        let (who, gpu) = super::classify::shares(victim, &vset, &others, |a| a.memory_bytes as f64);
        chain.push(format!(
            "NVML: GPU memory {:.0}% used",
            memory_ratio.unwrap_or(0.0) * 100.0
        ));
        return verdict(Cause::MemoryPressure, who, gpu, chain);
    }
    // 3, 4. Contention by the parties whose submitted work rose: first those who arrived or
    // ask more per step; a rise in pace alone is weighed after the victim's own change and the
    // CPU (a closed-loop neighbour speeds up whenever the victim slows for its own reasons).
    let measures: &[Measure] = if signal == Signal::CopyTime {
        &[Measure::CopyBytesPerS]
    } else {
        &[Measure::ThreadsPerS, Measure::GraphLaunchesPerS]
    };
    let cause = if signal == Signal::CopyTime {
        Cause::CopyContention
    } else {
        Cause::ComputeContention
    };
    let (named, gpu) = risen(signal, victim, &others, &vset, measures, (c, &limits));
    let (per_step, paced): (Named, Named) = named.into_iter().partition(|(_, _, s)| *s);
    if !per_step.is_empty() {
        return verdict(cause, ranked(per_step), gpu, chain);
    }
    // 5. The victim's own requests changed.
    if victim_grew(
        signal,
        &c.reference.victim,
        &c.nows.victim,
        limits.rise.ratio,
    ) {
        chain.push("the victim's own work per step grew; no neighbour's did".into());
        return verdict(Cause::WorkloadChange, Vec::new(), None, chain);
    }
    // 6. Its threads waited for a CPU.
    if let Some((before, now)) = run_delay {
        if now - before >= limits.run_delay_min && now > before * (1.0 + limits.rise.ratio) {
            chain.push(format!("run-queue delay {before:.3} → {now:.3} s/s"));
            if let Some(n) = throttled {
                chain.push(format!("its own CPU quota throttled it {n} times"));
            }
            let who = super::host::preemptors(c, &limits);
            return verdict(Cause::CpuContention, who, None, chain);
        }
    }
    // 7. Neighbours that only quickened their pace.
    if !paced.is_empty() {
        return verdict(cause, ranked(paced), gpu, chain);
    }
    // 8. Work on its GPU that nothing traced submitted.
    let (who, busier) = super::host::untraced(&vset, everyone, gpus, c, &limits);
    if !who.is_empty() || busier {
        if who.is_empty() {
            chain.push("the GPU is busier and no traced process's work rose: not traced".into());
        }
        return verdict(Cause::UntracedContention, who, None, chain);
    }
    if !reasons.is_empty() && signal != Signal::LaunchLatency {
        return verdict(Cause::Throttling, Vec::new(), None, chain);
    }
    let idle = utilization.is_none_or(|u| u * 100.0 < f64::from(limits.idle_gpu_percent));
    if signal == Signal::LaunchLatency && idle {
        return verdict(Cause::CpuOrDriverContention, Vec::new(), None, chain);
    }
    verdict(Cause::Unexplained, Vec::new(), None, chain)
}
