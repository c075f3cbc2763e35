//! The HTTP alert sinks: each change is POSTed to a webhook as it is, and Alertmanager (API v2)
//! gets firing and resolved alerts. A sink that fails is retried, said once on stderr, and never
//! holds up tracing: records reach the sink task through a channel.
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
use serde_json::Value;
use tokio::sync::mpsc;

use super::alertmanager;
use crate::{
    alert::{AlertChange, AlertState},
    config::AlertConfig,
};

/// The sending end of the sink task; dropping it ends the task.
pub struct Sinks {
    tx: mpsc::UnboundedSender<AlertChange>,
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
    pub fn send(&self, record: &AlertChange) {
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

async fn run(cfg: AlertConfig, generator: String, mut rx: mpsc::UnboundedReceiver<AlertChange>) {
    let client: Client<HttpConnector, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let mut webhook = cfg.webhook_url.as_deref().and_then(|u| Endpoint::new("webhook", u));
    let mut manager = cfg.alertmanager_url.as_deref().and_then(|u| {
        let base = u.trim_end_matches('/');
        let url = if base.ends_with("/api/v2/alerts") { base.to_owned() } else { format!("{base}/api/v2/alerts") };
        Endpoint::new("alertmanager", &url)
    });
    let instance = alertmanager::instance();
    let resend = Duration::from_secs(if cfg.resend_s == 0 { 60 } else { cfg.resend_s });
    let mut tick = tokio::time::interval(resend);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Firing alerts, by identity: what Alertmanager is told again on each tick.
    let mut firing: HashMap<(u32, &'static str, &'static str), AlertChange> = HashMap::new();
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
                m.post(&client, &Value::Array(vec![body])).await;
            }
            _ = tick.tick(), if manager.is_some() && !firing.is_empty() => {
                let ends = SystemTime::now() + 4 * resend;
                let all: Vec<Value> = firing.values().map(|r| alertmanager::form(r, &instance, &generator, ends)).collect();
                manager.as_mut().expect("checked").post(&client, &Value::Array(all)).await;
            }
        }
    }
}

