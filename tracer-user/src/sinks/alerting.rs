//! Where alert changes go, behind one small interface ([`AlertSink`]), every sink registered in
//! one place ([`AlertSinks::start`]): stdout (always), the webhook and Alertmanager (one task
//! each, `http`), the incident archive (`archive`), and automatic degradation (`mitigate`). A sink never blocks the event loop: the
//! HTTP sinks queue, the archive appends a line per resolved alert.
use std::{future::Future, pin::Pin, time::Duration};

use thiserror::Error;

use super::{archive::Archive, http::Sinks, stdout};
use crate::{alert::AlertChange, config::Config, text::printable};

/// A sink that could not start; each displays as the one line the user reads.
#[derive(Debug, Error)]
pub enum SinkError {
    /// The incident archive cannot be appended to.
    #[error(
        "cannot append to the incident archive {path}: {why}; give a writable [alerts] archive path"
    )]
    Archive {
        /// The archive's path, printable.
        path: String,
        /// Why.
        why: std::io::Error,
    },
    /// The HTTP sinks cannot start (an unusable `ca_file`).
    #[error("{0:#}")]
    Http(anyhow::Error),
}

/// One destination of alert changes.
pub trait AlertSink {
    /// Its name, in what cudatrace says about it.
    fn name(&self) -> &'static str;
    /// One detection window's changes, in order.
    fn publish(&self, changes: &[AlertChange]);
    /// Sends what is still queued, for at most `limit`, then stops.
    fn finish(self: Box<Self>, _limit: Duration) -> Pin<Box<dyn Future<Output = ()>>> {
        Box::pin(async {})
    }
}

/// Alert changes as JSON lines on stdout.
struct Stdout;

impl AlertSink for Stdout {
    fn name(&self) -> &'static str {
        "stdout"
    }

    fn publish(&self, changes: &[AlertChange]) {
        stdout::print_changes(changes);
    }
}

impl AlertSink for Sinks {
    fn name(&self) -> &'static str {
        "http"
    }

    fn publish(&self, changes: &[AlertChange]) {
        for change in changes {
            self.send(change);
        }
    }

    fn finish(self: Box<Self>, limit: Duration) -> Pin<Box<dyn Future<Output = ()>>> {
        Box::pin(Sinks::finish(*self, limit))
    }
}

impl AlertSink for Archive {
    fn name(&self) -> &'static str {
        "archive"
    }

    fn publish(&self, changes: &[AlertChange]) {
        if let Err(e) = self.record(changes) {
            log::error!("cudatrace: cannot append to the incident archive: {e}");
        }
    }
}

/// Every alert sink the config asks for.
pub struct AlertSinks {
    sinks: Vec<Box<dyn AlertSink>>,
}

impl AlertSinks {
    /// Starts the sinks of `cfg`: stdout, then the HTTP sinks (`metrics_url` is what
    /// Alertmanager shows as the alerts' source), then the archive, then `[mitigate]`. Each is checked before
    /// anything is attached, so a bad sink costs nothing traced.
    pub fn start(cfg: &Config, metrics_url: String) -> Result<AlertSinks, SinkError> {
        let mut sinks: Vec<Box<dyn AlertSink>> = vec![Box::new(Stdout)];
        // What `[mitigate]` does, for the archive's records and Alertmanager's annotations.
        let ledger = cfg
            .mitigate
            .enabled
            .then(|| std::sync::Arc::new(super::mitigate::ledger::Ledger::default()));
        if let Some(http) =
            Sinks::start(&cfg.alerts, metrics_url, ledger.clone()).map_err(SinkError::Http)?
        {
            sinks.push(Box::new(http));
        }
        if let Some(path) = &cfg.alerts.archive {
            let mib = if cfg.alerts.archive_max_mib == 0 {
                64
            } else {
                cfg.alerts.archive_max_mib
            };
            let archive = Archive::open(path, mib << 20).map_err(|why| SinkError::Archive {
                path: printable(&path.display().to_string()).into_owned(),
                why,
            })?;
            sinks.push(Box::new(match &ledger {
                Some(l) => archive.with_ledger(l.clone()),
                None => archive,
            }));
        }
        if cfg.mitigate.enabled {
            let m = super::mitigate::Mitigator::start(
                &cfg.mitigate,
                cfg.alerts.ca_file.as_deref(),
                ledger,
            )
            .map_err(SinkError::Http)?;
            sinks.push(Box::new(m));
        }
        Ok(AlertSinks { sinks })
    }

    /// The sinks' names, in the order they get each change.
    pub fn names(&self) -> Vec<&'static str> {
        self.sinks.iter().map(|s| s.name()).collect()
    }

    /// Hands one window's changes to every sink.
    pub fn publish(&self, changes: &[AlertChange]) {
        if changes.is_empty() {
            return;
        }
        for sink in &self.sinks {
            sink.publish(changes);
        }
    }

    /// Lets every sink send what is queued, within `limit` in all.
    pub async fn finish(self, limit: Duration) {
        let deadline = tokio::time::Instant::now() + limit;
        for sink in self.sinks {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            sink.finish(left).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stdout_alone_without_sinks_then_each_configured_one_in_order() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _guard = runtime.enter();
        let none = AlertSinks::start(&Config::default(), "http://x/metrics".into()).unwrap();
        assert_eq!(none.names(), ["stdout"]);
        let dir = std::env::temp_dir().join(format!("cudatrace-sinks-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut cfg = Config::default();
        cfg.alerts.webhook_url = Some("http://127.0.0.1:9/hook".into());
        cfg.alerts.archive = Some(dir.join("incidents.jsonl"));
        let all = AlertSinks::start(&cfg, "http://x/metrics".into()).unwrap();
        assert_eq!(all.names(), ["stdout", "http", "archive"]);
        cfg.alerts.archive = Some(dir.join("no-such-dir/incidents.jsonl"));
        assert!(matches!(
            AlertSinks::start(&cfg, "http://x/metrics".into()),
            Err(SinkError::Archive { .. })
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
