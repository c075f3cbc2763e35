use serde_json::json;

use super::*;

fn incident(workload: &str, severity: &str, start: &str, end: &str) -> Value {
    json!({
        "alert": "CudatraceComputeContention",
        "cause": "compute_contention",
        "severity": severity,
        "victim": {"pid": 7, "comm": "server", "workload": workload},
        "evidence": {"signal": "wait_per_launch"},
        "incident": {"gpu": "0", "cause": "compute_contention", "aggressors": "9:trainer"},
        "started_at": start,
        "ended_at": end,
    })
}

fn silence(matchers: Value, start: &str, end: &str) -> Value {
    json!({"id": "x", "status": {"state": "expired"}, "matchers": matchers, "startsAt": start, "endsAt": end, "createdBy": "sre", "comment": "known"})
}

#[test]
fn a_silence_covers_what_its_matchers_match_while_in_force() {
    let body = json!([
        silence(
            json!([{"name": "alertname", "value": "CudatraceComputeContention", "isRegex": false, "isEqual": true},
                   {"name": "workload", "value": "serving/llm", "isRegex": false}]),
            "2026-11-20T10:00:00Z",
            "2026-11-20T12:00:00Z"
        ),
        silence(
            json!([{"name": "workload", "value": "batch/.*", "isRegex": true, "isEqual": true},
                   {"name": "severity", "value": "page", "isRegex": false, "isEqual": false}]),
            "2026-11-21T00:00:00Z",
            "2026-11-22T00:00:00Z"
        ),
        // Not a valid expression: left out, counted.
        silence(
            json!([{"name": "workload", "value": "(", "isRegex": true, "isEqual": true}]),
            "2026-11-01T00:00:00Z",
            "2026-12-01T00:00:00Z"
        ),
        // Matches on a label cudatrace never sends: only the empty string is equal.
        silence(
            json!([{"name": "team", "value": "ml", "isRegex": false, "isEqual": true}]),
            "2026-11-01T00:00:00Z",
            "2026-12-01T00:00:00Z"
        ),
    ]);
    let s = Silences::parse(body.to_string().as_bytes()).unwrap();
    assert_eq!((s.len(), s.unreadable), (3, 1));
    let at = |w, sev, a, b| s.covers(&incident(w, sev, a, b), "node-1");
    // In force during it (overlapping its start, its end, or inside it).
    assert!(at(
        "serving/llm",
        "page",
        "2026-11-20T09:30:00Z",
        "2026-11-20T10:05:00Z"
    ));
    assert!(at(
        "serving/llm",
        "warning",
        "2026-11-20T11:00:00Z",
        "2026-11-20T11:01:00Z"
    ));
    assert!(!at(
        "serving/llm",
        "page",
        "2026-11-20T12:00:01Z",
        "2026-11-20T13:00:00Z"
    ));
    assert!(!at(
        "serving/llmx",
        "page",
        "2026-11-20T11:00:00Z",
        "2026-11-20T11:01:00Z"
    ));
    // Anchored: batch/etl matches batch/.*, not-a-batch/etl does not; severity != page.
    assert!(at(
        "batch/etl",
        "warning",
        "2026-11-21T01:00:00Z",
        "2026-11-21T02:00:00Z"
    ));
    assert!(!at(
        "batch/etl",
        "page",
        "2026-11-21T01:00:00Z",
        "2026-11-21T02:00:00Z"
    ));
    assert!(!at(
        "x/batch/etl",
        "warning",
        "2026-11-21T01:00:00Z",
        "2026-11-21T02:00:00Z"
    ));
}

#[test]
fn a_hostile_answer_is_one_line() {
    assert!(Silences::parse(b"<html>")
        .err()
        .unwrap()
        .starts_with("not Alertmanager's list of silences"));
    let many: Vec<Value> = (0..=MAX_SILENCES)
        .map(|_| silence(json!([]), "2026-11-01T00:00:00Z", "2026-11-02T00:00:00Z"))
        .collect();
    let e = Silences::parse(serde_json::to_vec(&many).unwrap().as_slice())
        .err()
        .unwrap();
    assert_eq!(
        e,
        "10001 silences, over 10000: expire old ones, or review without --alertmanager"
    );
    // An expression too large to compile within the bound is left out, not compiled.
    let huge = "(a{1000}){1000}";
    let s = Silences::parse(
        json!([silence(
            json!([{"name": "workload", "value": huge, "isRegex": true}]),
            "2026-11-01T00:00:00Z",
            "2026-11-02T00:00:00Z"
        )])
        .to_string()
        .as_bytes(),
    )
    .unwrap();
    assert_eq!((s.len(), s.unreadable), (0, 1));
}
