//! The HTTP alert sinks: each change is POSTed to a webhook as it is, and Alertmanager (API v2)
//! gets firing and resolved alerts. Each sink is its own task with its own bounded queue,
//! timeouts and retries, so a sink that hangs holds up neither tracing nor the other sink; one
//! that fails is retried with backoff and said once on stderr, and past [`QUEUE`] waiting
//! records the newest are dropped and counted.
use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, SystemTime},
};

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};
use serde_json::Value;
use tokio::sync::mpsc;

use super::alertmanager;
use crate::{
    alert::{AlertChange, AlertState},
    config::AlertConfig,
};

/// Records a sink holds while it is behind; past that the newest are dropped and counted.
pub const QUEUE: usize = 1024;
/// Time one POST may take.
const POST_TIMEOUT: Duration = Duration::from_secs(5);
/// Tries of one POST, the waits between them doubling from 0.5 s.
const TRIES: u32 = 3;

/// One sink's task and the sending end of its queue; dropping the sender ends the task.
struct SinkTask {
    name: &'static str,
    tx: mpsc::Sender<AlertChange>,
    task: tokio::task::JoinHandle<()>,
    dropped: Arc<AtomicU64>,
}

impl SinkTask {
    /// Starts `run` on a new bounded queue.
    fn spawn<F, Fut>(name: &'static str, run: F) -> SinkTask
    where
        F: FnOnce(mpsc::Receiver<AlertChange>) -> Fut,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let (tx, rx) = mpsc::channel(QUEUE);
        SinkTask { name, tx, task: tokio::spawn(run(rx)), dropped: Arc::new(AtomicU64::new(0)) }
    }
}

/// The running sinks.
pub struct Sinks {
    sinks: Vec<SinkTask>,
}

type HttpClient = Client<HttpConnector, Full<Bytes>>;

impl Sinks {
    /// Starts a task per configured sink (none: `None`).
    pub fn start(cfg: &AlertConfig, generator: String) -> Option<Sinks> {
        let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
        let mut sinks = Vec::new();
        if let Some(endpoint) = cfg.webhook_url.as_deref().and_then(|u| Endpoint::new("webhook", u)) {
            let client = client.clone();
            sinks.push(SinkTask::spawn("webhook", |rx| webhook(client, endpoint, rx)));
        }
        let manager = cfg.alertmanager_url.as_deref().and_then(|u| {
            let base = u.trim_end_matches('/');
            let url = if base.ends_with("/api/v2/alerts") { base.to_owned() } else { format!("{base}/api/v2/alerts") };
            Endpoint::new("alertmanager", &url)
        });
        if let Some(endpoint) = manager {
            let resend = Duration::from_secs(if cfg.resend_s == 0 { 60 } else { cfg.resend_s });
            sinks.push(SinkTask::spawn("alertmanager", |rx| alertmanager_sink(client, endpoint, rx, generator, resend)));
        }
        (!sinks.is_empty()).then_some(Sinks { sinks })
    }

    /// Queues a record for every sink; a sink whose queue is full drops it (said on stderr
    /// once per 1,000 dropped).
    pub fn send(&self, record: &AlertChange) {
        for sink in &self.sinks {
            if sink.tx.try_send(record.clone()).is_err() {
                let dropped = sink.dropped.fetch_add(1, Ordering::Relaxed) + 1;
                if dropped % 1000 == 1 {
                    eprintln!("cudatrace: {} is {QUEUE} alert records behind: {dropped} dropped so far", sink.name);
                }
            }
        }
    }

    /// Sends what is queued (for at most `limit` in all), then stops.
    pub async fn finish(self, limit: Duration) {
        let deadline = tokio::time::Instant::now() + limit;
        for sink in self.sinks {
            drop(sink.tx);
            let _ = tokio::time::timeout_at(deadline, sink.task).await;
        }
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

    /// POSTs JSON, up to [`TRIES`] times with backoff; says on stderr when it starts and stops
    /// failing.
    async fn post(&mut self, client: &HttpClient, body: &Value) -> bool {
        let bytes = Bytes::from(body.to_string());
        let mut last = String::new();
        for attempt in 0..TRIES {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(500) * 2u32.pow(attempt - 1)).await;
            }
            let req = http::Request::post(self.uri.clone())
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(Full::new(bytes.clone()))
                .expect("valid request");
            match tokio::time::timeout(POST_TIMEOUT, client.request(req)).await {
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

/// The webhook's task: every record, as it is.
async fn webhook(client: HttpClient, mut endpoint: Endpoint, mut rx: mpsc::Receiver<AlertChange>) {
    while let Some(record) = rx.recv().await {
        endpoint.post(&client, &serde_json::to_value(&record).unwrap_or_default()).await;
    }
}

/// Alertmanager's task: firing alerts (told again every `resend`) and resolved ones.
async fn alertmanager_sink(
    client: HttpClient,
    mut endpoint: Endpoint,
    mut rx: mpsc::Receiver<AlertChange>,
    generator: String,
    resend: Duration,
) {
    let instance = alertmanager::instance();
    let mut tick = tokio::time::interval(resend);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Firing alerts, by identity: what Alertmanager is told again on each tick.
    let mut firing: HashMap<(u32, &'static str, &'static str), AlertChange> = HashMap::new();
    loop {
        tokio::select! {
            record = rx.recv() => {
                let Some(record) = record else { break };
                let now = SystemTime::now();
                let body = match record.state {
                    AlertState::Pending => continue,
                    AlertState::Firing => {
                        let body = alertmanager::form(&record, &instance, &generator, now + 4 * resend);
                        firing.insert(record.key(), record);
                        body
                    }
                    AlertState::Resolved => match firing.remove(&record.key()) {
                        Some(_) => alertmanager::form(&record, &instance, &generator, now),
                        None => continue,
                    },
                };
                endpoint.post(&client, &Value::Array(vec![body])).await;
            }
            _ = tick.tick(), if !firing.is_empty() => {
                let ends = SystemTime::now() + 4 * resend;
                let all: Vec<Value> = firing.values().map(|r| alertmanager::form(r, &instance, &generator, ends)).collect();
                endpoint.post(&client, &Value::Array(all)).await;
            }
        }
    }
}
