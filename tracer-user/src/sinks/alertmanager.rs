//! Alertmanager's API v2 form of an alert change. Firing alerts are sent again every `resend_s`
//! with an end time four periods ahead (as Prometheus does, so that Alertmanager keeps them while
//! cudatrace runs and lets them expire when it does not); resolved ones end now. The `gpu` and
//! `aggressors` labels are the alert's incident (fixed when it went pending), so that a route
//! grouping by `gpu`, `cause` and `aggressors` (deploy/alertmanager/alertmanager.yml) makes one
//! notification of every victim of one aggressor set; the `aggressors` annotation is the latest
//! list with shares.
use std::time::SystemTime;

use serde_json::{json, Value};

use crate::{
    alert::{AlertChange, RUNBOOK_BASE},
    text::{defang, rfc3339},
};

/// The Alertmanager API v2 form of `change`, ending at `ends`.
pub fn form(change: &AlertChange, instance: &str, generator: &str, ends: SystemTime) -> Value {
    let opt = |o: &Option<String>| o.clone().unwrap_or_default();
    json!({
        "labels": {
            "alertname": change.alert,
            "severity": change.severity.as_str(),
            "cause": change.cause.as_str(),
            "signal": change.evidence.signal,
            "gpu": change.incident.gpu,
            "pid": change.victim.pid.to_string(),
            "comm": defang(&change.victim.comm),
            "namespace": opt(&change.victim.namespace),
            "pod": opt(&change.victim.pod),
            "container": opt(&change.victim.container),
            "workload": defang(&opt(&change.victim.workload)),
            "instance": instance,
            "aggressors": change.incident.aggressors,
        },
        "annotations": {
            "summary": change.summary(),
            "aggressors": change.aggressors_label(),
            "response": change.severity.response(),
            "runbook_url": format!("{RUNBOOK_BASE}{}", change.alert.to_lowercase()),
            "chain": change.chain_text(),
            "advice": change.cause.advice(),
            "record": serde_json::to_string(change).unwrap_or_default(),
        },
        "startsAt": change.started_at,
        "endsAt": rfc3339(ends),
        "generatorURL": generator,
    })
}

/// The `instance` label: `NODE_NAME` when set (a DaemonSet passes the node's name through the
/// downward API; the pod's hostname would name the pod), else the hostname.
pub fn instance() -> String {
    match std::env::var("NODE_NAME") {
        Ok(node) if !node.is_empty() => node,
        _ => std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::alert::{tests::record, AlertState};

    #[test]
    fn alertmanager_form() {
        let r = record(AlertState::Firing);
        let ends = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_240);
        let v = form(&r, "node-1", "http://127.0.0.1:9464/metrics", ends);
        assert_eq!(v["labels"]["alertname"], "CudatraceComputeContention");
        assert_eq!(
            (
                v["labels"]["pid"].as_str(),
                v["labels"]["instance"].as_str()
            ),
            (Some("10"), Some("node-1"))
        );
        assert_eq!(v["annotations"]["aggressors"], "20:trainer");
        assert_eq!(
            (v["annotations"]["response"].as_str(), v["annotations"]["runbook_url"].as_str()),
            (
                Some("at once"),
                Some("https://github.com/cudatrace/cudatrace/blob/main/docs/alerts.md#cudatracecomputecontention")
            )
        );
        assert_eq!(
            (
                v["labels"]["aggressors"].as_str(),
                v["labels"]["gpu"].as_str()
            ),
            (Some("20:trainer"), Some("0"))
        );
        assert_eq!(
            (v["startsAt"].as_str(), v["endsAt"].as_str()),
            (Some("2027-01-15T08:00:00Z"), Some("2027-01-15T08:04:00Z"))
        );
        assert_eq!(
            r.summary(),
            "server (pid 10) slowed by trainer (pid 20) 90% on GPU 0: wait_per_launch 4.000e-3 seconds vs baseline p99 1.100e-3 (compute_contention, 3.6x)"
        );
    }
}
