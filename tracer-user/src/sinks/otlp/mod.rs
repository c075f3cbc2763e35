//! OTLP export (`[otlp]`): slow and failed driver calls as spans ([`span`]), alert changes as
//! log records and incidents as spans ([`incidents`]), sent in batches by a thread of their own
//! over http/protobuf or gRPC ([`transport`]). The event loop only
//! builds a span and offers it to a bounded queue (`max_queue`): when the collector is down or
//! slow, what does not fit is dropped and counted (`cudatrace_otlp_dropped_total`), a batch
//! that fails is retried with backoff and then dropped and counted, and tracing never waits.
use std::{
    collections::BTreeMap,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use anyhow::Result;
use opentelemetry_proto::tonic::{
    collector::{logs::v1::ExportLogsServiceRequest, trace::v1::ExportTraceServiceRequest},
    common::v1::{InstrumentationScope, KeyValue},
    logs::v1::{LogRecord, ResourceLogs, ScopeLogs},
    resource::v1::Resource,
    trace::v1::{ResourceSpans, ScopeSpans, Span},
};
use tokio::sync::mpsc;

use crate::{alert::AlertChange, config::otlp::Otlp, event::Event, identity::Identity};

pub mod incidents;
pub mod span;
pub mod transport;

/// Spans sent in one export at most.
pub const BATCH: usize = 512;
/// How long the first span of a batch waits for others.
const LINGER: Duration = Duration::from_millis(500);
/// Tries of one export; the waits between them double from 0.5 s.
const TRIES: u32 = 3;

/// What the exporter did, for the metrics.
#[derive(Debug, Default)]
pub struct Stats {
    /// Spans the collector accepted.
    pub sent: AtomicU64,
    /// Spans dropped: the queue full, or their batch failed every try.
    pub dropped: AtomicU64,
    /// Log records the collector accepted.
    pub logs_sent: AtomicU64,
    /// Log records dropped.
    pub logs_dropped: AtomicU64,
    /// Exports that failed (each try).
    pub failed: AtomicU64,
}

/// What is queued: a span or a log record, with the workload whose resource it goes under.
enum Item {
    Span(Arc<str>, Span),
    Log(Arc<str>, LogRecord),
}

/// The running exporter: the queue's sending end, the settings the spans are built by.
pub struct Exporter {
    tx: mpsc::Sender<Item>,
    /// Says when the export thread has sent what it held and ended.
    done: std::sync::mpsc::Receiver<()>,
    stats: Arc<Stats>,
    min_ns: u64,
    host: String,
    ids: span::Ids,
    incidents: incidents::Incidents,
}

/// The node's name: `NODE_NAME` (the chart sets it), else the kernel's host name.
pub fn host_name() -> String {
    std::env::var("NODE_NAME")
        .ok()
        .filter(|n| !n.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
        })
        .unwrap_or_default()
}

/// CLOCK_REALTIME minus CLOCK_MONOTONIC, ns: what turns a record's time into Unix time.
fn wall_offset_ns() -> i128 {
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128);
    wall - i128::from(crate::event::monotonic_ns())
}

impl Exporter {
    /// Starts the export task; an error when the CA file cannot be used.
    pub fn start(cfg: &Otlp) -> Result<Exporter> {
        let sender = transport::Sender::new(cfg)?;
        let (tx, rx) = mpsc::channel(cfg.max_queue);
        let stats = Arc::new(Stats::default());
        let resource = Resources {
            service_name: cfg.service_name.clone(),
            extra: cfg.resource.clone(),
            host: host_name(),
        };
        // Encoding and sending run on a thread of their own, never on the event loop's.
        let (done_tx, done) = std::sync::mpsc::channel();
        let counts = stats.clone();
        std::thread::Builder::new()
            .name("otlp".into())
            .spawn(move || {
                if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    rt.block_on(run(rx, sender, resource, counts));
                }
                let _ = done_tx.send(());
            })?;
        Ok(Exporter {
            tx,
            done,
            stats,
            min_ns: cfg.min_duration_us.saturating_mul(1000),
            host: host_name(),
            ids: span::Ids::new(),
            incidents: incidents::Incidents::default(),
        })
    }

    /// What it did so far.
    pub fn stats(&self) -> &Arc<Stats> {
        &self.stats
    }

    /// Offers call `ev` of a process (`identity`, `workload`; `kernel` its launch's kernel,
    /// `gpu` the GPU NVML lists it on):
    /// a span when it was slow or failed, dropped and counted when the queue is full.
    pub fn call(
        &mut self,
        ev: &Event,
        (identity, workload): (&Identity, &Arc<str>),
        kernel: Option<&str>,
        gpu: impl FnOnce() -> Option<(u32, String)>,
    ) {
        // A launch written at its entry outside a window of the pair has no duration to show.
        if (ev.duration_ns < self.min_ns && ev.result == 0) || ev.untimed {
            return;
        }
        let mut span = span::of_call(
            ev,
            (identity, &self.host),
            kernel,
            wall_offset_ns(),
            &mut self.ids,
        );
        if let Some((index, uuid)) = gpu() {
            span.attributes
                .push(span::int("gpu.index", i64::from(index)));
            span.attributes.push(span::attr("gpu.uuid", uuid));
        }
        self.offer(Item::Span(workload.clone(), span));
    }

    /// Queues `item`, or drops and counts it when the queue is full.
    fn offer(&self, item: Item) {
        let log = matches!(item, Item::Log(..));
        if self.tx.try_send(item).is_err() {
            let n = if log {
                &self.stats.logs_dropped
            } else {
                &self.stats.dropped
            };
            n.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Alert changes: a log record each, and the span of each incident they end.
    pub fn alerts(&mut self, changes: &[AlertChange]) {
        if changes.is_empty() {
            return;
        }
        let now = (wall_offset_ns() + i128::from(crate::event::monotonic_ns())).max(0) as u64;
        let cudatrace: Arc<str> = Arc::from("cudatrace");
        for c in changes {
            let (log, spans) = self.incidents.change(c, now, &mut self.ids);
            let workload: Arc<str> = c
                .victim
                .workload
                .as_deref()
                .map_or(cudatrace.clone(), Arc::from);
            self.offer(Item::Log(workload, log));
            for s in spans {
                self.offer(Item::Span(cudatrace.clone(), s));
            }
        }
    }

    /// Stops taking spans and gives the export thread up to `wait` to send what it holds.
    pub async fn finish(self, wait: Duration) {
        drop(self.tx);
        let done = self.done;
        let _ = tokio::task::spawn_blocking(move || done.recv_timeout(wait)).await;
    }
}

/// What every resource carries.
struct Resources {
    service_name: Option<String>,
    extra: Vec<(String, String)>,
    host: String,
}

impl Resources {
    /// A resource for `workload`.
    fn resource(&self, workload: &str) -> Resource {
        let mut attributes: Vec<KeyValue> = vec![
            span::attr(
                "service.name",
                self.service_name
                    .clone()
                    .unwrap_or_else(|| workload.to_owned()),
            ),
            span::attr("cudatrace.workload", workload.to_owned()),
            span::attr("host.name", self.host.clone()),
        ];
        attributes.extend(self.extra.iter().map(|(k, v)| span::attr(k, v.clone())));
        Resource {
            attributes,
            ..Resource::default()
        }
    }

    /// The requests for `items`: a resource per workload, spans and logs apart.
    fn requests(
        &self,
        items: Vec<Item>,
    ) -> (
        Option<ExportTraceServiceRequest>,
        Option<ExportLogsServiceRequest>,
    ) {
        let scope = || InstrumentationScope {
            name: "cudatrace".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            ..InstrumentationScope::default()
        };
        let mut spans: BTreeMap<Arc<str>, Vec<Span>> = BTreeMap::new();
        let mut logs: BTreeMap<Arc<str>, Vec<LogRecord>> = BTreeMap::new();
        for i in items {
            match i {
                Item::Span(w, s) => spans.entry(w).or_default().push(s),
                Item::Log(w, l) => logs.entry(w).or_default().push(l),
            }
        }
        let traces = (!spans.is_empty()).then(|| ExportTraceServiceRequest {
            resource_spans: spans
                .into_iter()
                .map(|(w, spans)| ResourceSpans {
                    resource: Some(self.resource(&w)),
                    scope_spans: vec![ScopeSpans {
                        scope: Some(scope()),
                        spans,
                        ..ScopeSpans::default()
                    }],
                    ..ResourceSpans::default()
                })
                .collect(),
        });
        let logs = (!logs.is_empty()).then(|| ExportLogsServiceRequest {
            resource_logs: logs
                .into_iter()
                .map(|(w, log_records)| ResourceLogs {
                    resource: Some(self.resource(&w)),
                    scope_logs: vec![ScopeLogs {
                        scope: Some(scope()),
                        log_records,
                        ..ScopeLogs::default()
                    }],
                    ..ResourceLogs::default()
                })
                .collect(),
        });
        (traces, logs)
    }
}

/// The export task: batches of up to [`BATCH`] spans, each sent with retries.
async fn run(
    mut rx: mpsc::Receiver<Item>,
    sender: transport::Sender,
    resources: Resources,
    stats: Arc<Stats>,
) {
    let mut failing = false;
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        let linger = tokio::time::sleep(LINGER);
        tokio::pin!(linger);
        while batch.len() < BATCH {
            tokio::select! {
                next = rx.recv() => match next {
                    Some(i) => batch.push(i),
                    None => break,
                },
                () = &mut linger => break,
            }
        }
        let spans = batch.iter().filter(|i| matches!(i, Item::Span(..))).count() as u64;
        let logs = batch.len() as u64 - spans;
        let (traces, log_req) = resources.requests(batch);
        let sends = [
            (
                traces.map(|t| (transport::Kind::Traces, prost::Message::encode_to_vec(&t))),
                spans,
                &stats.sent,
                &stats.dropped,
            ),
            (
                log_req.map(|l| (transport::Kind::Logs, prost::Message::encode_to_vec(&l))),
                logs,
                &stats.logs_sent,
                &stats.logs_dropped,
            ),
        ];
        for (body, n, sent_count, dropped_count) in sends {
            let Some((kind, body)) = body else { continue };
            let mut wait = Duration::from_millis(500);
            let mut sent = false;
            for attempt in 1..=TRIES {
                match sender.export(kind, &body).await {
                    Ok(()) => {
                        sent = true;
                        break;
                    }
                    Err(e) => {
                        stats.failed.fetch_add(1, Ordering::Relaxed);
                        if !failing {
                            failing = true;
                            log::warn!(
                                target: "cudatrace::otlp",
                                "otlp: export to {} failed ({e:#}); retrying, and dropping (counted in cudatrace_otlp_dropped_total) what does not fit",
                                sender.url(kind)
                            );
                        }
                        if attempt < TRIES {
                            tokio::time::sleep(wait).await;
                            wait *= 2;
                        }
                    }
                }
            }
            if sent {
                sent_count.fetch_add(n, Ordering::Relaxed);
                if std::mem::take(&mut failing) {
                    log::info!(target: "cudatrace::otlp", "otlp: exports to {} work again", sender.url(kind));
                }
            } else {
                dropped_count.fetch_add(n, Ordering::Relaxed);
            }
        }
    }
}
