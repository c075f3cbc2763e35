//! Alert records and where they go. `cudatrace run` writes each state change as one JSON line on
//! stdout; the same record is POSTed to a webhook; Alertmanager (API v2) gets firing alerts,
//! sent again every `resend_s` with an end time four periods ahead (as Prometheus does, so that
//! Alertmanager keeps them while cudatrace runs and lets them expire when it does not), and
//! resolved ones with the end time now. A sink that fails is retried, said once on stderr, and
//! never holds up tracing.
use std::{
    collections::HashMap,
    time::{Duration, SystemTime},
};

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};
use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::config::AlertConfig;

/// Where an alert is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Breaching for `pending_windows` windows.
    Pending,
    /// Breaching for `firing_after_s`.
    Firing,
    /// Back to normal (or the victim exited).
    Resolved,
}

impl State {
    /// The JSON name.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Pending => "pending",
            State::Firing => "firing",
            State::Resolved => "resolved",
        }
    }
}

/// How far over its baseline p99 the victim's signal is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// Over `warning` (default +10%).
    Warning,
    /// Over `critical` (default +30%).
    Critical,
    /// Over `page` (default +50%).
    Page,
}

impl Severity {
    /// The JSON name.
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Warning => "warning",
            Severity::Critical => "critical",
            Severity::Page => "page",
        }
    }
}

/// Through which resource the victim is slowed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    /// Another process keeps the same GPU's compute busy.
    ComputeContention,
    /// Another process copies over the same GPU's copy engines / PCIe link.
    CopyContention,
    /// The GPU's memory is nearly full.
    MemoryPressure,
    /// The GPU's clocks are held down (thermal or power).
    Throttling,
    /// Launches got slower while the GPU is idle: the host CPU or the driver.
    CpuOrDriverContention,
    /// None of the above is seen.
    Unexplained,
}

impl Cause {
    /// The alert name for this cause.
    pub fn alert_name(self) -> &'static str {
        match self {
            Cause::ComputeContention => "CudatraceComputeContention",
            Cause::CopyContention => "CudatraceCopyContention",
            Cause::MemoryPressure => "CudatraceGpuMemoryPressure",
            Cause::Throttling => "CudatraceGpuThrottled",
            Cause::CpuOrDriverContention => "CudatraceLaunchLatencyHigh",
            Cause::Unexplained => "CudatraceSlowdown",
        }
    }

    /// The JSON name.
    pub fn as_str(self) -> &'static str {
        match self {
            Cause::ComputeContention => "compute_contention",
            Cause::CopyContention => "copy_contention",
            Cause::MemoryPressure => "memory_pressure",
            Cause::Throttling => "throttling",
            Cause::CpuOrDriverContention => "cpu_or_driver_contention",
            Cause::Unexplained => "unexplained",
        }
    }
}

/// A process named in an alert.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Party {
    /// Process id.
    pub pid: u32,
    /// Its comm.
    pub comm: String,
    /// Container id, when in one.
    pub container: Option<String>,
    /// Kubernetes pod UID, when in one.
    pub pod: Option<String>,
    /// For an aggressor: its share of what the aggressors did to the contended resource in the
    /// window (GPU time, else launches; bytes copied; device memory).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub share: Option<f64>,
}

/// Why the alert holds: the victim's signal now against its baseline, and what NVML said.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Evidence {
    /// `launch_latency_p99`, `wait_per_launch` or `copy_time_per_mib`.
    pub signal: &'static str,
    /// Unit of the three values below.
    pub unit: &'static str,
    /// The baseline's forecast for the window.
    pub baseline: f64,
    /// The baseline p99 the thresholds are over.
    pub baseline_p99: f64,
    /// The latest breaching window's value.
    pub now: f64,
    /// `now / baseline_p99`.
    pub ratio: f64,
    /// Window length, seconds.
    pub window_s: u64,
    /// Calls behind `now` (launches, or synchronous copies).
    pub samples: u64,
    /// NVML: device memory used over total on the victim's GPU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_memory_used_ratio: Option<f64>,
    /// NVML: SM utilization of the victim's GPU, 0 to 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_utilization: Option<f64>,
    /// NVML: clock-event reasons holding the clocks down.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub clock_event_reasons: Vec<&'static str>,
}

/// One alert state change: the JSON line on stdout and the webhook's body.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Record {
    /// Alert name, from the cause.
    pub alert: &'static str,
    /// The new state.
    pub state: State,
    /// Severity tier.
    pub severity: Severity,
    /// The cause.
    pub cause: Cause,
    /// The GPU the victim and aggressors share (index or UUID; `all` when no process restricts
    /// its devices and NVML is absent).
    pub gpu: String,
    /// The process slowed.
    pub victim: Party,
    /// The processes slowing it, biggest share first.
    pub aggressors: Vec<Party>,
    /// Baseline against now.
    pub evidence: Evidence,
    /// When the breach began (RFC 3339).
    pub started_at: String,
    /// When this state change happened (RFC 3339).
    pub at: String,
    /// Why a resolved alert ended: `back_to_baseline` or `victim_exited`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<&'static str>,
}

/// RFC 3339 with seconds, UTC.
pub fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

impl Record {
    /// Identity of the alert across its state changes.
    fn key(&self) -> (u32, &'static str, &'static str) {
        (self.victim.pid, self.evidence.signal, self.alert)
    }

    /// One line for Alertmanager's `summary` annotation.
    pub fn summary(&self) -> String {
        let who = |p: &Party| format!("{} (pid {})", p.comm, p.pid);
        let by = if self.aggressors.is_empty() {
            String::new()
        } else {
            let list: Vec<String> = self
                .aggressors
                .iter()
                .map(|a| format!("{} {:.0}%", who(a), a.share.unwrap_or(0.0) * 100.0))
                .collect();
            format!(" by {}", list.join(", "))
        };
        format!(
            "{} slowed{by} on GPU {}: {} {:.3e} {} vs baseline p99 {:.3e} ({}, {:.1}x)",
            who(&self.victim),
            self.gpu,
            self.evidence.signal,
            self.evidence.now,
            self.evidence.unit,
            self.evidence.baseline_p99,
            self.cause.as_str(),
            self.evidence.ratio
        )
    }

    /// The Alertmanager API v2 form, ending at `ends`.
    fn alertmanager(&self, instance: &str, generator: &str, ends: SystemTime) -> Value {
        let opt = |o: &Option<String>| o.clone().unwrap_or_default();
        let aggressors: Vec<String> = self.aggressors.iter().map(|a| format!("{}:{}", a.pid, a.comm)).collect();
        json!({
            "labels": {
                "alertname": self.alert,
                "severity": self.severity.as_str(),
                "cause": self.cause.as_str(),
                "signal": self.evidence.signal,
                "gpu": self.gpu,
                "pid": self.victim.pid.to_string(),
                "comm": self.victim.comm,
                "container": opt(&self.victim.container),
                "pod": opt(&self.victim.pod),
                "instance": instance,
            },
            "annotations": {
                "summary": self.summary(),
                "aggressors": aggressors.join(","),
                "record": serde_json::to_string(self).unwrap_or_default(),
            },
            "startsAt": self.started_at,
            "endsAt": rfc3339(ends),
            "generatorURL": generator,
        })
    }
}

/// The sending end of the sink task; dropping it ends the task.
pub struct Sinks {
    tx: mpsc::UnboundedSender<Record>,
    task: tokio::task::JoinHandle<()>,
}

impl Sinks {
    /// Starts the sink task when a webhook or Alertmanager is configured.
    pub fn start(cfg: &AlertConfig, generator: String) -> Option<Sinks> {
        if cfg.alertmanager_url.is_none() && cfg.webhook_url.is_none() {
            return None;
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(run(cfg.clone(), generator, rx));
        Some(Sinks { tx, task })
    }

    /// Queues a record for the sinks.
    pub fn send(&self, record: &Record) {
        let _ = self.tx.send(record.clone());
    }

    /// Sends what is queued (for at most `limit`), then stops.
    pub async fn finish(self, limit: Duration) {
        drop(self.tx);
        let _ = tokio::time::timeout(limit, self.task).await;
    }
}

/// One HTTP endpoint, with its last error said once.
struct Endpoint {
    name: &'static str,
    uri: http::Uri,
    failing: Option<String>,
}

impl Endpoint {
    fn new(name: &'static str, url: &str) -> Option<Endpoint> {
        url.parse().ok().map(|uri| Endpoint { name, uri, failing: None })
    }

    /// POSTs JSON, up to three tries; says on stderr when it starts and stops failing.
    async fn post(&mut self, client: &Client<HttpConnector, Full<Bytes>>, body: &Value) -> bool {
        let bytes = Bytes::from(body.to_string());
        let mut last = String::new();
        for attempt in 0..3 {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            let req = http::Request::post(self.uri.clone())
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(Full::new(bytes.clone()))
                .expect("valid request");
            match tokio::time::timeout(Duration::from_secs(5), client.request(req)).await {
                Ok(Ok(resp)) if resp.status().is_success() => {
                    if self.failing.take().is_some() {
                        eprintln!("cudatrace: {} {} accepts alerts again", self.name, self.uri);
                    }
                    return true;
                }
                Ok(Ok(resp)) => last = format!("answered {}", resp.status()),
                Ok(Err(e)) => last = format!("{e}"),
                Err(_) => last = "no answer within 5 s".into(),
            }
        }
        if self.failing.as_deref() != Some(&last) {
            eprintln!(
                "cudatrace: {} {}: {last}; alerts still go to stdout and the metrics, and are sent again",
                self.name, self.uri
            );
            self.failing = Some(last);
        }
        false
    }
}

/// The `instance` label: `NODE_NAME` when set (a DaemonSet passes the node's name through the
/// downward API; the pod's hostname would name the pod), else the hostname.
fn instance() -> String {
    match std::env::var("NODE_NAME") {
        Ok(node) if !node.is_empty() => node,
        _ => std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_owned()).unwrap_or_default(),
    }
}

async fn run(cfg: AlertConfig, generator: String, mut rx: mpsc::UnboundedReceiver<Record>) {
    let client: Client<HttpConnector, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let mut webhook = cfg.webhook_url.as_deref().and_then(|u| Endpoint::new("webhook", u));
    let mut manager = cfg.alertmanager_url.as_deref().and_then(|u| {
        let base = u.trim_end_matches('/');
        let url = if base.ends_with("/api/v2/alerts") { base.to_owned() } else { format!("{base}/api/v2/alerts") };
        Endpoint::new("alertmanager", &url)
    });
    let instance = instance();
    let resend = Duration::from_secs(if cfg.resend_s == 0 { 60 } else { cfg.resend_s });
    let mut tick = tokio::time::interval(resend);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Firing alerts, by identity: what Alertmanager is told again on each tick.
    let mut firing: HashMap<(u32, &'static str, &'static str), Record> = HashMap::new();
    loop {
        tokio::select! {
            record = rx.recv() => {
                let Some(record) = record else { break };
                if let Some(w) = webhook.as_mut() {
                    w.post(&client, &serde_json::to_value(&record).unwrap_or_default()).await;
                }
                let Some(m) = manager.as_mut() else { continue };
                let now = SystemTime::now();
                let body = match record.state {
                    State::Pending => continue,
                    State::Firing => {
                        let body = record.alertmanager(&instance, &generator, now + 4 * resend);
                        firing.insert(record.key(), record);
                        body
                    }
                    State::Resolved => match firing.remove(&record.key()) {
                        Some(_) => record.alertmanager(&instance, &generator, now),
                        None => continue,
                    },
                };
                m.post(&client, &Value::Array(vec![body])).await;
            }
            _ = tick.tick(), if manager.is_some() && !firing.is_empty() => {
                let ends = SystemTime::now() + 4 * resend;
                let all: Vec<Value> = firing.values().map(|r| r.alertmanager(&instance, &generator, ends)).collect();
                manager.as_mut().expect("checked").post(&client, &Value::Array(all)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn record(state: State) -> Record {
        let party = |pid, comm: &str, share| Party { pid, comm: comm.into(), container: None, pod: None, share };
        Record {
            alert: Cause::ComputeContention.alert_name(),
            state,
            severity: Severity::Page,
            cause: Cause::ComputeContention,
            gpu: "0".into(),
            victim: party(10, "server", None),
            aggressors: vec![party(20, "trainer", Some(0.9))],
            evidence: Evidence {
                signal: "wait_per_launch",
                unit: "seconds",
                baseline: 0.001,
                baseline_p99: 0.0011,
                now: 0.004,
                ratio: 0.004 / 0.0011,
                window_s: 5,
                samples: 4000,
                gpu_memory_used_ratio: None,
                gpu_utilization: None,
                clock_event_reasons: vec![],
            },
            started_at: rfc3339(SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)),
            at: rfc3339(SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_030)),
            reason: None,
        }
    }

    #[test]
    fn json_line_has_the_documented_fields() {
        let v = serde_json::to_value(record(State::Firing)).unwrap();
        assert_eq!(v["alert"], "CudatraceComputeContention");
        assert_eq!((v["state"].as_str(), v["severity"].as_str(), v["cause"].as_str()), (Some("firing"), Some("page"), Some("compute_contention")));
        assert_eq!(v["victim"], json!({"pid": 10, "comm": "server", "container": null, "pod": null}));
        assert_eq!(v["aggressors"], json!([{"pid": 20, "comm": "trainer", "container": null, "pod": null, "share": 0.9}]));
        assert_eq!(v["started_at"], "2027-01-15T08:00:00Z");
        assert!(v.get("reason").is_none());
        assert!(v["evidence"].get("clock_event_reasons").is_none());
    }

    #[test]
    fn alertmanager_form() {
        let r = record(State::Firing);
        let ends = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_240);
        let v = r.alertmanager("node-1", "http://127.0.0.1:9464/metrics", ends);
        assert_eq!(v["labels"]["alertname"], "CudatraceComputeContention");
        assert_eq!((v["labels"]["pid"].as_str(), v["labels"]["instance"].as_str()), (Some("10"), Some("node-1")));
        assert_eq!(v["annotations"]["aggressors"], "20:trainer");
        assert_eq!((v["startsAt"].as_str(), v["endsAt"].as_str()), (Some("2027-01-15T08:00:00Z"), Some("2027-01-15T08:04:00Z")));
        assert_eq!(
            r.summary(),
            "server (pid 10) slowed by trainer (pid 20) 90% on GPU 0: wait_per_launch 4.000e-3 seconds vs baseline p99 1.100e-3 (compute_contention, 3.6x)"
        );
    }
}
