use serde_json::json;

use super::*;

/// An archived incident: alert, cause, workload, severity, seconds to resolve, whether it named
/// an aggressor, whether it fell in a quiet period.
fn incident(
    (alert, cause, workload): (&str, &str, &str),
    severity: &str,
    duration_s: f64,
    named: bool,
    quiet: bool,
) -> Value {
    json!({
        "alert": alert,
        "cause": cause,
        "severity": severity,
        "victim": {"pid": 7, "comm": "server", "workload": workload},
        "aggressors": if named { json!([{"pid": 9, "comm": "trainer", "share": 1.0}]) } else { json!([]) },
        "evidence": {"signal": "wait_per_launch", "ratio": 2.0},
        "started_at": "2026-11-20T00:00:00Z",
        "ended_at": "2026-11-20T01:00:00Z",
        "duration_s": duration_s,
        "quiet": if quiet { json!({"name": "nightly"}) } else { Value::Null },
    })
}

/// A synthetic month: six compute-contention incidents of "llm" (three flapping, one quiet),
/// three unexplained slowdowns of "batch" (all flapping, none naming anyone), one drift alert.
fn month() -> Vec<Value> {
    let cc = ("CudatraceComputeContention", "compute_contention", "llm");
    let sd = ("CudatraceSlowdown", "unexplained", "batch");
    let mut v = vec![
        incident(cc, "page", 60.0, true, false),
        incident(cc, "page", 3_600.0, true, false),
        incident(cc, "critical", 400.0, true, true),
        incident(cc, "warning", 900.0, true, false),
        incident(cc, "warning", 120.0, true, false),
        incident(cc, "warning", 30.0, true, false),
        incident(sd, "warning", 100.0, false, false),
        incident(sd, "warning", 200.0, false, false),
        incident(sd, "warning", 50.0, false, false),
    ];
    let mut drift = incident(
        ("CudatraceGradualDegradation", "degradation", "llm"),
        "warning",
        86_400.0,
        false,
        false,
    );
    drift["evidence"]["drift_pct_per_week"] = json!(4.2);
    v.push(drift);
    v
}

/// A row flattened: alert, cause, workload, count, tiers, median, max, flapping, unnamed, quiet.
type Flat<'a> = (
    &'a str,
    &'a str,
    &'a str,
    u64,
    [u64; 3],
    f64,
    f64,
    u64,
    u64,
    u64,
);

#[test]
fn a_month_is_counted_per_alert_cause_and_workload() {
    let r = review(month());
    assert_eq!(r.incidents, 10);
    let rows: Vec<Flat<'_>> = r
        .rows
        .iter()
        .map(|r| {
            (
                r.alert.as_str(),
                r.cause.as_str(),
                r.workload.as_str(),
                r.count,
                r.tiers,
                r.median_s,
                r.max_s,
                r.flapping,
                r.no_aggressor,
                r.quiet,
            )
        })
        .collect();
    assert_eq!(
        rows,
        vec![
            (
                "CudatraceComputeContention",
                "compute_contention",
                "llm",
                6,
                [2, 1, 3],
                400.0,
                3_600.0,
                3,
                0,
                1
            ),
            (
                "CudatraceSlowdown",
                "unexplained",
                "batch",
                3,
                [0, 0, 3],
                100.0,
                200.0,
                3,
                3,
                0
            ),
            (
                "CudatraceGradualDegradation",
                "degradation",
                "llm",
                1,
                [0, 0, 1],
                86_400.0,
                86_400.0,
                0,
                1,
                0
            ),
        ]
    );
    assert_eq!(
        r.noisiest,
        vec![("llm".to_owned(), 7), ("batch".to_owned(), 3)]
    );
    assert_eq!(
        r.drift,
        vec![Drift {
            workload: "llm".into(),
            pct_per_week: 4.2,
            ended_at: "2026-11-20T01:00:00Z".into()
        }]
    );
}

#[test]
fn the_report_says_tiers_flapping_and_trends_in_lines() {
    let lines = review(month()).lines("30days");
    assert_eq!(lines[0], "review: 10 incidents ended in the last 30days");
    assert_eq!(
        lines[1],
        "tiers: page 2, critical 1, warning 7; flapping (resolved within 5 min) 6; without an aggressor 4"
    );
    assert!(lines[3].starts_with("CudatraceComputeContention    compute_contention    llm"));
    assert_eq!(lines[6], "noisiest workloads: llm (7), batch (3)");
    assert_eq!(
        lines[7],
        "drift (P3 trend): llm +4.2%/week, ended 2026-11-20T01:00:00Z"
    );
    assert_eq!(lines.len(), 8);
    // Acted on: one line more, counting each kind of action.
    let mut acted = month();
    acted[0]["mitigation"] = serde_json::json!([
        {"event": "act", "dry_run": false, "done": true},
        {"event": "act", "dry_run": false, "done": false}
    ]);
    acted[1]["mitigation"] = serde_json::json!([{"event": "act", "dry_run": true, "done": false}]);
    let r = review(acted);
    assert_eq!(
        (
            r.mitigation.incidents,
            r.mitigation.capped,
            r.mitigation.planned,
            r.mitigation.refused
        ),
        (2, 1, 1, 1)
    );
    assert_eq!(
        r.lines("30days")[8],
        "automatic degradation: 2 incidents acted on: 1 caps taken, 1 planned in dry runs, 1 refused"
    );
    // Nothing archived: one line.
    assert_eq!(
        review(Vec::new()).lines("7days"),
        ["review: 0 incidents ended in the last 7days"]
    );
}

/// Names tenants chose are escaped: a workload with a terminal escape stays one printable line.
#[test]
fn hostile_names_stay_printable() {
    let v = incident(("A", "c", "evil\u{1b}[2J\nname"), "page", 10.0, true, false);
    let lines = review([v]).lines("1day");
    assert!(
        lines
            .iter()
            .all(|l| !l.contains('\u{1b}') && !l.contains('\n')),
        "{lines:?}"
    );
}
