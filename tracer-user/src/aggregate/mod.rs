//! Aggregation of traced calls for `cudatrace run`: per process and (api, kernel) counts, bytes,
//! bucketed latency, and latency quantiles over sliding windows (1 min, 5 min) and since start.
//!
//! Memory stays flat as events grow: a process's series live in its registry entry and go with
//! it, kernels beyond `max_kernels` per process are counted under `kernel="other"` from the
//! start, and at scrape time only the top `top_kernels` by time keep their own label (the rest
//! are summed into "other"). Window slices exist only while calls arrive.
pub mod sketch;
pub mod windows;

// foldhash, here and in the other per-process tables: randomly seeded like std's SipHash (no
// crafted-collision floods) at a fraction of its cost; they are looked up on every traced call.
use foldhash::HashMap;
use std::{sync::Arc, time::Instant};

use tracer_common::{launches::bucket_bounds, Api, Kind};

use crate::{
    enrich::kernels::KernelName, event::monotonic_ns, event::Detail, event::Event,
    event::LaunchDelta, identity::ProcessRef,
};
use sketch::AGGREGATE;
use windows::Windows;

/// Upper bounds (seconds) of the Prometheus latency buckets: 1 µs to 10 s.
pub const BUCKETS: [f64; 22] = [
    1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2,
    5e-2, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
/// Index into [`BUCKETS`] (or +Inf, last) of a duration.
fn bucket_index(ns: u64) -> usize {
    let secs = ns as f64 / 1e9;
    BUCKETS
        .iter()
        .position(|le| secs <= *le)
        .unwrap_or(BUCKETS.len())
}

mod failed;
pub use failed::Failed;

/// The label under which kernels past the limits are counted.
pub const OTHER: &str = "other";
/// Series key of the launches past `max_kernels`.
const OVERFLOW: u64 = tracer_common::launches::OVERFLOW_FUNCTION;
/// Series key of calls that are not launches.
const NO_KERNEL: u64 = u64::MAX - 1;

/// Cumulative totals of one (process, api, kernel) series.
#[derive(Clone, Debug, Default)]
pub struct Series {
    /// Calls completed.
    pub calls: u64,
    /// Calls that returned an error.
    pub errors: u64,
    /// Bytes copied (copies only).
    pub bytes: u64,
    /// Kernel runs (launches only): the successful launches not captured into a graph.
    pub runs: u64,
    /// Sum of durations, ns.
    pub sum_ns: u64,
    /// Count per bucket of [`BUCKETS`] (not cumulative), plus +Inf last.
    pub buckets: [u64; BUCKETS.len() + 1],
    /// The failed calls among those (their results and durations), once one failed.
    pub failed: Option<Box<Failed>>,
    /// Of `calls`, launches counted without their return (uprobe sessions): their durations
    /// (in `buckets`, `sum_ns`) are the sample's, spread.
    pub untimed: u64,
    /// Failures estimated among the untimed launches (not in `errors`).
    pub errors_estimated: u64,
}

impl Series {
    fn add(&mut self, other: &Series) {
        self.calls += other.calls;
        self.errors += other.errors;
        self.untimed += other.untimed;
        self.errors_estimated += other.errors_estimated;
        self.runs += other.runs;
        // Saturating: a tenant's calls can claim any duration or copy size.
        self.bytes = self.bytes.saturating_add(other.bytes);
        self.sum_ns = self.sum_ns.saturating_add(other.sum_ns);
        for (a, b) in self.buckets.iter_mut().zip(other.buckets.iter()) {
            *a += b;
        }
        if let Some(f) = &other.failed {
            self.failed.get_or_insert_default().merge(f);
        }
    }
}

/// One process's series (its registry entry holds them).
#[derive(Default)]
pub struct ProcessSeries {
    /// Keyed by (api, function handle; `NO_KERNEL` when not a launch, `OVERFLOW` past
    /// `max_kernels`): hashing a handle per event is cheaper than hashing a name. The label
    /// rides along.
    series: HashMap<(Api, u64), (Arc<str>, Series)>,
    windows: HashMap<Api, Windows>,
    kernels: usize,
    /// Kernel runs of graph launches, by function handle (`OVERFLOW` past `max_kernels`).
    graph_runs: HashMap<u64, (Arc<str>, u64)>,
}

/// Limits on the series kept per process (from the config file).
#[derive(Clone, Copy, Debug)]
pub struct SeriesLimits {
    /// Kernels per process with their own label at scrape time.
    pub top_kernels: usize,
    /// Kernels per process tracked at all; later ones count as "other" from the start.
    pub max_kernels: usize,
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

/// The aggregation's clock and limits; the series themselves live in the registry.
pub struct Aggregator {
    limits: SeriesLimits,
    started: Instant,
    /// CLOCK_MONOTONIC ns at `started`: events place themselves in the windows by their own
    /// timestamps, which saves reading the clock per event.
    started_ns: u64,
    /// The latest call's end, seconds after start.
    latest_secs: u64,
}

impl Aggregator {
    /// An aggregation starting now.
    pub fn new(limits: SeriesLimits) -> Self {
        Aggregator {
            limits,
            started: Instant::now(),
            started_ns: monotonic_ns(),
            latest_secs: 0,
        }
    }

    fn now_secs(&self) -> u64 {
        self.started.elapsed().as_secs()
    }

    /// Seconds since start of a call that ended at `end_ns`. Calls reach the ring buffer about
    /// in the order they end, not exactly: the clock is kept non-decreasing so that slices are
    /// only ever appended.
    fn secs(&mut self, end_ns: u64) -> u64 {
        let secs = (end_ns.saturating_sub(self.started_ns) / 1_000_000_000).max(self.latest_secs);
        self.latest_secs = secs;
        secs
    }

    /// Counts one call into its process's series (a launch the kernel counted already only
    /// through [`Aggregator::observe_launches`]); `captured`: made on a capturing stream, so a
    /// launch is a driver call that ran nothing.
    pub fn observe(
        &mut self,
        p: &mut ProcessSeries,
        ev: &Event,
        kernel: Option<&KernelName>,
        captured: bool,
    ) {
        if ev.counted && ev.result == 0 {
            return;
        }
        let secs = self.secs(ev.start_ns.saturating_add(ev.duration_ns));
        let handle = match ev.detail {
            Detail::Launch { function, .. } => function,
            _ => NO_KERNEL,
        };
        let s = self.series_of(p, ev.api, handle, kernel);
        if ev.counted {
            // A failed launch the kernel counted: its time is in the kernel's count, its
            // result only in its record.
            if ev.result != 0 {
                s.failed.get_or_insert_default().count(ev.result, 1);
            }
            return;
        }
        if ev.result != 0 {
            let f = s.failed.get_or_insert_default();
            f.add(Some(ev.result), 1, ev.duration_ns, ev.duration_ns);
        }
        s.calls += 1;
        // Written at entry outside a window (a captured launch, or one no cell counted): in
        // the first bucket, as an untimed cell with no sample to spread by; no quantile.
        s.untimed += u64::from(ev.untimed);
        s.errors += u64::from(ev.result != 0);
        if ev.result == 0 && !captured && ev.api.info().kind == Kind::Launch {
            s.runs += 1;
        }
        s.sum_ns = s.sum_ns.saturating_add(ev.duration_ns);
        // A failed copy moved nothing, whatever size it asked for (a tenant's 2^63 included).
        if let (0, Detail::Copy { bytes, .. }) = (ev.result, &ev.detail) {
            s.bytes = s.bytes.saturating_add(*bytes);
        }
        s.buckets[bucket_index(ev.duration_ns)] += 1;
        // Quantile sketches for the calls that carry latency (launches, copies, waits); the rare
        // lookups and allocations have their buckets only, which keeps memory per process small.
        if !ev.untimed
            && matches!(
                ev.api.info().kind,
                Kind::Launch | Kind::GraphLaunch | Kind::Memcpy | Kind::Memset | Kind::Sync
            )
        {
            p.windows
                .entry(ev.api)
                .or_default()
                .record(secs, ev.duration_ns);
        }
    }

    /// Counts launches the kernel counted (one cell's gain since the last read), read now.
    pub fn observe_launches(
        &mut self,
        p: &mut ProcessSeries,
        d: &LaunchDelta,
        kernel: Option<&KernelName>,
    ) {
        let secs = self.secs(monotonic_ns());
        let (low, high) = bucket_bounds(d.bucket);
        let s = self.series_of(p, d.api, d.function, kernel);
        s.calls += d.count;
        s.errors += d.errors;
        s.untimed += d.untimed;
        s.errors_estimated += d.estimated_errors;
        s.runs += d.count.saturating_sub(d.errors);
        s.sum_ns = s.sum_ns.saturating_add(d.sum_ns);
        if d.errors > 0 {
            // The cell's time is not split by outcome: the failures take their share of it.
            let share =
                (u128::from(d.sum_ns) * u128::from(d.errors) / u128::from(d.count.max(1))) as u64;
            s.failed
                .get_or_insert_default()
                .add(None, d.errors, share, high);
        }
        // Every Prometheus bound is a bucket's upper bound: the bucket's calls all fall under
        // the bound of its upper end.
        s.buckets[bucket_index(high)] += d.count;
        p.windows
            .entry(d.api)
            .or_default()
            .record_n(secs, low + (high - low).div_ceil(2), d.count);
    }

    /// Counts the kernel runs of one graph launch of known composition; `name` names a handle.
    pub fn observe_graph(
        &mut self,
        p: &mut ProcessSeries,
        nodes: &[crate::enrich::graphs::Node],
        name: impl Fn(u64) -> Option<Arc<KernelName>>,
    ) {
        for n in nodes {
            let mut key = n.function;
            if !p.graph_runs.contains_key(&key) && p.graph_runs.len() >= self.limits.max_kernels {
                key = OVERFLOW;
            }
            let (label, runs) = p.graph_runs.entry(key).or_insert_with(|| {
                let label: Arc<str> = match (key, name(key)) {
                    (OVERFLOW, _) => Arc::from(OTHER),
                    (_, Some(k)) => k.demangled.clone(),
                    (h, None) => Arc::from(format!("{h:#x}")),
                };
                (label, 0)
            });
            if key != OVERFLOW && label.starts_with("0x") {
                if let Some(k) = name(key) {
                    *label = k.demangled.clone();
                }
            }
            *runs += 1;
        }
    }

    /// Kernel runs per (process, kernel): direct launches and graph-expanded runs alike, the
    /// kernels past the top `top_kernels` of their process (by runs) summed into "other".
    pub fn kernel_runs<'a>(
        &self,
        processes: impl Iterator<Item = (ProcessRef<'a>, &'a ProcessSeries)>,
    ) -> Vec<(ProcessRef<'a>, Arc<str>, u64)> {
        let mut out = Vec::new();
        for (process, p) in processes {
            let mut by_label: HashMap<Arc<str>, u64> = HashMap::default();
            let direct = p
                .series
                .iter()
                .filter(|((api, _), _)| api.info().kind == Kind::Launch)
                .map(|(_, (label, s))| (label, s.runs));
            for (label, runs) in direct.chain(p.graph_runs.values().map(|(l, r)| (l, *r))) {
                if runs > 0 {
                    *by_label.entry(label.clone()).or_default() += runs;
                }
            }
            let mut sorted: Vec<(Arc<str>, u64)> = by_label.into_iter().collect();
            sorted.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            let mut other = 0;
            for (i, (label, runs)) in sorted.into_iter().enumerate() {
                if i < self.limits.top_kernels && &*label != OTHER {
                    out.push((process, label, runs));
                } else {
                    other += runs;
                }
            }
            if other > 0 {
                out.push((process, Arc::from(OTHER), other));
            }
        }
        out
    }

    /// The series of (api, kernel handle) of a process, made on first use.
    fn series_of<'p>(
        &self,
        p: &'p mut ProcessSeries,
        api: Api,
        handle: u64,
        kernel: Option<&KernelName>,
    ) -> &'p mut Series {
        let mut key = (api, handle);
        if handle != NO_KERNEL && !p.series.contains_key(&key) {
            if p.kernels >= self.limits.max_kernels {
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
        s
    }

    /// Every series, with kernels past the top `top_kernels` of their process (by total time)
    /// summed into "other".
    pub fn series<'a>(
        &self,
        processes: impl Iterator<Item = (ProcessRef<'a>, &'a ProcessSeries)>,
    ) -> Vec<SeriesView<'a>> {
        let mut out = Vec::new();
        for (process, p) in processes {
            let mut time_by_label: HashMap<&Arc<str>, u64> = HashMap::default();
            for (label, s) in p
                .series
                .values()
                .filter(|(l, _)| !l.is_empty() && &**l != OTHER)
            {
                let t = time_by_label.entry(label).or_default();
                *t = t.saturating_add(s.sum_ns);
            }
            let mut by_time: Vec<(&Arc<str>, u64)> = time_by_label.into_iter().collect();
            by_time.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
            let top: std::collections::HashSet<&str> = by_time
                .iter()
                .take(self.limits.top_kernels)
                .map(|(k, _)| &***k)
                .collect();
            // Handles with one name (the same kernel in two modules) share a series here.
            let mut merged: HashMap<(Api, Arc<str>), Series> = HashMap::default();
            for ((api, _), (kernel, s)) in &p.series {
                let label = if kernel.is_empty() || top.contains(&**kernel) {
                    kernel.clone()
                } else {
                    Arc::from(OTHER)
                };
                merged.entry((*api, label)).or_default().add(s);
            }
            for ((api, kernel), series) in merged {
                out.push(SeriesView {
                    process,
                    api,
                    kernel,
                    series,
                });
            }
        }
        out
    }

    /// Latency quantiles (0.5, 0.9, 0.99) per (process, api) over 1 min, 5 min and since start.
    pub fn quantiles<'a>(
        &self,
        processes: impl Iterator<Item = (ProcessRef<'a>, &'a ProcessSeries)>,
    ) -> Vec<QuantileView<'a>> {
        let now = self.now_secs();
        let mut out = Vec::new();
        for (process, p) in processes {
            for (api, w) in &p.windows {
                for (window, secs) in [("1m", Some(60)), ("5m", Some(300)), ("all", None)] {
                    let Some(h) = w.merged(now, secs) else {
                        continue;
                    };
                    for q in [0.5, 0.9, 0.99] {
                        out.push(QuantileView {
                            process,
                            api: *api,
                            window,
                            quantile: q,
                            seconds: AGGREGATE.ns(h.value_at_quantile(q)) as f64 / 1e9,
                        });
                    }
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests;
