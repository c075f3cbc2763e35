//! What a scrape sees: owned rows copied from the registry, the aggregate and the detector by the
//! event loop, so that the metrics server encodes them without touching the loop's tables.
use std::sync::{Arc, Mutex};

use foldhash::HashMap;
use tracer_common::Api;

use super::encode::Labels;
use crate::{
    aggregate::Aggregator,
    aggregate::Series,
    alert::AlertChange,
    detect::classify::GpuSet,
    detect::Detector,
    detect::Signal,
    identity::ProcessRef,
    nvml::GpuSample,
    probe::loader::{Drops, ProbeRow, ProcessDrops},
    probe::sites::SiteCounts,
    registry::Registry,
};

/// The process labels of every per-process metric: `pid`, `comm`, `namespace`, `pod`,
/// `container`.
#[derive(Debug)]
pub struct ProcessLabels {
    /// Process id.
    pub pid: u32,
    /// Its name.
    pub comm: String,
    /// Its pod's namespace ("" outside Kubernetes).
    pub namespace: String,
    /// Its pod ("" outside Kubernetes).
    pub pod: String,
    /// Its container ("" when none).
    pub container: String,
    /// Its workload (`identity::workload`).
    pub workload: String,
}

impl ProcessLabels {
    fn of(p: ProcessRef<'_>) -> ProcessLabels {
        let [namespace, pod, container] = p.identity.pod_labels().map(Option::unwrap_or_default);
        ProcessLabels {
            pid: p.pid,
            comm: p.comm.to_owned(),
            namespace,
            pod,
            container,
            workload: p.workload.to_owned(),
        }
    }

    /// The labels, in order.
    pub fn labels(&self) -> Labels {
        vec![
            ("pid", self.pid.to_string()),
            ("comm", self.comm.clone()),
            ("namespace", self.namespace.clone()),
            ("pod", self.pod.clone()),
            ("container", self.container.clone()),
            ("workload", self.workload.clone()),
        ]
    }
}

/// One (process, api, kernel) series.
#[derive(Debug)]
pub struct CallRow {
    /// Whose.
    pub process: Arc<ProcessLabels>,
    /// The api.
    pub api: Api,
    /// The kernel label ("" when not a launch).
    pub kernel: Arc<str>,
    /// Totals.
    pub series: Series,
}

/// Kernel runs of one (process, kernel): direct launches and graph-expanded runs alike.
#[derive(Debug)]
pub struct KernelRunRow {
    /// Whose.
    pub process: Arc<ProcessLabels>,
    /// The kernel label.
    pub kernel: Arc<str>,
    /// Runs.
    pub runs: u64,
}

/// One latency quantile of one (process, api) over one window.
#[derive(Debug)]
pub struct QuantileRow {
    /// Whose.
    pub process: Arc<ProcessLabels>,
    /// The api.
    pub api: Api,
    /// `1m`, `5m` or `all`.
    pub window: &'static str,
    /// The quantile.
    pub quantile: f64,
    /// Seconds.
    pub seconds: f64,
}

/// One process's gauges.
#[derive(Debug)]
pub struct ProcessRow {
    /// Whose.
    pub process: Arc<ProcessLabels>,
    /// Device memory held.
    pub memory_bytes: u64,
    /// Highest device memory held.
    pub memory_peak_bytes: u64,
    /// Device time as `batch_span`, ns (see `enrich::gputime`).
    pub span_ns: u64,
    /// Device time as `host_wait`, ns.
    pub wait_ns: u64,
    /// Graph launches, and of them those of unknown composition.
    pub graph_replays: (u64, u64),
    /// Probed entry points it reaches elsewhere than their probes (`cuGetProcAddress_v2`).
    pub unprobed: Vec<String>,
    /// The GPUs it can use: NVML's, else its `CUDA_VISIBLE_DEVICES`, else every GPU NVML
    /// lists ("all" without NVML).
    pub gpus: Vec<String>,
    /// The work it submitted per device (`enrich::devices`).
    pub devices: Vec<DeviceRow>,
}

/// One process's work on one device.
#[derive(Debug)]
pub struct DeviceRow {
    /// CUDA's ordinal in the process, "unknown" for a context bound before tracing.
    pub cuda_device: String,
    /// NVML's index of the device whose UUID the process read, "" when none matches.
    pub gpu: String,
    /// Successful launches.
    pub launches: u64,
    /// Bytes of successful copies and memsets.
    pub bytes: u64,
    /// Device memory it holds there.
    pub memory_bytes: u64,
}

/// The rows of one process's work per device, NVML's index found by UUID, never by ordinal.
fn device_rows(p: &crate::registry::Process, gpus: &[GpuSample]) -> Vec<DeviceRow> {
    use crate::event::context::nvml_uuid_key;
    p.devices
        .work_with(&p.memory.by_device)
        .into_iter()
        .map(|(ordinal, uuid, w, held)| DeviceRow {
            cuda_device: ordinal.map_or_else(|| "unknown".into(), |o| o.to_string()),
            gpu: uuid
                .and_then(|u| gpus.iter().find(|g| nvml_uuid_key(&g.uuid) == u))
                .map_or_else(String::new, |g| g.index.to_string()),
            launches: w.launches,
            bytes: w.bytes,
            memory_bytes: held,
        })
        .collect()
}

/// One (process, signal) of the detector with a ready baseline.
#[derive(Debug)]
pub struct SignalRow {
    /// Whose.
    pub process: Arc<ProcessLabels>,
    /// Which signal.
    pub signal: Signal,
    /// Last window's value (seconds, or seconds per MiB).
    pub value: f64,
    /// Baseline p99, same unit.
    pub p99: f64,
    /// The baseline's forecast for the last window, same unit.
    pub forecast: f64,
}

/// Everything one scrape encodes.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// Per (process, api, kernel).
    pub calls: Vec<CallRow>,
    /// Per (process, kernel).
    pub kernel_runs: Vec<KernelRunRow>,
    /// Latency quantiles.
    pub quantiles: Vec<QuantileRow>,
    /// Per process.
    pub processes: Vec<ProcessRow>,
    /// Ring-buffer records consumed.
    pub events: u64,
    /// Records the kernel did not write.
    pub dropped: Drops,
    /// Processes dropped to stay within `max_processes`.
    pub evicted: u64,
    /// Libraries refused for `max_libraries`.
    pub libraries_refused: u64,
    /// What discovery did.
    pub discovery: crate::probe::discovery::Counted,
    /// Overflows of each bounded per-process table, by table name.
    pub table_overflows: Vec<(&'static str, u64)>,
    /// Records not written per process, with its comm (empty when unknown).
    pub drops_by_process: Vec<(ProcessDrops, String)>,
    /// Every entry point of every library.
    pub probes: Vec<ProbeRow>,
    /// Their sites by how the kernel runs them.
    pub sites: SiteCounts,
    /// Probe harms by (library, symbol, signal).
    pub harms: Vec<(String, &'static str, &'static str, u64)>,
    /// Suspected probe harms, likewise.
    pub harms_suspected: Vec<(String, &'static str, &'static str, u64)>,
    /// Libraries whose probe-harm breaker is open.
    pub breakers: Vec<String>,
    /// Pending and firing alerts.
    pub alerts: Vec<AlertChange>,
    /// Detector signals with a ready baseline.
    pub signals: Vec<SignalRow>,
    /// Whether NVML answers.
    pub nvml_up: bool,
    /// Latest NVML sample.
    pub gpus: Vec<GpuSample>,
    /// The `[[detect.schedule]]` entry in force (None: `[detect]`'s values).
    pub schedule: Option<String>,
    /// What the OTLP exporter did, when one runs.
    pub otlp: Option<OtlpCounts>,
}

/// What the OTLP exporter did so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OtlpCounts {
    /// Spans the collector took.
    pub sent: u64,
    /// Spans dropped (queue full, or their batch failed every try).
    pub dropped: u64,
    /// Log records the collector took.
    pub logs_sent: u64,
    /// Log records dropped.
    pub logs_dropped: u64,
    /// Export tries that failed.
    pub failed: u64,
}

/// What the event loop builds a snapshot from.
pub struct Sources<'a> {
    /// Every traced process.
    pub registry: &'a Registry,
    /// The aggregation (its clock and limits).
    pub aggregator: &'a Aggregator,
    /// The detector.
    pub detector: &'a Detector,
    /// Ring-buffer records consumed.
    pub events: u64,
    /// Records dropped.
    pub dropped: Drops,
    /// Libraries refused for `max_libraries`.
    pub libraries_refused: u64,
    /// What discovery did.
    pub discovery: crate::probe::discovery::Counted,
    /// Records dropped per process.
    pub drops_by_process: &'a [ProcessDrops],
    /// Probe rows.
    pub probes: &'a [ProbeRow],
    /// Their sites by path.
    pub sites: SiteCounts,
    /// Probe harms by (library, symbol, signal).
    pub harms: Vec<(String, &'static str, &'static str, u64)>,
    /// Suspected probe harms, likewise.
    pub harms_suspected: Vec<(String, &'static str, &'static str, u64)>,
    /// Libraries whose probe-harm breaker is open.
    pub breakers: Vec<String>,
    /// Whether NVML answers.
    pub nvml_up: bool,
    /// Latest NVML sample.
    pub gpus: &'a [GpuSample],
    /// The OTLP exporter's counts, when one runs.
    pub otlp: Option<OtlpCounts>,
}

impl Snapshot {
    /// Copies what the metrics need.
    pub fn build(s: &Sources<'_>) -> Snapshot {
        let mut labels: HashMap<u32, Arc<ProcessLabels>> = HashMap::default();
        let mut of = |p: ProcessRef<'_>| {
            labels
                .entry(p.pid)
                .or_insert_with(|| Arc::new(ProcessLabels::of(p)))
                .clone()
        };
        let calls = s
            .aggregator
            .series(s.registry.series())
            .into_iter()
            .map(|v| CallRow {
                process: of(v.process),
                api: v.api,
                kernel: v.kernel,
                series: v.series,
            })
            .collect();
        let kernel_runs = s
            .aggregator
            .kernel_runs(s.registry.series())
            .into_iter()
            .map(|(process, kernel, runs)| KernelRunRow {
                process: of(process),
                kernel,
                runs,
            })
            .collect();
        let quantiles = s
            .aggregator
            .quantiles(s.registry.series())
            .into_iter()
            .map(|q| QuantileRow {
                process: of(q.process),
                api: q.api,
                window: q.window,
                quantile: q.quantile,
                seconds: q.seconds,
            })
            .collect();
        let processes = s
            .registry
            .iter()
            .map(|p| ProcessRow {
                process: of(p.view()),
                memory_bytes: p.memory.current_bytes,
                memory_peak_bytes: p.memory.peak_bytes,
                span_ns: p.streams.span_ns(),
                wait_ns: p.streams.wait_ns(),
                graph_replays: (p.graphs.replays, p.graphs.unknown_replays),
                unprobed: p.unprobed.clone(),
                gpus: match crate::detect::classify::gpus_of(p.pid, &p.identity, s.gpus) {
                    GpuSet::Only(v) => v,
                    GpuSet::All if s.gpus.is_empty() => vec!["all".into()],
                    GpuSet::All => s.gpus.iter().map(|g| g.index.to_string()).collect(),
                },
                devices: device_rows(p, s.gpus),
            })
            .collect();
        let signals = s
            .detector
            .signals(s.registry)
            .map(|v| SignalRow {
                process: of(v.process),
                signal: v.signal,
                value: v.value,
                p99: v.p99,
                forecast: v.forecast,
            })
            .collect();
        Snapshot {
            calls,
            kernel_runs,
            quantiles,
            processes,
            events: s.events,
            dropped: s.dropped,
            evicted: s.registry.evicted,
            libraries_refused: s.libraries_refused,
            discovery: s.discovery,
            table_overflows: crate::registry::BOUNDED_TABLES
                .into_iter()
                .zip(s.registry.overflows())
                .collect(),
            drops_by_process: s
                .drops_by_process
                .iter()
                .map(|d| {
                    let comm = s
                        .registry
                        .get(d.pid)
                        .map(|p| p.comm.to_string())
                        .unwrap_or_default();
                    (*d, comm)
                })
                .collect(),
            probes: s.probes.to_vec(),
            sites: s.sites,
            harms: s.harms.clone(),
            harms_suspected: s.harms_suspected.clone(),
            breakers: s.breakers.clone(),
            alerts: s.detector.active(s.registry).cloned().collect(),
            signals,
            nvml_up: s.nvml_up,
            gpus: s.gpus.to_vec(),
            schedule: s.detector.schedule_in_force().map(str::to_owned),
            otlp: s.otlp,
        }
    }
}

/// The latest snapshot, shared by the collectors.
#[derive(Clone, Debug, Default)]
pub struct SnapshotCell(Arc<Mutex<Arc<Snapshot>>>);

impl SnapshotCell {
    /// The latest snapshot.
    pub fn load(&self) -> Arc<Snapshot> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Replaces the snapshot.
    pub fn store(&self, snapshot: Arc<Snapshot>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = snapshot;
    }
}
