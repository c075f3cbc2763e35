//! The alert model's tests, and a record other tests build on.
use std::time::{Duration, SystemTime};

use serde_json::json;

use super::*;
use crate::text::rfc3339;

/// A compute-contention alert of server (pid 10) by trainer (pid 20), in `state`.
pub(crate) fn record(state: AlertState) -> AlertChange {
    let party = |pid, comm: &str, share| Party {
        workload: None,
        pid,
        comm: comm.into(),
        namespace: None,
        pod: None,
        container: None,
        share,
        change: None,
        cgroup: None,
        start_time: 0,
    };
    AlertChange {
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
            stuck_s: None,
            exit_statuses: vec![],
            time_to_full_s: None,
            drift_pct_per_week: None,
            ..Evidence::default()
        },
        started_at: rfc3339(SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)),
        at: rfc3339(SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_030)),
        reason: None,
        incident: Incident {
            gpu: "0".into(),
            cause: Cause::ComputeContention,
            aggressors: "20:trainer".into(),
        },
        quiet: None,
        escalated_from: None,
    }
}

#[test]
fn json_line_has_the_documented_fields() {
    let v = serde_json::to_value(record(AlertState::Firing)).unwrap();
    assert_eq!(v["alert"], "CudatraceComputeContention");
    assert_eq!(
        (
            v["state"].as_str(),
            v["severity"].as_str(),
            v["cause"].as_str()
        ),
        (Some("firing"), Some("page"), Some("compute_contention"))
    );
    assert_eq!(
        v["victim"],
        json!({"pid": 10, "comm": "server", "namespace": null, "pod": null, "container": null})
    );
    assert_eq!(
        v["aggressors"],
        json!([{"pid": 20, "comm": "trainer", "namespace": null, "pod": null, "container": null, "share": 0.9}])
    );
    assert_eq!(v["started_at"], "2027-01-15T08:00:00Z");
    assert!(v.get("reason").is_none());
    assert!(v["evidence"].get("clock_event_reasons").is_none());
    assert_eq!(
        v["incident"],
        json!({"gpu": "0", "cause": "compute_contention", "aggressors": "20:trainer"})
    );
    assert!(v.get("quiet").is_none());
}

#[test]
fn the_incident_names_the_aggressors_holding_half_the_share() {
    let party = |pid, comm: &str, share| Party {
        workload: None,
        pid,
        comm: comm.into(),
        namespace: None,
        pod: None,
        container: None,
        share: Some(share),
        change: None,
        cgroup: None,
        start_time: 0,
    };
    // Two victims of one trainer: each sees the other as a small aggressor.
    let a = Incident::of(
        Cause::ComputeContention,
        "0",
        &[party(30, "trainer", 0.8), party(12, "server-b", 0.2)],
    );
    let b = Incident::of(
        Cause::ComputeContention,
        "0",
        &[party(30, "trainer", 0.7), party(11, "server-a", 0.3)],
    );
    assert_eq!(a, b);
    assert_eq!(a.aggressors, "30:trainer");
    // Two trainers sharing it: both, by pid.
    let c = Incident::of(
        Cause::ComputeContention,
        "0",
        &[
            party(40, "t2", 0.45),
            party(30, "t1", 0.4),
            party(11, "s", 0.15),
        ],
    );
    assert_eq!(c.aggressors, "30:t1,40:t2");
    assert_eq!(Incident::of(Cause::Throttling, "1", &[]).aggressors, "");
}
