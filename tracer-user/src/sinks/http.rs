//! The HTTP alert sinks: each change is POSTed to a webhook as it is (or grouped by incident,
//! `sinks::group`), and Alertmanager (API v2)
//! gets firing and resolved alerts. Each sink is its own task with its own bounded queue,
//! timeouts and retries, so a sink that hangs holds up neither tracing nor the other sink; one
//! that fails is retried with backoff and said once on stderr, and past [`QUEUE`] waiting
//! records the newest are dropped and counted. Sinks speak http or https (rustls; the public
//! roots plus `alerts.ca_file`), with basic or bearer auth read from files at each POST.
//! Quiet changes (`[[alerts.quiet]]`) are not sent; the resolution of an alert that was sent
//! before its quiet period began still is.
use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, SystemTime},
};

use anyhow::Result;
use bytes::Bytes;
use http_body_util::Full;
use serde_json::Value;
use tokio::sync::mpsc;

use super::alertmanager;
use crate::{alert::AlertChange, alert::AlertState, config::AlertConfig, config::SinkAuth};

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
        SinkTask {
            name,
            tx,
            task: tokio::spawn(run(rx)),
            dropped: Arc::new(AtomicU64::new(0)),
        }
    }
}

/// The running sinks.
pub struct Sinks {
    sinks: Vec<SinkTask>,
    /// Alerts whose pending or firing change was sent and whose resolution was not yet.
    sent: std::sync::Mutex<std::collections::HashSet<(u32, &'static str, &'static str)>>,
}

use super::client::HttpClient;

/// The alert sinks' client (HTTP/1.1).
fn client(ca_file: Option<&std::path::Path>) -> Result<HttpClient> {
    super::client::client(ca_file, "alerts.ca_file", false)
}

impl Sinks {
    /// Starts a task per configured sink (none: `None`); an error when `ca_file` is unusable.
    /// `ledger`: `[mitigate]`'s actions, each firing alert's `mitigation` annotation.
    pub fn start(
        cfg: &AlertConfig,
        generator: String,
        ledger: Option<std::sync::Arc<super::mitigate::ledger::Ledger>>,
    ) -> Result<Option<Sinks>> {
        if cfg.webhook_url.is_none() && cfg.alertmanager_url.is_none() {
            return Ok(None);
        }
        let client = client(cfg.ca_file.as_deref())?;
        let mut sinks = Vec::new();
        if let Some(endpoint) = cfg
            .webhook_url
            .as_deref()
            .and_then(|u| Endpoint::new("webhook", u, &cfg.webhook_auth))
        {
            let client = client.clone();
            let group = Duration::from_secs(cfg.webhook_group_s);
            sinks.push(SinkTask::spawn("webhook", move |rx| {
                webhook(client, endpoint, rx, group)
            }));
        }
        let manager = cfg.alertmanager_url.as_deref().and_then(|u| {
            let base = u.trim_end_matches('/');
            let url = if base.ends_with("/api/v2/alerts") {
                base.to_owned()
            } else {
                format!("{base}/api/v2/alerts")
            };
            Endpoint::new("alertmanager", &url, &cfg.alertmanager_auth)
        });
        if let Some(endpoint) = manager {
            let resend = Duration::from_secs(if cfg.resend_s == 0 { 60 } else { cfg.resend_s });
            sinks.push(SinkTask::spawn("alertmanager", |rx| {
                alertmanager_sink(client, endpoint, rx, generator, resend, ledger)
            }));
        }
        Ok((!sinks.is_empty()).then_some(Sinks {
            sinks,
            sent: Default::default(),
        }))
    }

    /// Queues a record for every sink; a sink whose queue is full drops it (said on stderr
    /// once per 1,000 dropped).
    pub fn send(&self, record: &AlertChange) {
        {
            let mut sent = self
                .sent
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let was_sent = match record.state {
                AlertState::Resolved => sent.remove(&record.key()),
                _ => sent.contains(&record.key()),
            };
            if record.quiet.is_some() && !was_sent {
                return;
            }
            if record.state != AlertState::Resolved {
                sent.insert(record.key());
            }
        }
        for sink in &self.sinks {
            if sink.tx.try_send(record.clone()).is_err() {
                let dropped = sink.dropped.fetch_add(1, Ordering::Relaxed) + 1;
                if dropped % 1000 == 1 {
                    log::warn!(
                        "cudatrace: {} is {QUEUE} alert records behind: {dropped} dropped so far",
                        sink.name
                    );
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

/// One HTTP endpoint, its credentials, and its last error said once.
struct Endpoint {
    name: &'static str,
    uri: http::Uri,
    auth: SinkAuth,
    failing: Option<String>,
}

/// A secret file's first line, at most 4 KiB of it.
fn secret(path: &std::path::Path) -> Result<String, String> {
    use std::io::Read as _;
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(4096).read_to_string(&mut text))
        .map_err(|e| format!("cannot read {} ({e})", path.display()))?;
    Ok(text.lines().next().unwrap_or_default().to_owned())
}

impl Endpoint {
    fn new(name: &'static str, url: &str, auth: &SinkAuth) -> Option<Endpoint> {
        url.parse().ok().map(|uri| Endpoint {
            name,
            uri,
            auth: auth.clone(),
            failing: None,
        })
    }

    /// The `Authorization` header, when credentials are configured.
    fn authorization(&self) -> Result<Option<String>, String> {
        use base64::Engine as _;
        if let Some(token) = &self.auth.bearer_token_file {
            return Ok(Some(format!("Bearer {}", secret(token)?)));
        }
        match (&self.auth.username, &self.auth.password_file) {
            (Some(user), Some(file)) => {
                let pair = format!("{user}:{}", secret(file)?);
                Ok(Some(format!(
                    "Basic {}",
                    base64::engine::general_purpose::STANDARD.encode(pair)
                )))
            }
            _ => Ok(None),
        }
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
            let mut req = http::Request::post(self.uri.clone())
                .header(http::header::CONTENT_TYPE, "application/json");
            match self.authorization() {
                Ok(Some(value)) => req = req.header(http::header::AUTHORIZATION, value),
                Ok(None) => {}
                Err(e) => {
                    last = e;
                    continue;
                }
            }
            let Ok(req) = req.body(Full::new(bytes.clone())) else {
                last = "a credential is not a valid header value".into();
                continue;
            };
            match tokio::time::timeout(POST_TIMEOUT, client.request(req)).await {
                Ok(Ok(resp)) if resp.status().is_success() => {
                    if self.failing.take().is_some() {
                        log::info!("cudatrace: {} {} accepts alerts again", self.name, self.uri);
                    }
                    return true;
                }
                Ok(Ok(resp)) => last = format!("answered {}", resp.status()),
                Ok(Err(e)) => last = format!("{e}"),
                Err(_) => last = "no answer within 5 s".into(),
            }
        }
        if self.failing.as_deref() != Some(&last) {
            log::warn!(
                "cudatrace: {} {}: {last}; alerts still go to stdout and the metrics, and are sent again",
                self.name, self.uri
            );
            self.failing = Some(last);
        }
        false
    }
}

/// The webhook's task: every record as it is, or (with `group` > 0) one body per incident for
/// the changes within `group` of its first.
async fn webhook(
    client: HttpClient,
    mut endpoint: Endpoint,
    mut rx: mpsc::Receiver<AlertChange>,
    group: Duration,
) {
    if group.is_zero() {
        while let Some(record) = rx.recv().await {
            endpoint
                .post(&client, &serde_json::to_value(&record).unwrap_or_default())
                .await;
        }
        return;
    }
    let mut groups = super::group::Groups::default();
    loop {
        let due = groups.next_due().map(tokio::time::Instant::from_std);
        tokio::select! {
            record = rx.recv() => match record {
                Some(record) => groups.add(record, std::time::Instant::now(), group),
                None => break,
            },
            _ = async { tokio::time::sleep_until(due.expect("guarded")).await }, if due.is_some() => {
                for body in groups.take_due(std::time::Instant::now()) {
                    endpoint.post(&client, &body).await;
                }
            }
        }
    }
    // Stopping: what waits is sent now.
    for body in groups.take_all() {
        endpoint.post(&client, &body).await;
    }
}

/// Alertmanager's task: firing alerts (told again every `resend`) and resolved ones.
async fn alertmanager_sink(
    client: HttpClient,
    mut endpoint: Endpoint,
    mut rx: mpsc::Receiver<AlertChange>,
    generator: String,
    resend: Duration,
    ledger: Option<std::sync::Arc<super::mitigate::ledger::Ledger>>,
) {
    let instance = alertmanager::instance();
    // The alert's form, with what `[mitigate]` did for it so far.
    let form = |r: &AlertChange, ends: SystemTime| {
        let mut v = alertmanager::form(r, &instance, &generator, ends);
        if let Some(said) = ledger.as_ref().and_then(|l| l.annotation(&r.key())) {
            v["annotations"]["mitigation"] = Value::String(said);
        }
        v
    };
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
                        let body = form(&record, now + 4 * resend);
                        // Escalated: severity is a label, so the alert of the old severity
                        // ends in the same post that starts the new one.
                        let ended = firing
                            .get(&record.key())
                            .filter(|old| old.severity != record.severity)
                            .map(|old| form(old, now));
                        firing.insert(record.key(), record);
                        if let Some(ended) = ended {
                            endpoint.post(&client, &Value::Array(vec![ended, body])).await;
                            continue;
                        }
                        body
                    }
                    AlertState::Resolved => match firing.remove(&record.key()) {
                        Some(_) => form(&record, now),
                        None => continue,
                    },
                };
                endpoint.post(&client, &Value::Array(vec![body])).await;
            }
            _ = tick.tick(), if !firing.is_empty() => {
                let ends = SystemTime::now() + 4 * resend;
                let all: Vec<Value> = firing.values().map(|r| form(r, ends)).collect();
                endpoint.post(&client, &Value::Array(all)).await;
            }
        }
    }
}

/// One JSON endpoint of its own (the mitigation webhook): its own task and bounded queue, the
/// same retries and failure lines as the alert sinks.
pub struct JsonPoster {
    tx: mpsc::Sender<Value>,
    task: tokio::task::JoinHandle<()>,
}

impl JsonPoster {
    /// Starts posting to `url` (checked by the config); an error when `ca_file` is unusable.
    pub fn start(
        name: &'static str,
        url: &str,
        ca_file: Option<&std::path::Path>,
    ) -> Result<JsonPoster> {
        let client = client(ca_file)?;
        let mut endpoint = Endpoint::new(name, url, &SinkAuth::default())
            .ok_or_else(|| anyhow::anyhow!("{name}: {url:?} is not a URL"))?;
        let (tx, mut rx) = mpsc::channel::<Value>(QUEUE);
        let task = tokio::spawn(async move {
            while let Some(body) = rx.recv().await {
                endpoint.post(&client, &body).await;
            }
        });
        Ok(JsonPoster { tx, task })
    }

    /// Queues a body; one past [`QUEUE`] waiting is dropped, and said.
    pub fn send(&self, body: Value) {
        if self.tx.try_send(body).is_err() {
            log::warn!("cudatrace: a mitigation webhook body was dropped: {QUEUE} wait already");
        }
    }

    /// Sends what is queued (for at most `limit`), then stops.
    pub async fn finish(self, limit: Duration) {
        drop(self.tx);
        let _ = tokio::time::timeout(limit, self.task).await;
    }
}
