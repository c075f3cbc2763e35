//! What each process submitted, window by window, and who changed: the evidence of a causal
//! verdict. Submitted work is what a process asks of its GPU (threads launched, graph replays,
//! bytes copied), never how long it waited: waits and device-time estimates rise for every
//! process on a contended GPU, the unchanged ones included, so they are the victim's symptom
//! and no aggressor's evidence. A process is named only where the work it submits rose against
//! its own work before the victim's signal rose, or it arrived since.
use std::collections::VecDeque;

pub use crate::alert::change::{Change, Measure};

/// Windows of submitted work kept per process: the reference a new alert freezes is read from
/// those before its breach began.
pub const KEPT_WINDOWS: usize = 64;
/// Workloads whose last normal window is remembered at most.
pub const MAX_WORKLOADS: usize = 4096;
/// Windows before a breach whose median is a process's work before it.
const REFERENCE_WINDOWS: usize = 12;

/// What one process submitted in one window.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Work {
    /// Monotonic seconds at the window's start.
    pub start: f64,
    /// Window length, seconds.
    pub len: f64,
    /// Kernel launches (graph replays not included).
    pub launches: u64,
    /// Threads those launches asked for (grid x block).
    pub threads: u64,
    /// Graph replays.
    pub graph_launches: u64,
    /// Bytes copied, synchronous or not.
    pub copy_bytes: u64,
    /// Copies.
    pub copies: u64,
    /// Waits (stream, context and event synchronizations, synchronous copies): its steps.
    pub waits: u64,
    /// Nanoseconds its threads waited for a CPU (run-queue delay), when read.
    pub run_delay_ns: Option<u64>,
}

/// Keeps at most [`MAX_WORKLOADS`] of `times` (workload → monotonic seconds): the oldest go.
pub fn bound_times<K: std::hash::Hash + Eq>(times: &mut std::collections::HashMap<K, f64>) {
    if times.len() <= MAX_WORKLOADS {
        return;
    }
    let mut by_age: Vec<f64> = times.values().copied().collect();
    by_age.sort_by(f64::total_cmp);
    let cut = by_age[times.len() - MAX_WORKLOADS];
    times.retain(|_, t| *t >= cut);
}

/// `measure`'s value per second of `w` (0 for the measures no traced window holds).
pub fn per_s(measure: Measure, w: &Work) -> f64 {
    let per_s = |x: u64| x as f64 / w.len.max(1e-3);
    match measure {
        Measure::ThreadsPerS => per_s(w.threads),
        Measure::GraphLaunchesPerS => per_s(w.graph_launches),
        Measure::CopyBytesPerS => per_s(w.copy_bytes),
        Measure::CpuSecondsPerS | Measure::SmUtilPct => 0.0,
    }
}

/// Scalar samples over time (a cgroup's CPU use, an NVML utilization): (start, value), at most
/// [`KEPT_WINDOWS`].
#[derive(Clone, Debug, Default)]
pub struct Recent {
    samples: VecDeque<(f64, f64)>,
}

impl Recent {
    /// Keeps one more sample taken over the window that started at `start`.
    pub fn push(&mut self, start: f64, value: f64) {
        if self.samples.len() >= KEPT_WINDOWS {
            self.samples.pop_front();
        }
        self.samples.push_back((start, value));
    }

    /// The median of the last [`REFERENCE_WINDOWS`] samples before `since`.
    pub fn reference(&self, since: f64) -> Option<f64> {
        let v: Vec<f64> = self
            .samples
            .iter()
            .filter(|(t, _)| *t < since - 1e-6)
            .map(|(_, v)| *v)
            .collect();
        let skip = v.len().saturating_sub(REFERENCE_WINDOWS);
        median(v[skip..].to_vec())
    }

    /// The mean of the samples from `since` on (the last [`REFERENCE_WINDOWS`]); 0 with none.
    pub fn since(&self, since: f64) -> f64 {
        let v: Vec<f64> = self
            .samples
            .iter()
            .filter(|(t, _)| *t >= since - 1e-6)
            .map(|(_, v)| *v)
            .collect();
        let v = &v[v.len().saturating_sub(REFERENCE_WINDOWS)..];
        if v.is_empty() {
            0.0
        } else {
            v.iter().sum::<f64>() / v.len() as f64
        }
    }

    /// The sum of the samples from `since` on.
    pub fn sum_since(&self, since: f64) -> f64 {
        self.samples
            .iter()
            .filter(|(t, _)| *t >= since - 1e-6)
            .map(|(_, v)| *v)
            .sum()
    }

    /// The latest sample's start, if any.
    pub fn last_start(&self) -> Option<f64> {
        self.samples.back().map(|(t, _)| *t)
    }
}

/// A process's recent windows of submitted work.
#[derive(Clone, Debug, Default)]
pub struct WorkHistory {
    windows: VecDeque<Work>,
    /// When its first window began, kept after that window is dropped: a process older than
    /// a reference time did not arrive after it, even when its windows of then are gone.
    first: Option<f64>,
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

impl WorkHistory {
    /// Keeps one more window (the oldest past [`KEPT_WINDOWS`] goes).
    pub fn push(&mut self, w: Work) {
        self.first.get_or_insert(w.start);
        if self.windows.len() >= KEPT_WINDOWS {
            self.windows.pop_front();
        }
        self.windows.push_back(w);
    }

    /// The windows kept, oldest first.
    pub fn windows(&self) -> impl Iterator<Item = &Work> {
        self.windows.iter()
    }

    /// Its windows that started before `since` (the last [`REFERENCE_WINDOWS`] of them).
    fn before(&self, since: f64) -> Vec<&Work> {
        let mut v: Vec<&Work> = self
            .windows
            .iter()
            .filter(|w| w.start + w.len <= since + 1e-6)
            .collect();
        let skip = v.len().saturating_sub(REFERENCE_WINDOWS);
        v.drain(..skip);
        v
    }

    /// `f` of its windows before `since` (their median); `None` when it was not there then.
    /// When it was, but those windows are no longer kept, its oldest kept windows stand in.
    pub fn reference(&self, since: f64, f: impl Fn(&Work) -> Option<f64>) -> Option<f64> {
        let before = self.before(since);
        if before.is_empty() && self.first.is_some_and(|t| t < since - 1e-6) {
            return median(
                self.windows
                    .iter()
                    .take(REFERENCE_WINDOWS)
                    .filter_map(f)
                    .collect(),
            );
        }
        median(before.into_iter().filter_map(f).collect())
    }

    /// `f` of its windows from `since` on (the window now closing is pushed before verdicts
    /// are made): their mean, over at most the last [`REFERENCE_WINDOWS`].
    pub fn since(&self, since: f64, f: impl Fn(&Work) -> Option<f64>) -> f64 {
        let mut v: Vec<f64> = self
            .windows
            .iter()
            .filter(|w| w.start >= since - 1e-6)
            .filter_map(&f)
            .collect();
        let skip = v.len().saturating_sub(REFERENCE_WINDOWS);
        v.drain(..skip);
        if v.is_empty() {
            0.0
        } else {
            v.iter().sum::<f64>() / v.len() as f64
        }
    }
}

/// Thresholds of a change.
#[derive(Clone, Copy, Debug)]
pub struct Rise {
    /// A measure rose when now is over before by this ratio (0.5: +50%).
    pub ratio: f64,
    /// ... and its rise is at least this share of the work of that measure now on the GPU.
    pub min_share: f64,
}

impl Rise {
    /// Whether `c` is a rise, given `total_now` of its measure on the GPU (everyone's now).
    pub fn rose(&self, c: &Change, total_now: f64) -> bool {
        c.now > 0.0
            && c.now > c.before * (1.0 + self.ratio)
            && c.rise() >= self.min_share * total_now.max(f64::MIN_POSITIVE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(start: f64, threads: u64) -> Work {
        Work {
            start,
            len: 5.0,
            threads,
            ..Work::default()
        }
    }

    #[test]
    fn reference_is_the_median_before_and_now_the_mean_since() {
        let mut h = WorkHistory::default();
        for (i, t) in [100, 100, 900, 100, 100, 500, 500].iter().enumerate() {
            h.push(w(i as f64 * 5.0, *t));
        }
        let threads = |w: &Work| Some(w.threads as f64);
        // Windows starting at 0..20 ended by 25: a spike in one does not move the median.
        assert_eq!(h.reference(25.0, threads), Some(100.0));
        // Since 25: 500, 500 and the latest 800.
        h.push(w(35.0, 800));
        assert_eq!(h.since(25.0, threads), 600.0);
        // Nothing before the first window.
        assert_eq!(h.reference(0.0, threads), None);
        for i in 0..100 {
            h.push(w(100.0 + i as f64 * 5.0, 1));
        }
        assert_eq!(h.windows().count(), KEPT_WINDOWS);
        // Its windows of 25 s are gone, but it was there: its oldest kept ones stand in.
        assert_eq!(h.reference(25.0, threads), Some(1.0));
        // A process that began after a reference time arrived after it.
        let mut late = WorkHistory::default();
        late.push(w(50.0, 9));
        assert_eq!(late.reference(25.0, threads), None);
        let mut times: std::collections::HashMap<u32, f64> = (0..MAX_WORKLOADS as u32 + 10)
            .map(|i| (i, f64::from(i)))
            .collect();
        bound_times(&mut times);
        assert_eq!(times.len(), MAX_WORKLOADS);
        assert!(!times.contains_key(&9) && times.contains_key(&10));
    }

    #[test]
    fn a_rise_needs_the_ratio_and_a_share_of_the_gpu() {
        let r = Rise {
            ratio: 0.5,
            min_share: 0.1,
        };
        let c = |before, now| Change {
            measure: Measure::ThreadsPerS,
            before,
            now,
            arrived: before == 0.0,
        };
        assert!(r.rose(&c(100.0, 200.0), 300.0));
        // +40%: not a rise.
        assert!(!r.rose(&c(100.0, 140.0), 300.0));
        // Doubled, but its rise is 1% of the GPU's work: noise.
        assert!(!r.rose(&c(1.0, 2.0), 100.0));
        // Arrived.
        assert!(r.rose(&c(0.0, 50.0), 100.0));
        // Gone quiet is no rise.
        assert!(!r.rose(&c(100.0, 0.0), 100.0));
        assert_eq!(c(0.0, 5e6).words(), "threads_per_s 0 → 5.000e6 (arrived)");
    }
}
