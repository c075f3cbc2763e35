use std::time::{Duration, SystemTime};

use serde_json::json;

use super::*;
use crate::cmd::review::review;

/// 2026-11-30T00:00:00Z.
const NOW: u64 = 1_795_996_800;

fn incident(workload: &str, severity: &str, day: u64, duration_s: f64) -> Value {
    let start = NOW - day * 86_400;
    json!({
        "alert": "CudatraceComputeContention",
        "cause": "compute_contention",
        "severity": severity,
        "victim": {"pid": 7, "comm": "server", "workload": workload},
        "aggressors": [],
        "evidence": {"signal": "wait_per_launch", "unit": "us", "now": 1500.0, "baseline_p99": 1000.0},
        "started_at": rfc3339(crate::cmd::backtest::at(start)),
        "ended_at": rfc3339(crate::cmd::backtest::at(start + duration_s as u64)),
        "duration_s": duration_s,
    })
}

#[test]
fn the_page_has_a_bar_per_tier_and_day_and_escapes_names() {
    let incidents = vec![
        incident("llm", "page", 3, 600.0),
        incident("llm", "warning", 3, 60.0),
        incident("llm", "warning", 10, 60.0),
        incident("<script>alert(1)</script>", "critical", 20, 7_200.0),
    ];
    let r = review(incidents.iter().cloned());
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(NOW);
    let page = page(
        &r,
        &incidents,
        ("30days", now, Duration::from_secs(30 * 86_400)),
        None,
    );
    let per_day = &page[page.find(r#"<svg id="per-day""#).unwrap()..];
    let per_day = &per_day[..per_day.find("</svg>").unwrap()];
    let bars = |colour: &str| per_day.matches(&format!(r#"fill="{colour}"/>"#)).count();
    // Bars, less the legend's square: page on day 3; critical on day 20; warnings on days 3 and 10.
    assert_eq!(bars(TIER_COLOURS[0]) - 1, 1);
    assert_eq!(bars(TIER_COLOURS[1]) - 1, 1);
    assert_eq!(bars(TIER_COLOURS[2]) - 1, 2);
    // Day 3 stacks two, the tallest: 200 px high in all.
    assert!(
        per_day.contains(r##"height="100.0" fill="#d62728""##),
        "{per_day}"
    );
    assert!(!page.contains("<script>"));
    assert!(page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    // Four dots in the time-to-resolve plot, one history panel per workload.
    let resolve = &page[page.find(r#"<svg id="to-resolve""#).unwrap()..];
    let resolve = &resolve[..resolve.find("</svg>").unwrap()];
    assert_eq!(resolve.matches("<circle").count(), 4);
    assert_eq!(page.matches(r#"<svg id="workload-"#).count(), 2);
    assert!(page.contains("wait_per_launch at each alert (archive), us"));
}

#[test]
fn a_history_from_prometheus_is_one_thinned_line() {
    let incidents = vec![incident("llm", "page", 1, 600.0)];
    let r = review(incidents.iter().cloned());
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(NOW);
    let from = NOW - 7 * 86_400;
    let labels: crate::backtest::prometheus::Labels =
        [("signal", "wait_per_launch"), ("workload", "llm")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
    let values = (0..7 * 1440)
        .map(|k| (k, if k == 5000 { 9e-3 } else { 1e-3 }))
        .collect();
    let matrix = Matrix::from([(labels, values)]);
    let h = History {
        matrix: &matrix,
        from,
        step: 60,
    };
    let page = page(
        &r,
        &incidents,
        ("7days", now, Duration::from_secs(7 * 86_400)),
        Some(&h),
    );
    assert!(page.contains("wait_per_launch (Prometheus), ms"));
    let line = &page[page.find("<polyline").unwrap()..];
    let points = line[..line.find("/>").unwrap()].matches(',').count();
    assert_eq!(points, 7 * 1440 / 17 + 1);
    // The spike survives the thinning: the axis' top is 1.1 times it.
    assert!(page.contains(">9.90</text>"), "{page}");
}

#[test]
fn bidi_overrides_and_zero_width_characters_never_reach_the_page() {
    assert_eq!(esc("a\u{202E}b\u{200B}c<"), "a?b?c&lt;");
    assert_eq!(esc("модель"), "модель");
}
