//! Aggregation of traced calls for `cudatrace run`: per process and (api, kernel) counts, bytes,
//! bucketed latency, and latency quantiles over sliding windows (1 min, 5 min) and since start.
//!
//! Memory stays flat as events grow: a process's state is dropped when it exits, kernels beyond
//! `max_kernels` per process are counted under `kernel="other"` from the start, and at scrape
//! time only the top `top_kernels` by time keep their own label (the rest are summed into
//! "other"). Window slices exist only while calls arrive.
// foldhash, here and in the other per-process tables: randomly seeded like std's SipHash (no
// crafted-collision floods) at a fraction of its cost; they are looked up on every traced call.
use foldhash::{HashMap, HashMapExt as _};
use std::{
    collections::VecDeque,
    sync::Arc,
    time::Instant,
};

use hdrhistogram::Histogram;
use tracer_common::{Api, Kind};

use crate::{
    events::{Detail, Event},
    identity::{Identity, ProcessRef},
    kernels::KernelName,
};

/// Upper bounds (seconds) of the Prometheus latency buckets: 1 µs to 10 s.
pub const BUCKETS: [f64; 22] = [
    1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25,
    0.5, 1.0, 2.5, 5.0, 10.0,
];
/// The label under which kernels past the limits are counted.
pub const OTHER: &str = "other";
/// Series key of the launches past `max_kernels`.
const OVERFLOW: u64 = u64::MAX;
/// Series key of calls that are not launches.
const NO_KERNEL: u64 = u64::MAX - 1;
/// Unit of the quantile sketches: 100 ns (driver calls take microseconds and up).
const UNIT_NS: u64 = 100;
/// Highest latency the sketches hold, in units: 100 s; longer calls count as this.
const MAX_UNITS: u64 = 1_000_000_000;

/// Cumulative totals of one (process, api, kernel) series.
#[derive(Clone, Debug, Default)]
pub struct Series {
    /// Calls completed.
    pub calls: u64,
    /// Calls that returned an error.
    pub errors: u64,
    /// Bytes copied (copies only).
    pub bytes: u64,
    /// Sum of durations, ns.
    pub sum_ns: u64,
    /// Count per bucket of [`BUCKETS`] (not cumulative), plus +Inf last.
    pub buckets: [u64; BUCKETS.len() + 1],
}

impl Series {
    fn add(&mut self, other: &Series) {
        self.calls += other.calls;
        self.errors += other.errors;
        self.bytes += other.bytes;
        self.sum_ns += other.sum_ns;
        for (a, b) in self.buckets.iter_mut().zip(other.buckets.iter()) {
            *a += b;
        }
    }
}

/// A latency sketch: 2 significant digits (1% error) over 100 ns to 100 s, u32 counts, about
/// 12 KB.
fn sketch() -> Histogram<u32> {
    Histogram::new_with_bounds(1, MAX_UNITS, 2).expect("valid bounds")
}

/// Latency sketches of one (process, api): per 10 s slice for the 1-minute window, per 60 s slice
/// for the 5-minute one, and since start. A call is recorded once, in its 10 s slice; a slice is
/// added into its minute and into the total when the next one begins (or at scrape time, for the
/// newest), which keeps the cost per event to one record.
struct Windows {
    all: Histogram<u32>,
    /// 10-second slices, newest last, covering at most the last minute.
    short: VecDeque<(u64, Histogram<u32>)>,
    /// 60-second slices, newest last, covering at most the last five minutes.
    long: VecDeque<(u64, Histogram<u32>)>,
}

fn slice_for(slices: &mut VecDeque<(u64, Histogram<u32>)>, index: u64, keep: u64) -> &mut Histogram<u32> {
    while slices.front().is_some_and(|(i, _)| *i + keep <= index) {
        slices.pop_front();
    }
    if slices.back().is_none_or(|(i, _)| *i != index) {
        slices.push_back((index, sketch()));
    }
    &mut slices.back_mut().expect("just pushed").1
}

impl Windows {
    fn new() -> Self {
        Windows { all: sketch(), short: VecDeque::new(), long: VecDeque::new() }
    }

    /// Records a call that ended `secs` after start (non-decreasing from call to call).
    fn record(&mut self, secs: u64, ns: u64) {
        let units = ns.div_ceil(UNIT_NS).clamp(1, MAX_UNITS);
        let index = secs / 10;
        if self.short.back().is_some_and(|(i, _)| *i != index) {
            // The newest slice is complete: fold it into its minute and the total.
            let (i, done) = self.short.back().expect("checked");
            let _ = self.all.add(done);
            let _ = slice_for(&mut self.long, i / 6, 5).add(done);
        }
        let _ = slice_for(&mut self.short, index, 6).record(units);
    }

    /// The sketch over the last `window` seconds (60 or 300), or since start.
    fn merged(&self, now_secs: u64, window: Option<u64>) -> Option<Histogram<u32>> {
        let newest = self.short.back();
        let mut h = sketch();
        match window {
            None => {
                h.add(&self.all).ok()?;
                if let Some((_, s)) = newest {
                    h.add(s).ok()?;
                }
            }
            Some(60) => {
                for (i, s) in &self.short {
                    // A slice counts while any of it lies inside the window.
                    if (i + 1) * 10 + 60 > now_secs {
                        h.add(s).ok()?;
                    }
                }
            }
            Some(horizon) => {
                for (i, s) in &self.long {
                    if (i + 1) * 60 + horizon > now_secs {
                        h.add(s).ok()?;
                    }
                }
                // The newest 10 s slice is not folded into its minute yet.
                if let Some((_, s)) = newest.filter(|(i, _)| (i + 1) * 10 + horizon > now_secs) {
                    h.add(s).ok()?;
                }
            }
        }
        (!h.is_empty()).then_some(h)
    }
}

/// One traced process.
struct Process {
    identity: Arc<Identity>,
    comm: String,
    /// Keyed by (api, function handle; `NO_KERNEL` when not a launch, `OVERFLOW` past `max_kernels`):
    /// hashing a handle per event is cheaper than hashing a name. The label rides along.
    series: HashMap<(Api, u64), (Arc<str>, Series)>,
    windows: HashMap<Api, Windows>,
    kernels: usize,
    memory_bytes: u64,
    memory_peak_bytes: u64,
    gpu_ns_estimate: u64,
    /// Seconds since start when the process last made a call.
    last_seen: u64,
    /// When the process exited: its series stay for `Limits::retain_exited` so that the
    /// scrapes after a short job still see its final counts.
    exited_at: Option<Instant>,
}

impl Process {
    fn view(&self, pid: u32) -> ProcessRef<'_> {
        ProcessRef { pid, comm: &self.comm, identity: &self.identity }
    }
}

/// Limits on what is kept (from the config file).
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Kernels per process with their own label at scrape time.
    pub top_kernels: usize,
    /// Kernels per process tracked at all; later ones count as "other" from the start.
    pub max_kernels: usize,
    /// How long an exited process's series are kept.
    pub retain_exited: std::time::Duration,
    /// Processes held at most; past it the longest-exited (else longest-idle) is dropped.
    pub max_processes: usize,
}

/// What a scrape sees of one series.
pub struct SeriesView<'a> {
    /// The process.
    pub process: ProcessRef<'a>,
    /// The api.
    pub api: Api,
    /// The kernel label ("" when not a launch).
    pub kernel: Arc<str>,
    /// Totals.
    pub series: Series,
}

/// One quantile of one (process, api) over one window.
pub struct QuantileView<'a> {
    /// The process.
    pub process: ProcessRef<'a>,
    /// The api.
    pub api: Api,
    /// `1m`, `5m` or `all`.
    pub window: &'static str,
    /// The quantile (0.5, 0.9, 0.99).
    pub quantile: f64,
    /// Seconds.
    pub seconds: f64,
}

/// What a scrape sees of one process's gauges.
pub struct ProcessView<'a> {
    /// The process.
    pub process: ProcessRef<'a>,
    /// Device memory held.
    pub memory_bytes: u64,
    /// Highest device memory held.
    pub memory_peak_bytes: u64,
    /// GPU-time estimate, ns.
    pub gpu_ns_estimate: u64,
}

/// The aggregate of every traced call.
pub struct Aggregator {
    limits: Limits,
    started: Instant,
    /// CLOCK_MONOTONIC ns at `started`: events place themselves in the windows by their own
    /// timestamps, which saves reading the clock per event.
    started_ns: u64,
    /// The latest call's end, seconds after start.
    latest_secs: u64,
    processes: HashMap<u32, Process>,
    /// Events consumed.
    pub events: u64,
    /// Records the kernel could not write (ring buffer full).
    pub dropped: u64,
    /// Processes dropped to stay within `max_processes`.
    pub evicted: u64,
}

impl Aggregator {
    /// An empty aggregate.
    pub fn new(limits: Limits) -> Self {
        Aggregator {
            limits,
            started: Instant::now(),
            started_ns: crate::events::monotonic_ns(),
            latest_secs: 0,
            processes: HashMap::new(),
            events: 0,
            dropped: 0,
            evicted: 0,
        }
    }

    fn now_secs(&self) -> u64 {
        self.started.elapsed().as_secs()
    }

    /// Counts one call.
    pub fn observe(&mut self, ev: &Event, kernel: Option<&KernelName>, identity: &Arc<Identity>) {
        self.events += 1;
        // Calls reach the ring buffer about in the order they end, not exactly: keep the clock
        // non-decreasing so that slices are only ever appended.
        let secs = ((ev.start_ns + ev.duration_ns).saturating_sub(self.started_ns) / 1_000_000_000).max(self.latest_secs);
        self.latest_secs = secs;
        let limits = self.limits;
        if self.processes.get(&ev.pid).is_some_and(|p| p.exited_at.is_some()) {
            // The pid was reused by a new process.
            self.processes.remove(&ev.pid);
        }
        let p = self.processes.entry(ev.pid).or_insert_with(|| Process {
            identity: identity.clone(),
            comm: ev.comm.to_string(),
            series: HashMap::new(),
            windows: HashMap::new(),
            kernels: 0,
            memory_bytes: 0,
            memory_peak_bytes: 0,
            gpu_ns_estimate: 0,
            exited_at: None,
            last_seen: 0,
        });
        let handle = match ev.detail {
            Detail::Launch { function, .. } => function,
            _ => NO_KERNEL,
        };
        let mut key = (ev.api, handle);
        if handle != NO_KERNEL && !p.series.contains_key(&key) {
            if p.kernels >= limits.max_kernels {
                key.1 = OVERFLOW;
            } else {
                p.kernels += 1;
            }
        }
        let (label, s) = p.series.entry(key).or_insert_with(|| {
            let label: Arc<str> = match (key.1, kernel) {
                (NO_KERNEL, _) => Arc::from(""),
                (OVERFLOW, _) => Arc::from(OTHER),
                (_, Some(k)) => k.demangled.clone(),
                (h, None) => Arc::from(format!("{h:#x}")),
            };
            (label, Series::default())
        });
        // A handle launched before its lookup was seen is named once the name is known.
        if let Some(k) = kernel.filter(|_| key.1 != OVERFLOW && label.starts_with("0x")) {
            *label = k.demangled.clone();
        }
        s.calls += 1;
        s.errors += u64::from(ev.result != 0);
        s.sum_ns += ev.duration_ns;
        if let Detail::Copy { bytes, .. } = ev.detail {
            s.bytes += bytes;
        }
        let secs_f = ev.duration_ns as f64 / 1e9;
        let b = BUCKETS.iter().position(|le| secs_f <= *le).unwrap_or(BUCKETS.len());
        s.buckets[b] += 1;
        // Quantile sketches for the calls that carry latency (launches, copies, waits); the rare
        // lookups and allocations have their buckets only, which keeps memory per process small.
        if matches!(ev.api.info().kind, Kind::Launch | Kind::GraphLaunch | Kind::Memcpy | Kind::Sync) {
            p.windows.entry(ev.api).or_insert_with(Windows::new).record(secs, ev.duration_ns);
        }
        p.last_seen = secs;
        if self.processes.len() > limits.max_processes {
            self.evict();
        }
    }

    /// Drops one process to stay within `max_processes`: the one exited longest ago, else the
    /// one idle longest.
    fn evict(&mut self) {
        let victim = self
            .processes
            .iter()
            .min_by_key(|(_, p)| (p.exited_at.is_none(), p.exited_at.map(|t| std::cmp::Reverse(t.elapsed())), p.last_seen))
            .map(|(pid, _)| *pid);
        if let Some(pid) = victim {
            self.processes.remove(&pid);
            self.evicted += 1;
        }
    }

    /// Sets a process's device memory (current and peak bytes).
    pub fn set_memory(&mut self, pid: u32, current: u64, peak: u64) {
        if let Some(p) = self.processes.get_mut(&pid) {
            p.memory_bytes = current;
            p.memory_peak_bytes = peak;
        }
    }

    /// Sets a process's GPU-time estimate.
    pub fn set_gpu_estimate(&mut self, pid: u32, gpu_ns_estimate: u64) {
        if let Some(p) = self.processes.get_mut(&pid) {
            p.gpu_ns_estimate = gpu_ns_estimate;
        }
    }

    /// A process's device memory, from its traced allocations and frees (0 when unknown).
    pub fn memory_bytes(&self, pid: u32) -> u64 {
        self.processes.get(&pid).map_or(0, |p| p.memory_bytes)
    }

    /// Marks a process exited; [`Aggregator::sweep`] drops it after the retention time.
    pub fn forget(&mut self, pid: u32) {
        if let Some(p) = self.processes.get_mut(&pid) {
            p.exited_at.get_or_insert_with(Instant::now);
        }
    }

    /// Drops exited processes kept longer than the retention time.
    pub fn sweep(&mut self) {
        let keep = self.limits.retain_exited;
        self.processes.retain(|_, p| p.exited_at.is_none_or(|t| t.elapsed() < keep));
    }

    /// Every series, with kernels past the top `top_kernels` of their process (by total time)
    /// summed into "other".
    pub fn series(&self) -> Vec<SeriesView<'_>> {
        let mut out = Vec::new();
        for (pid, p) in &self.processes {
            let mut time_by_label: HashMap<&Arc<str>, u64> = HashMap::new();
            for (label, s) in p.series.values().filter(|(l, _)| !l.is_empty() && &**l != OTHER) {
                *time_by_label.entry(label).or_default() += s.sum_ns;
            }
            let mut by_time: Vec<(&Arc<str>, u64)> = time_by_label.into_iter().collect();
            by_time.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
            let top: std::collections::HashSet<&str> =
                by_time.iter().take(self.limits.top_kernels).map(|(k, _)| &***k).collect();
            // Handles with one name (the same kernel in two modules) share a series here.
            let mut merged: HashMap<(Api, Arc<str>), Series> = HashMap::new();
            for ((api, _), (kernel, s)) in &p.series {
                let label = if kernel.is_empty() || top.contains(&**kernel) { kernel.clone() } else { Arc::from(OTHER) };
                merged.entry((*api, label)).or_default().add(s);
            }
            for ((api, kernel), series) in merged {
                out.push(SeriesView { process: p.view(*pid), api, kernel, series });
            }
        }
        out
    }

    /// Latency quantiles (0.5, 0.9, 0.99) per (process, api) over 1 min, 5 min and since start.
    pub fn quantiles(&self) -> Vec<QuantileView<'_>> {
        let now = self.now_secs();
        let mut out = Vec::new();
        for (pid, p) in &self.processes {
            for (api, w) in &p.windows {
                for (window, secs) in [("1m", Some(60)), ("5m", Some(300)), ("all", None)] {
                    let Some(h) = w.merged(now, secs) else { continue };
                    for q in [0.5, 0.9, 0.99] {
                        out.push(QuantileView {
                            process: p.view(*pid),
                            api: *api,
                            window,
                            quantile: q,
                            seconds: (h.value_at_quantile(q) * UNIT_NS) as f64 / 1e9,
                        });
                    }
                }
            }
        }
        out
    }

    /// Every process's gauges.
    pub fn processes(&self) -> impl Iterator<Item = ProcessView<'_>> {
        self.processes.iter().map(|(pid, p)| ProcessView {
            process: p.view(*pid),
            memory_bytes: p.memory_bytes,
            memory_peak_bytes: p.memory_peak_bytes,
            gpu_ns_estimate: p.gpu_ns_estimate,
        })
    }

    /// Number of processes held.
    #[cfg(test)]
    pub fn process_count(&self) -> usize {
        self.processes.len()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn launch(pid: u32, ns: u64, function: u64) -> Event {
        Event {
            api: Api::LaunchKernel,
            pid,
            tid: pid,
            comm: "job".into(),
            start_ns: 0,
            duration_ns: ns,
            result: 0,
            detail: Detail::Launch { function, grid: [1; 3], block: [1; 3], shared_mem_bytes: 0, stream: 0 },
        }
    }

    #[test]
    fn counts_buckets_and_quantiles() {
        let mut a = Aggregator::new(Limits { top_kernels: 10, max_kernels: 100, retain_exited: Duration::ZERO, max_processes: 10 });
        let id = Arc::new(Identity::default());
        let k = KernelName::new("_Z3addv");
        for i in 0..1000u64 {
            // 990 calls of 2 µs, 10 of 800 µs: p99 falls at the boundary, p50 at 2 µs.
            let ns = if i % 100 == 0 { 800_000 } else { 2_000 };
            a.observe(&launch(1, ns, 0x10), Some(&k), &id);
        }
        let series = a.series();
        assert_eq!(series.len(), 1);
        let s = &series[0];
        assert_eq!((s.series.calls, &*s.kernel), (1000, "add()"));
        assert_eq!(s.series.buckets[1], 990, "2 µs falls in the 2.5 µs bucket");
        assert_eq!(s.series.buckets[9], 10, "800 µs falls in the 1 ms bucket");
        let q = a.quantiles();
        let get = |w: &str, q0: f64| q.iter().find(|v| v.window == w && v.quantile == q0).unwrap().seconds;
        assert!((get("1m", 0.5) - 2e-6).abs() < 0.05e-6, "{}", get("1m", 0.5));
        assert!((get("all", 0.99) - 2e-6).abs() < 0.05e-6);
        assert!((get("5m", 0.999_f64.min(0.99)) - 2e-6).abs() < 0.05e-6);
    }

    #[test]
    fn slices_fold_into_minutes_and_the_total() {
        let mut w = Windows::new();
        for (secs, ns) in [(5, 1_000), (15, 2_000), (65, 3_000), (130, 4_000), (400, 5_000)] {
            w.record(secs, ns);
        }
        let count = |h: Option<Histogram<u32>>| h.map_or(0, |h| h.len());
        assert_eq!(count(w.merged(405, None)), 5);
        // The last minute: the call at 400 s only.
        assert_eq!(count(w.merged(405, Some(60))), 1);
        // The last five minutes: minutes 1 and 2 (folded) and the newest slice; minute 0 is out.
        assert_eq!(count(w.merged(405, Some(300))), 3);
        assert_eq!(w.merged(405, Some(300)).unwrap().min(), 30, "3 µs in 100 ns units");
        assert_eq!(count(w.merged(1000, Some(60))), 0);
    }

    #[test]
    fn kernels_past_the_limits_become_other() {
        let mut a = Aggregator::new(Limits { top_kernels: 2, max_kernels: 3, retain_exited: Duration::ZERO, max_processes: 10 });
        let id = Arc::new(Identity::default());
        // Kernel f spends (f+1) * 1000 ns per call; 5 kernels, the 4th and 5th past max_kernels.
        for f in 0..5u64 {
            let name = KernelName::new(&format!("k{f}"));
            a.observe(&launch(7, (f + 1) * 1000, f), Some(&name), &id);
        }
        let mut got: Vec<(String, u64)> = a.series().iter().map(|s| (s.kernel.to_string(), s.series.calls)).collect();
        got.sort();
        // Top 2 by time among the 3 tracked are k2 and k1; k0 folds into other with k3 and k4.
        assert_eq!(got, vec![("k1".into(), 1), ("k2".into(), 1), ("other".into(), 3)]);
        a.forget(7);
        assert_eq!(a.process_count(), 1, "kept for the retention time");
        // Past max_processes the exited one goes first.
        for pid in 100..110 {
            a.observe(&launch(pid, 1000, 1), None, &id);
        }
        assert_eq!((a.process_count(), a.evicted), (10, 1));
        assert!(a.processes().all(|p| p.process.pid != 7));
        a.sweep();
        assert_eq!(a.process_count(), 10);
    }
}
