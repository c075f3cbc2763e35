//! Prometheus metrics: a prometheus-client collector that encodes the aggregate at scrape time,
//! served over HTTP (axum on tokio) as OpenMetrics or the Prometheus text format, chosen by the
//! scrape's `Accept` header.
use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
};

use anyhow::{Context as _, Result};
use axum::{
    Router,
    extract::State,
    http::{HeaderMap, StatusCode, header},
    response::IntoResponse,
    routing::get,
};
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, NoLabelSet},
    metrics::MetricType,
    registry::{Registry, Unit},
};
use crate::{
    aggregate::{Aggregator, BUCKETS, ProcessView},
    detect::Detector,
    identity::ProcessRef,
    nvml::{GpuSample, REASONS},
};

/// Everything a scrape reads.
pub struct Exported {
    /// The aggregate of traced calls.
    pub agg: Aggregator,
    /// Contention detection and its alerts.
    pub detector: Detector,
    /// Latest NVML sample.
    pub gpus: Vec<GpuSample>,
    /// Whether NVML is up.
    pub nvml_up: bool,
    /// (symbol, library, attached) for every entry point of every library.
    pub probes: Vec<(&'static str, String, bool)>,
}

/// Shared between the event loop, the NVML sampler and the HTTP server.
pub type Shared = Arc<Mutex<Exported>>;

#[derive(Debug)]
struct CudatraceCollector(SharedDebug);

struct SharedDebug(Shared);
impl std::fmt::Debug for SharedDebug {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Exported")
    }
}

type Labels = Vec<(&'static str, String)>;

fn process_labels(p: ProcessRef<'_>) -> Labels {
    vec![
        ("pid", p.pid.to_string()),
        ("comm", p.comm.to_owned()),
        ("container", p.identity.container_id.clone().unwrap_or_default()),
        ("pod", p.identity.pod_uid.clone().unwrap_or_default()),
    ]
}

fn with(mut labels: Labels, more: &[(&'static str, String)]) -> Labels {
    labels.extend_from_slice(more);
    labels
}

fn gauge(enc: &mut DescriptorEncoder, name: &str, help: &str, unit: Option<Unit>, rows: &[(Labels, f64)]) -> std::fmt::Result {
    if rows.is_empty() {
        return Ok(());
    }
    let mut m = enc.encode_descriptor(name, help, unit.as_ref(), MetricType::Gauge)?;
    for (labels, v) in rows {
        m.encode_family(labels)?.encode_gauge(v)?;
    }
    Ok(())
}

fn counter(enc: &mut DescriptorEncoder, name: &str, help: &str, unit: Option<Unit>, rows: &[(Labels, f64)]) -> std::fmt::Result {
    if rows.is_empty() {
        return Ok(());
    }
    let mut m = enc.encode_descriptor(name, help, unit.as_ref(), MetricType::Counter)?;
    for (labels, v) in rows {
        m.encode_family(labels)?.encode_counter::<NoLabelSet, _, f64>(v, None)?;
    }
    Ok(())
}

impl Collector for CudatraceCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let ex = self.0.0.lock().expect("poisoned");
        let series = ex.agg.series();
        let call_labels = |s: &crate::aggregate::SeriesView| {
            with(
                process_labels(s.process),
                &[("api", s.api.symbol().into()), ("kind", s.api.info().kind.as_str().into()), ("kernel", s.kernel.to_string())],
            )
        };
        let calls: Vec<(Labels, f64)> = series.iter().map(|s| (call_labels(s), s.series.calls as f64)).collect();
        counter(&mut enc, "cudatrace_calls", "Driver calls completed.", None, &calls)?;
        let errors: Vec<(Labels, f64)> = series.iter().map(|s| (call_labels(s), s.series.errors as f64)).collect();
        counter(&mut enc, "cudatrace_call_errors", "Driver calls that returned an error (CUresult != 0).", None, &errors)?;
        if !series.is_empty() {
            let mut m = enc.encode_descriptor(
                "cudatrace_call_duration_seconds",
                "Time from entry to return of driver calls (for launches: CPU-side launch latency).",
                None,
                MetricType::Histogram,
            )?;
            for s in &series {
                // Per-bucket counts: the encoders make them cumulative.
                let buckets: Vec<(f64, u64)> =
                    BUCKETS.iter().chain([f64::INFINITY].iter()).copied().zip(s.series.buckets.iter().copied()).collect();
                let labels = call_labels(s);
                m.encode_family(&labels)?.encode_histogram::<NoLabelSet>(
                    s.series.sum_ns as f64 / 1e9,
                    s.series.calls,
                    &buckets,
                    None,
                )?;
            }
        }
        let quantiles: Vec<(Labels, f64)> = ex
            .agg
            .quantiles()
            .iter()
            .map(|q| {
                let labels = with(
                    process_labels(q.process),
                    &[
                        ("api", q.api.symbol().into()),
                        ("kind", q.api.info().kind.as_str().into()),
                        ("window", q.window.into()),
                        ("q", q.quantile.to_string()),
                    ],
                );
                (labels, q.seconds)
            })
            .collect();
        gauge(
            &mut enc,
            "cudatrace_call_duration_quantile_seconds",
            "Latency quantiles of driver calls per process and api over a sliding window (1m, 5m) or since start (all).",
            None,
            &quantiles,
        )?;
        let bytes: Vec<(Labels, f64)> = series
            .iter()
            .filter(|s| s.api.info().direction.is_some())
            .map(|s| {
                let dir = s.api.info().direction.map(|d| d.as_str()).unwrap_or_default();
                let labels = with(
                    process_labels(s.process),
                    &[("api", s.api.symbol().into()), ("direction", dir.into())],
                );
                (labels, s.series.bytes as f64)
            })
            .collect();
        counter(&mut enc, "cudatrace_memcpy_bytes", "Bytes copied by driver copy calls.", None, &bytes)?;
        let procs: Vec<_> = ex.agg.processes().collect();
        let rows = |f: &dyn Fn(&ProcessView) -> f64| -> Vec<(Labels, f64)> {
            procs.iter().map(|p| (process_labels(p.process), f(p))).collect()
        };
        gauge(&mut enc, "cudatrace_device_memory_bytes", "Device memory a process holds, from traced allocations and frees.", None, &rows(&|p| p.memory_bytes as f64))?;
        gauge(&mut enc, "cudatrace_device_memory_peak_bytes", "Highest device memory a process held while traced.", None, &rows(&|p| p.memory_peak_bytes as f64))?;
        counter(
            &mut enc,
            "cudatrace_gpu_time_estimate_seconds",
            "Estimated device time of a process's completed work (upper bound; see README).",
            None,
            &rows(&|p| p.gpu_ns_estimate as f64 / 1e9),
        )?;
        counter(&mut enc, "cudatrace_events", "Ring-buffer records consumed.", None, &[(vec![], ex.agg.events as f64)])?;
        counter(
            &mut enc,
            "cudatrace_processes_evicted",
            "Processes whose series were dropped to stay within max_processes.",
            None,
            &[(vec![], ex.agg.evicted as f64)],
        )?;
        counter(
            &mut enc,
            "cudatrace_events_dropped",
            "Records lost because the ring buffer was full.",
            None,
            &[(vec![], ex.agg.dropped as f64)],
        )?;
        let probes: Vec<(Labels, f64)> = ex
            .probes
            .iter()
            .map(|(sym, lib, on)| (vec![("symbol", (*sym).to_owned()), ("library", lib.clone())], f64::from(u8::from(*on))))
            .collect();
        gauge(&mut enc, "cudatrace_probe_attached", "1 when the symbol's probes are attached in the library, 0 when it is not exported.", None, &probes)?;
        let alerts: Vec<(Labels, f64)> = ex
            .detector
            .active()
            .map(|r| {
                let aggressors: Vec<String> = r.aggressors.iter().map(|a| format!("{}:{}", a.pid, a.comm)).collect();
                let labels = vec![
                    ("alert", r.alert.to_owned()),
                    ("state", r.state.as_str().to_owned()),
                    ("severity", r.severity.as_str().to_owned()),
                    ("cause", r.cause.as_str().to_owned()),
                    ("signal", r.evidence.signal.to_owned()),
                    ("gpu", r.gpu.clone()),
                    ("pid", r.victim.pid.to_string()),
                    ("comm", r.victim.comm.clone()),
                    ("container", r.victim.container.clone().unwrap_or_default()),
                    ("pod", r.victim.pod.clone().unwrap_or_default()),
                    ("aggressors", aggressors.join(",")),
                ];
                (labels, 1.0)
            })
            .collect();
        let signals: Vec<_> = ex.detector.signals().collect();
        let signal_rows = |f: &dyn Fn(f64, f64) -> f64| -> Vec<(Labels, f64)> {
            signals
                .iter()
                .map(|(process, signal, v, p99)| (with(process_labels(*process), &[("signal", signal.as_str().into())]), f(*v, *p99)))
                .collect()
        };
        gauge(
            &mut enc,
            "cudatrace_signal_value",
            "Last detection window's value of a process's signal: launch_latency_p99 and wait_per_launch in seconds, copy_time_per_mib in seconds per MiB.",
            None,
            &signal_rows(&|v, _| v),
        )?;
        gauge(
            &mut enc,
            "cudatrace_signal_baseline_p99",
            "The signal's baseline p99 (same unit as cudatrace_signal_value); thresholds are fractions over it.",
            None,
            &signal_rows(&|_, p99| p99),
        )?;
        gauge(&mut enc, "cudatrace_alert_active", "1 for each alert cudatrace's detector holds pending or firing (see README).", None, &alerts)?;
        gauge(&mut enc, "cudatrace_nvml_up", "1 when NVML answers, 0 without it.", None, &[(vec![], f64::from(u8::from(ex.nvml_up)))])?;
        encode_gpus(&mut enc, &ex.gpus)
    }
}

fn encode_gpus(enc: &mut DescriptorEncoder, gpus: &[GpuSample]) -> std::fmt::Result {
    let gl = |g: &GpuSample| -> Labels { vec![("gpu", g.index.to_string()), ("uuid", g.uuid.clone())] };
    let per = |f: &dyn Fn(&GpuSample) -> Option<f64>| -> Vec<(Labels, f64)> {
        gpus.iter().filter_map(|g| f(g).map(|v| (gl(g), v))).collect()
    };
    gauge(enc, "cudatrace_gpu_utilization_ratio", "SM utilization over NVML's last sample period.", None, &per(&|g| g.sm_util.map(|v| v as f64 / 100.0)))?;
    gauge(enc, "cudatrace_gpu_memory_utilization_ratio", "Memory-controller utilization.", None, &per(&|g| g.mem_util.map(|v| v as f64 / 100.0)))?;
    gauge(enc, "cudatrace_gpu_memory_used_bytes", "Device memory used.", None, &per(&|g| g.memory_used.map(|v| v as f64)))?;
    gauge(enc, "cudatrace_gpu_memory_total_bytes", "Device memory in all.", None, &per(&|g| g.memory_total.map(|v| v as f64)))?;
    gauge(enc, "cudatrace_gpu_temperature_celsius", "GPU temperature.", None, &per(&|g| g.temperature.map(f64::from)))?;
    gauge(enc, "cudatrace_gpu_power_watts", "Power draw.", None, &per(&|g| g.power_mw.map(|v| v as f64 / 1000.0)))?;
    gauge(enc, "cudatrace_gpu_sm_clock_hertz", "SM clock.", None, &per(&|g| g.sm_clock_mhz.map(|v| v as f64 * 1e6)))?;
    let reasons: Vec<(Labels, f64)> = gpus
        .iter()
        .filter_map(|g| g.reasons.map(|r| (g, r)))
        .flat_map(|(g, r)| REASONS.iter().map(move |(bit, name)| (with(gl(g), &[("reason", (*name).into())]), f64::from(u8::from(r & bit != 0)))))
        .collect();
    gauge(enc, "cudatrace_gpu_clock_event_reason", "1 while the clock-event (throttle) reason holds the clocks down.", None, &reasons)?;
    let pcie: Vec<(Labels, f64)> = gpus
        .iter()
        .filter_map(|g| g.pcie_kbs.map(|k| (g, k)))
        .flat_map(|(g, (tx, rx))| {
            [("tx", tx), ("rx", rx)].map(|(d, v)| (with(gl(g), &[("direction", d.into())]), v as f64 * 1024.0))
        })
        .collect();
    gauge(enc, "cudatrace_gpu_pcie_throughput_bytes_per_second", "PCIe throughput.", None, &pcie)?;
    let procs = |f: &dyn Fn(&crate::nvml::GpuProcess) -> Option<f64>| -> Vec<(Labels, f64)> {
        gpus.iter()
            .flat_map(|g| g.processes.iter().filter_map(move |p| f(p).map(|v| (with(gl(g), &[("pid", p.pid.to_string())]), v))))
            .collect()
    };
    gauge(enc, "cudatrace_gpu_process_memory_bytes", "Device memory of a compute process, per NVML.", None, &procs(&|p| p.memory_bytes.map(|v| v as f64)))?;
    gauge(enc, "cudatrace_gpu_process_sm_utilization_ratio", "SM utilization of a process, per NVML's samples.", None, &procs(&|p| p.sm_util.map(|v| v as f64 / 100.0)))?;
    gauge(enc, "cudatrace_gpu_process_memory_utilization_ratio", "Memory-controller utilization of a process.", None, &procs(&|p| p.mem_util.map(|v| v as f64 / 100.0)))
}

/// A registry holding the cudatrace collector.
pub fn registry(shared: Shared) -> Registry {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(CudatraceCollector(SharedDebug(shared))));
    registry
}

async fn metrics(State(registry): State<Arc<Registry>>, headers: HeaderMap) -> impl IntoResponse {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or("");
    let openmetrics = accept.contains("application/openmetrics-text");
    let mut body = String::new();
    let (result, content_type) = if openmetrics {
        (
            prometheus_client::encoding::text::encode(&mut body, &registry),
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )
    } else {
        (
            prometheus_client::encoding::prometheus_text::encode(&mut body, &registry),
            "text/plain; version=0.0.4; charset=utf-8",
        )
    };
    match result {
        Ok(()) => (StatusCode::OK, [(header::CONTENT_TYPE, content_type)], body),
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, [(header::CONTENT_TYPE, "text/plain")], "encoding failed\n".into()),
    }
}

/// Binds the metrics listener, with a one-line error when the address is taken.
pub async fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await.map_err(|e| match e.kind() {
        std::io::ErrorKind::AddrInUse => {
            anyhow::anyhow!("port in use: {addr} is taken by another program; pass another with --listen ADDR:PORT")
        }
        _ => anyhow::anyhow!("cannot listen on {addr}: {e}"),
    })
}

/// Serves `/metrics` until the task is dropped.
pub async fn serve(listener: tokio::net::TcpListener, registry: Registry) -> Result<()> {
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/", get(|| async { "cudatrace: metrics at /metrics\n" }))
        .with_state(Arc::new(registry));
    axum::serve(listener, app).await.context("metrics server failed")
}
