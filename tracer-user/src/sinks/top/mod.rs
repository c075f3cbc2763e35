//! What `cudatrace top` shows, computed from two snapshots of the daemon's aggregation and
//! detector (the metrics' own snapshot, so `top` and `/metrics` never disagree): a header per GPU
//! from NVML, and a row per process with its rates over the interval between the two.
pub mod columns;
pub mod text;
pub mod tui;

use std::collections::HashMap;

use tracer_common::Kind;

use super::metrics::Snapshot;
use crate::{alert::AlertState, detect::Signal, nvml::REASONS};

/// One GPU's header line.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuLine {
    /// NVML index.
    pub index: u32,
    /// SM utilization, percent.
    pub util: Option<u32>,
    /// Memory used and total, bytes.
    pub memory: (Option<u64>, Option<u64>),
    /// Temperature, °C.
    pub temperature: Option<u32>,
    /// Power, W.
    pub power_w: Option<f64>,
    /// Clock-event (throttle) reasons by name, `gpu_idle` left out.
    pub throttle: Vec<&'static str>,
}

/// One process's row.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// Process id.
    pub pid: u32,
    /// Its name.
    pub comm: String,
    /// `namespace/pod`, else the container id, else empty.
    pub pod: String,
    /// GPUs NVML lists it on (indexes), else empty.
    pub gpus: Vec<u32>,
    /// Launches per second over the interval.
    pub launches_per_s: f64,
    /// Launch latency p50 and p99 over the last minute, seconds (its busiest launch entry point).
    pub launch_p50_p99: Option<(f64, f64)>,
    /// Host wait per launch in the detector's last window, seconds, and its ratio to the
    /// baseline p99.
    pub wait_per_launch: Option<(f64, f64)>,
    /// Copy throughput over the interval, bytes per second.
    pub copy_bytes_per_s: f64,
    /// Device memory its traced allocations hold, bytes.
    pub memory_bytes: u64,
    /// Its share of the device time (batch span) over the interval, 0 to 1.
    pub gpu_share: f64,
    /// Its alert: state, cause and the first aggressor (`comm (pid N)`), when pending or firing.
    pub alert: Option<(AlertState, &'static str, String)>,
}

/// A screen: header lines and rows.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct View {
    /// Per GPU, or none.
    pub gpus: Vec<GpuLine>,
    /// Why there is no GPU line, when NVML is off.
    pub nvml_off: bool,
    /// Records read so far and records the kernel could not write.
    pub events: u64,
    /// Records dropped (ring buffer full, rate limit).
    pub dropped: u64,
    /// One per process, busiest (launches/s) first.
    pub rows: Vec<Row>,
}

/// Totals of one process in one snapshot.
#[derive(Default)]
struct Totals {
    launches: u64,
    copy_bytes: u64,
    gpu_ns: u64,
}

fn totals(s: &Snapshot) -> HashMap<u32, Totals> {
    let mut t: HashMap<u32, Totals> = HashMap::new();
    for c in &s.calls {
        if c.api.info().kind == Kind::Memcpy {
            let e = t.entry(c.process.pid).or_default();
            e.copy_bytes = e.copy_bytes.saturating_add(c.series.bytes);
        }
    }
    // Kernel runs: direct launches and the kernels of graph launches alike.
    for r in &s.kernel_runs {
        t.entry(r.process.pid).or_default().launches += r.runs;
    }
    for p in &s.processes {
        t.entry(p.process.pid).or_default().gpu_ns = p.span_ns;
    }
    t
}

impl View {
    /// The view of `now`, with rates since `before` (`secs` earlier; none: since start).
    pub fn build(before: Option<&Snapshot>, now: &Snapshot, secs: f64) -> View {
        let secs = secs.max(1e-3);
        let (t0, t1) = (before.map(totals).unwrap_or_default(), totals(now));
        let gained = |pid: u32, f: fn(&Totals) -> u64| -> u64 {
            let a = t0.get(&pid).map_or(0, f);
            t1.get(&pid).map_or(0, f).saturating_sub(a)
        };
        let gpu_total: u64 = now
            .processes
            .iter()
            .map(|p| gained(p.process.pid, |t| t.gpu_ns))
            .sum();
        let mut on_gpus: HashMap<u32, Vec<u32>> = HashMap::new();
        for g in &now.gpus {
            for p in &g.processes {
                on_gpus.entry(p.pid).or_default().push(g.index);
            }
        }
        let mut rows: Vec<Row> = now
            .processes
            .iter()
            .map(|p| {
                let l = &p.process;
                let pid = l.pid;
                let pod = match (l.namespace.as_str(), l.pod.as_str(), l.container.as_str()) {
                    ("", "", c) => c.chars().take(12).collect(),
                    (ns, pod, _) => format!("{ns}/{pod}"),
                };
                Row {
                    pid,
                    comm: l.comm.clone(),
                    pod,
                    gpus: on_gpus.remove(&pid).unwrap_or_default(),
                    launches_per_s: gained(pid, |t| t.launches) as f64 / secs,
                    launch_p50_p99: launch_quantiles(now, pid),
                    wait_per_launch: now
                        .signals
                        .iter()
                        .find(|s| s.process.pid == pid && s.signal == Signal::WaitPerLaunch)
                        .map(|s| (s.value, if s.p99 > 0.0 { s.value / s.p99 } else { 0.0 })),
                    copy_bytes_per_s: gained(pid, |t| t.copy_bytes) as f64 / secs,
                    memory_bytes: p.memory_bytes,
                    gpu_share: if gpu_total > 0 {
                        gained(pid, |t| t.gpu_ns) as f64 / gpu_total as f64
                    } else {
                        0.0
                    },
                    alert: now
                        .alerts
                        .iter()
                        .filter(|a| a.victim.pid == pid)
                        .max_by_key(|a| a.state == AlertState::Firing)
                        .map(|a| {
                            // The first aggressor with its change (before → now), or the
                            // victim's own grown work.
                            let who = a
                                .aggressors
                                .first()
                                .map(|g| {
                                    let c = g
                                        .change
                                        .map_or(String::new(), |c| format!(" {}", c.words()));
                                    format!("{} (pid {}){c}", g.comm, g.pid)
                                })
                                .or_else(|| {
                                    let w = a.evidence.victim_work.as_ref()?;
                                    Some(format!(
                                        "its own threads/launch {:.0} → {:.0}",
                                        w.threads_per_launch.0, w.threads_per_launch.1
                                    ))
                                })
                                .unwrap_or_default();
                            (a.state, a.cause.as_str(), who)
                        }),
                }
            })
            .collect();
        rows.sort_by(|a, b| {
            b.launches_per_s
                .total_cmp(&a.launches_per_s)
                .then(a.pid.cmp(&b.pid))
        });
        View {
            gpus: now
                .gpus
                .iter()
                .map(|g| GpuLine {
                    index: g.index,
                    util: g.sm_util,
                    memory: (g.memory_used, g.memory_total),
                    temperature: g.temperature,
                    power_w: g.power_mw.map(|mw| f64::from(mw) / 1000.0),
                    throttle: g
                        .reasons
                        .map(|bits| {
                            REASONS
                                .iter()
                                .filter(|(b, n)| bits & b != 0 && *n != "gpu_idle")
                                .map(|(_, n)| *n)
                                .collect()
                        })
                        .unwrap_or_default(),
                })
                .collect(),
            nvml_off: !now.nvml_up,
            events: now.events,
            dropped: now.dropped.total(),
            rows,
        }
    }
}

/// p50 and p99 over the last minute of the process's busiest launch entry point.
fn launch_quantiles(s: &Snapshot, pid: u32) -> Option<(f64, f64)> {
    let busiest = s
        .calls
        .iter()
        .filter(|c| c.process.pid == pid && c.api.info().kind == Kind::Launch)
        .max_by_key(|c| c.series.calls)?
        .api;
    let q = |quantile: f64| {
        s.quantiles
            .iter()
            .find(|q| {
                q.process.pid == pid
                    && q.api == busiest
                    && q.window == "1m"
                    && q.quantile == quantile
            })
            .map(|q| q.seconds)
    };
    Some((q(0.5)?, q(0.99)?))
}
