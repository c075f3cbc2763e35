//! Device memory leaks: a process whose traced device memory grows steadily (a trend over
//! several windows, not one step) fast enough that its GPU would be full within
//! `leak_horizon_s` fires `CudatraceDeviceMemoryLeak` (warning) with the growth rate and the
//! predicted time to full; it resolves once the growth stops (or slows past the horizon) for
//! `resolve_after_s`, or when the process exits. How full the GPU is comes from NVML: without
//! it there is no prediction, and no alert.
use std::{
    collections::{BTreeMap, VecDeque},
    time::SystemTime,
};

use super::{classify, fact, Detector, Processes};
use crate::{
    alert::{AlertChange, Cause, Evidence, Party, Severity},
    config::DetectConfig,
    nvml::GpuSample,
};

/// Windows of memory kept per process (a minute at 5 s windows).
const KEEP: usize = 12;
/// Windows a trend needs at least.
const MIN_WINDOWS: usize = 6;
/// Of the steps between windows, at least this share must be rises: a trend, not one step.
const RISING_SHARE: f64 = 0.6;

/// One process's device memory over the last windows, and its alert.
#[derive(Default)]
pub struct Leak {
    /// (window end, bytes held).
    held: VecDeque<(f64, u64)>,
    /// The same per GPU, for a process whose memory is known per GPU (`memory_per_gpu`).
    on: BTreeMap<String, VecDeque<(f64, u64)>>,
    /// When it last looked like a leak.
    last: f64,
    /// The alert, while firing.
    pub record: Option<AlertChange>,
}

/// Keeps one more window of a history, the oldest forgotten past [`KEEP`].
fn keep(h: &mut VecDeque<(f64, u64)>, now: f64, bytes: u64) {
    if h.len() == KEEP {
        h.pop_front();
    }
    h.push_back((now, bytes));
}

impl Leak {
    /// The growth and time to full: per GPU where the process's memory is known per GPU (the
    /// GPU that fills first), else its whole memory against its GPUs' least free memory.
    fn worst(
        &self,
        set: &classify::GpuSet,
        gpus: &[GpuSample],
    ) -> (String, Option<f64>, Option<f64>) {
        let to_full = |g: Option<f64>, f: Option<u64>| Some(f? as f64 / g?);
        if self.on.is_empty() {
            let g = growth(&self.held);
            return (set.label(), g, to_full(g, free_bytes(set, gpus)));
        }
        self.on
            .iter()
            .map(|(gpu, h)| {
                let g = growth(h);
                let only = classify::GpuSet::Only(vec![gpu.clone()]);
                (gpu.clone(), g, to_full(g, free_bytes(&only, gpus)))
            })
            .min_by(|a, b| a.2.unwrap_or(f64::MAX).total_cmp(&b.2.unwrap_or(f64::MAX)))
            .expect("not empty")
    }
}

/// Bytes per second by least squares over the kept windows, when they show a steady rise.
fn growth(held: &VecDeque<(f64, u64)>) -> Option<f64> {
    if held.len() < MIN_WINDOWS {
        return None;
    }
    let steps = held.len() - 1;
    let rises = held
        .iter()
        .zip(held.iter().skip(1))
        .filter(|(a, b)| b.1 > a.1)
        .count();
    if (rises as f64) < RISING_SHARE * steps as f64 {
        return None;
    }
    let n = held.len() as f64;
    let (mt, mb) = held
        .iter()
        .fold((0.0, 0.0), |(t, b), (x, y)| (t + x / n, b + *y as f64 / n));
    let (mut num, mut den) = (0.0, 0.0);
    for (t, b) in held {
        num += (t - mt) * (*b as f64 - mb);
        den += (t - mt) * (t - mt);
    }
    let slope = num / den;
    (den > 0.0 && slope > 0.0).then_some(slope)
}

/// Free bytes on the emptiest-to-fill GPU of the set (NVML), if NVML says.
fn free_bytes(set: &classify::GpuSet, gpus: &[GpuSample]) -> Option<u64> {
    gpus.iter()
        .filter(|g| set.holds(g.index))
        .filter_map(|g| Some(g.memory_total?.saturating_sub(g.memory_used?)))
        .min()
}

impl Detector {
    /// The window's leak alerts.
    pub(super) fn leaks(
        &mut self,
        processes: &mut impl Processes,
        (now, now_wall): (f64, SystemTime),
        cfg: &DetectConfig,
        gpus: &[GpuSample],
    ) {
        // Owned first: the slots are borrowed mutably below.
        type Seen = (u32, u64, Party, classify::GpuSet, Vec<(String, u64)>);
        let seen: Vec<Seen> = processes
            .tracked()
            .filter(|p| !p.exited && p.signals.is_some())
            .map(|p| {
                let set = classify::gpus_of(p.pid, p.identity, gpus);
                let on = classify::memory_per_gpu(&p, gpus);
                (p.pid, p.memory_bytes, Party::of(p.view(), None), set, on)
            })
            .collect();
        for (pid, _, _, slot) in processes.slots_mut() {
            let (Some(s), Some((_, bytes, victim, set, on))) =
                (slot.as_deref_mut(), seen.iter().find(|x| x.0 == pid))
            else {
                continue;
            };
            let l = &mut s.leak;
            keep(&mut l.held, now, *bytes);
            // Per GPU while every byte is on a named GPU (a GPU it holds nothing on any more
            // counts 0); histories start anew when that stops.
            if on.is_empty() {
                l.on.clear();
            }
            for (gpu, h) in l.on.iter_mut() {
                keep(h, now, on.iter().find(|o| o.0 == *gpu).map_or(0, |o| o.1));
            }
            for (gpu, b) in on {
                l.on.entry(gpu.clone()).or_insert_with(|| {
                    let mut h = VecDeque::new();
                    keep(&mut h, now, *b);
                    h
                });
            }
            let (gpu, growth, to_full) = l.worst(set, gpus);
            let leaking = to_full.is_some_and(|t| t <= cfg.leak_horizon_s as f64);
            if leaking {
                l.last = now;
            }
            let evidence = Evidence {
                time_to_full_s: to_full.map(|t| t.round()),
                ..fact::evidence(
                    ("device_memory_growth", "bytes_per_second"),
                    growth.map_or(0.0, |g| g.round()),
                    l.held.len() as u64,
                    cfg.window_s,
                )
            };
            match l.record.as_mut() {
                Some(_) if !leaking && now - l.last >= cfg.resolve_after_s as f64 => {
                    let r = l.record.take().expect("checked");
                    self.outbox
                        .push(fact::resolved(r, "growth_stopped", now_wall));
                }
                Some(r) if leaking => r.evidence = evidence,
                Some(_) => {}
                None if leaking => {
                    let r = fact::firing(
                        (Cause::MemoryLeak, Severity::Warning),
                        gpu,
                        (victim.clone(), Vec::new()),
                        evidence,
                        now_wall,
                    );
                    self.outbox.push(r.clone());
                    l.record = Some(r);
                }
                None => {}
            }
        }
    }
}
