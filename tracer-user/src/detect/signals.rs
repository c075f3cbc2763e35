//! The signals the detector watches, and one process's calls in the current window from which
//! each signal gets its value.
use std::collections::HashMap;

use hdrhistogram::Histogram;
use tracer_common::{launches::bucket_bounds, Kind};

use crate::{
    aggregate::sketch::LAUNCH, enrich::gputime::BatchEstimate, event::Detail, event::Event,
    event::LaunchDelta,
};

const MIB: f64 = 1_048_576.0;
/// Kernel handles a window keeps apart.
pub const MAX_KERNELS: usize = 256;

/// The signals a process's baseline is kept for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Signal {
    /// p99 of launch call durations (CPU-side).
    LaunchLatency,
    /// Host time blocked in waits per launch.
    WaitPerLaunch,
    /// Time of synchronous copies per MiB (inverse copy throughput).
    CopyTime,
}

impl Signal {
    /// The signal a call of `kind` that does not return holds up: a wait the wait per launch,
    /// a launch the launch latency, a synchronous copy the copy time (None for the others).
    pub fn held_up_by(kind: Kind) -> Option<Signal> {
        match kind {
            Kind::Sync => Some(Signal::WaitPerLaunch),
            Kind::Launch | Kind::GraphLaunch => Some(Signal::LaunchLatency),
            Kind::Memcpy => Some(Signal::CopyTime),
            _ => None,
        }
    }

    /// Every signal.
    pub const ALL: [Signal; 3] = [
        Signal::LaunchLatency,
        Signal::WaitPerLaunch,
        Signal::CopyTime,
    ];

    /// The name in alerts.
    pub fn as_str(self) -> &'static str {
        match self {
            Signal::LaunchLatency => "launch_latency_p99",
            Signal::WaitPerLaunch => "wait_per_launch",
            Signal::CopyTime => "copy_time_per_mib",
        }
    }

    /// Unit of the signal's values in alerts.
    pub fn unit(self) -> &'static str {
        match self {
            Signal::CopyTime => "seconds_per_mib",
            _ => "seconds",
        }
    }
}

/// One process's calls in the current window.
pub struct Window {
    pub launches: u64,
    /// Launch durations; created on the first launch.
    pub launch_ns: Option<Histogram<u32>>,
    pub wait_ns: u64,
    pub waits: u64,
    pub sync_copy_ns: u64,
    pub sync_copy_bytes: u64,
    pub sync_copies: u64,
    pub copy_bytes: u64,
    pub copies: u64,
    pub gpu_ns: u64,
    /// Threads the kernel launches asked for (grid x block).
    pub threads: u64,
    /// Graph replays (also counted in `launches`).
    pub graph_launches: u64,
    /// Per kernel handle: (launches, threads), at most [`MAX_KERNELS`] handles (the rest under
    /// handle 0).
    pub kernels: HashMap<u64, (u64, u64)>,
    /// Per signal (in [`Signal::ALL`]'s order), when the oldest call of its kind that is stuck
    /// in the driver (in flight for at least a window) entered (CLOCK_MONOTONIC ns).
    pub stuck: [Option<u64>; 3],
    /// Per signal, a value given whole (`backtest` replaying a series) instead of counted.
    pub preset: [Option<f64>; 3],
}

impl Default for Window {
    fn default() -> Self {
        Self::new()
    }
}

impl Window {
    pub fn new() -> Window {
        Window {
            launches: 0,
            launch_ns: None,
            wait_ns: 0,
            waits: 0,
            sync_copy_ns: 0,
            sync_copy_bytes: 0,
            sync_copies: 0,
            copy_bytes: 0,
            copies: 0,
            gpu_ns: 0,
            threads: 0,
            graph_launches: 0,
            kernels: HashMap::new(),
            stuck: [None; 3],
            preset: [None; 3],
        }
    }

    /// A call of `signal`'s kind that entered at `start_ns` is still in the driver.
    pub fn note_stuck(&mut self, signal: Signal, start_ns: u64) {
        let i = Signal::ALL.iter().position(|s| *s == signal).unwrap_or(0);
        self.stuck[i] = Some(self.stuck[i].map_or(start_ns, |t| t.min(start_ns)));
    }

    /// When the oldest stuck call of any kind entered.
    pub fn stuck_since(&self) -> Option<u64> {
        self.stuck.iter().flatten().min().copied()
    }

    pub fn reset(&mut self) {
        let hist = self.launch_ns.take().map(|mut h| {
            h.reset();
            h
        });
        let mut kernels = std::mem::take(&mut self.kernels);
        kernels.clear();
        *self = Window {
            launch_ns: hist,
            kernels,
            ..Window::new()
        };
    }

    /// The signal's value (ns, or ns per MiB) and the calls behind it; `None` with too few calls.
    pub fn value(&self, signal: Signal, min_samples: u64) -> Option<(f64, u64)> {
        let i = Signal::ALL.iter().position(|s| *s == signal).unwrap_or(0);
        if let Some(v) = self.preset[i] {
            return Some((v, min_samples));
        }
        match signal {
            Signal::LaunchLatency => {
                let h = self
                    .launch_ns
                    .as_ref()
                    .filter(|_| self.launches >= min_samples)?;
                Some((LAUNCH.ns(h.value_at_quantile(0.99)) as f64, self.launches))
            }
            Signal::WaitPerLaunch => (self.launches >= min_samples && self.waits > 0)
                .then(|| (self.wait_ns as f64 / self.launches as f64, self.launches)),
            Signal::CopyTime => {
                (self.sync_copies >= min_samples && self.sync_copy_bytes > 0).then(|| {
                    (
                        self.sync_copy_ns as f64 * MIB / self.sync_copy_bytes as f64,
                        self.sync_copies,
                    )
                })
            }
        }
    }

    /// Nanoseconds a rise in `signal` of `delta` means per call, for the `min_increase_us` floor.
    pub fn per_call(&self, signal: Signal, delta: f64) -> f64 {
        match signal {
            // A replayed value has no copies behind it: taken as one MiB's.
            Signal::CopyTime if self.sync_copies == 0 => delta,
            Signal::CopyTime => {
                delta * (self.sync_copy_bytes as f64 / self.sync_copies as f64) / MIB
            }
            _ => delta,
        }
    }
}

impl Window {
    /// Adds `launches` of kernel `function` asking for `threads` in all.
    fn add_kernel(&mut self, function: u64, launches: u64, threads: u64) {
        self.threads = self.threads.wrapping_add(threads);
        let key = if self.kernels.len() < MAX_KERNELS || self.kernels.contains_key(&function) {
            function
        } else {
            0
        };
        let k = self.kernels.entry(key).or_default();
        k.0 += launches;
        k.1 = k.1.wrapping_add(threads);
    }

    /// Counts the kernels of one graph launch of known composition: work submitted, not launches
    /// (a graph's kernels never change the launches `wait_per_launch` divides by).
    pub fn add_graph(&mut self, nodes: &[crate::enrich::graphs::Node]) {
        for n in nodes {
            self.add_kernel(n.function, 1, n.threads);
        }
    }

    /// Counts launches the kernel counted (one cell's gain): the successful ones, at their
    /// bucket's midpoint.
    pub fn add_launches(&mut self, d: &LaunchDelta) {
        let ok = d.count.saturating_sub(d.errors);
        if ok == 0 {
            return;
        }
        self.launches += ok;
        self.add_kernel(d.function, ok, d.threads);
        let (low, high) = bucket_bounds(d.bucket);
        let h = self.launch_ns.get_or_insert_with(|| LAUNCH.sketch());
        let _ = h.record_n(
            LAUNCH.units(low + (high - low).div_ceil(2)),
            u32::try_from(ok).unwrap_or(u32::MAX),
        );
    }

    /// Counts one call; `closed` is what a wait closed (GPU time). Failed calls count only
    /// their closed batches.
    pub fn observe(&mut self, ev: &Event, closed: Option<&BatchEstimate>) {
        if let Some(c) = closed {
            self.gpu_ns = self.gpu_ns.saturating_add(c.span_ns);
            // Asynchronous copies completed by this wait: for the user, synchronous copies.
            if let Some(copies) = c.copies {
                self.sync_copy_ns = self.sync_copy_ns.saturating_add(copies.ns);
                self.sync_copy_bytes = self.sync_copy_bytes.saturating_add(copies.bytes);
                self.sync_copies += copies.copies;
            }
        }
        // A launch the kernel counted arrives through `add_launches`.
        if ev.result != 0 || ev.counted {
            return;
        }
        match ev.api.info().kind {
            Kind::Launch | Kind::GraphLaunch => {
                self.launches += 1;
                match ev.detail {
                    Detail::Launch {
                        function,
                        grid,
                        block,
                        ..
                    } => self.add_kernel(function, 1, crate::event::launch_threads(grid, block)),
                    _ => self.graph_launches += 1,
                }
                let h = self.launch_ns.get_or_insert_with(|| LAUNCH.sketch());
                let _ = h.record(LAUNCH.units(ev.duration_ns));
            }
            Kind::Sync => {
                self.wait_ns = self.wait_ns.saturating_add(ev.duration_ns);
                self.waits += 1;
            }
            // A memset writes device memory like a copy (always queued on a stream).
            Kind::Memcpy | Kind::Memset => {
                if let Detail::Copy { bytes, stream, .. } = ev.detail {
                    self.copy_bytes = self.copy_bytes.saturating_add(bytes);
                    self.copies += 1;
                    if stream.is_none() {
                        self.sync_copy_ns = self.sync_copy_ns.saturating_add(ev.duration_ns);
                        self.sync_copy_bytes = self.sync_copy_bytes.saturating_add(bytes);
                        self.sync_copies += 1;
                    }
                }
            }
            _ => {}
        }
    }
}
