//! End-to-end: `cudatrace backtest` against a real Prometheus holding two synthetic weeks of
//! `cudatrace_signal_value` (backfilled with promtool): a daily peak raises no alert once its
//! season is learned, a 10%-a-week drift raises CudatraceGradualDegradation and the steady
//! series nothing, a 5x spike fires at critical or page within 5 minutes; bad input is one
//! line and exit 1.
use std::{
    fmt::Write as _,
    process::Command,
    time::{Instant, SystemTime, UNIX_EPOCH},
};

use integration_tests::{env, servers::Prometheus};
use serde_json::Value;

const DAY: u64 = 86_400;
const STEP: u64 = 60;

/// A synthetic series: its value (seconds) at a time (Unix seconds).
type Shape = Box<dyn Fn(u64) -> f64>;

/// Deterministic noise of ±2%.
fn noise(k: u64) -> f64 {
    let x = (k.wrapping_mul(2_654_435_761) % 1000) as f64 / 1000.0;
    1.0 + 0.04 * (x - 0.5)
}

/// RFC 3339 of Unix seconds.
fn rfc(t: u64) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + std::time::Duration::from_secs(t)).to_string()
}

/// Seconds since `from` of a record's `at`.
fn at(v: &Value, from: u64) -> u64 {
    humantime::parse_rfc3339(v["at"].as_str().unwrap())
        .unwrap()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
        - from
}

#[test]
fn backtest_replays_two_weeks_from_prometheus() {
    let Some(env) = env() else { return };
    let today = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
        / DAY
        * DAY;
    let from = today - 14 * DAY;
    let to = today - STEP;
    let spike = from + 12 * DAY + 12 * 3600;
    let kinds: [(&str, Shape); 4] = [
        (
            "serving/daily",
            Box::new(|t| if (t % DAY) / 3600 == 9 { 1.6e-3 } else { 1e-3 }),
        ),
        (
            "serving/drift",
            Box::new(move |t| 1e-3 * 1.1f64.powf((t - from) as f64 / (7 * DAY) as f64)),
        ),
        ("serving/steady", Box::new(|_| 1e-3)),
        (
            "serving/spike",
            Box::new(move |t| {
                if (spike..spike + 1800).contains(&t) {
                    5e-3
                } else {
                    1e-3
                }
            }),
        ),
    ];
    let mut om = String::from("# TYPE cudatrace_signal_value gauge\n");
    for (w, f) in &kinds {
        let mut t = from;
        let mut k = 0;
        while t <= to {
            writeln!(
                om,
                "cudatrace_signal_value{{signal=\"wait_per_launch\",workload=\"{w}\",comm=\"server\",namespace=\"serving\"}} {} {t}",
                f(t) * noise(k)
            )
            .unwrap();
            t += STEP;
            k += 1;
        }
    }
    om.push_str("# EOF\n");
    let prom = Prometheus::start_with("", None, Some(&om));
    prom.wait_ready();
    assert_eq!(prom.series("cudatrace_signal_value").len(), 4);
    let started = Instant::now();
    let range = |step: &str, extra: &[&str]| {
        Command::new(&env.bin)
            .args([
                "backtest",
                "--prometheus",
                &prom.url(),
                "--from",
                &rfc(from),
                "--to",
                &rfc(to),
                "--step",
                step,
            ])
            .args(extra)
            .output()
            .unwrap()
    };
    let out = range("60", &[]);
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let firing = |w: &str| -> Vec<&Value> {
        lines
            .iter()
            .filter(|v| v["state"] == "firing" && v["victim"]["workload"] == w)
            .collect()
    };
    eprintln!(
        "e2e backtest_replays_two_weeks_from_prometheus: {} changes in {took:?}; {}; firing: daily {:?} drift {:?} steady {} spike {:?}",
        lines.len(),
        stderr.trim(),
        firing("serving/daily").iter().map(|v| at(v, from)).collect::<Vec<_>>(),
        firing("serving/drift").iter().map(|v| (v["alert"].clone(), v["evidence"]["drift_pct_per_week"].clone())).collect::<Vec<_>>(),
        firing("serving/steady").len(),
        firing("serving/spike").iter().map(|v| (v["severity"].clone(), at(v, from) as i64 - (spike - from) as i64)).collect::<Vec<_>>(),
    );
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let windows = (to - from) / STEP + 1;
    assert!(
        stderr.contains(&format!(
            "backtest: 4 series (4 processes, 4 workloads), {windows} windows of 60 s from {} to {}:",
            rfc(from),
            rfc(to)
        )),
        "{stderr}"
    );
    assert!(took.as_secs() < 60, "took {took:?}");
    // The daily peak: nothing once a season is learned.
    let daily = firing("serving/daily");
    assert!(daily.iter().all(|v| at(v, from) < 2 * DAY), "{daily:?}");
    // The drift: one degradation alert, at about 10% a week, from the second week.
    let drift = firing("serving/drift");
    assert_eq!(drift.len(), 1, "{drift:?}");
    assert_eq!(
        (
            drift[0]["alert"].as_str(),
            drift[0]["severity"].as_str(),
            drift[0]["cause"].as_str()
        ),
        (
            Some("CudatraceGradualDegradation"),
            Some("warning"),
            Some("degradation")
        )
    );
    let rate = drift[0]["evidence"]["drift_pct_per_week"].as_f64().unwrap();
    assert!((9.0..=11.0).contains(&rate), "{rate}");
    assert!(at(drift[0], from) >= 7 * DAY, "{}", drift[0]);
    // Steady: nothing at all.
    assert!(lines
        .iter()
        .all(|v| v["victim"]["workload"] != "serving/steady"));
    // The spike: critical or page, within 5 minutes of its start.
    let spiked = firing("serving/spike");
    assert_eq!(spiked.len(), 1, "{spiked:?}");
    assert!(matches!(
        spiked[0]["severity"].as_str(),
        Some("critical" | "page")
    ));
    assert!(at(spiked[0], from) - (spike - from) <= 300, "{}", spiked[0]);
    assert_eq!(spiked[0]["alert"], "CudatraceSlowdown");
    assert_eq!(spiked[0]["victim"]["namespace"], "serving");

    // --match: only the selected series.
    let out = range("300", &["--match", "{workload=\"serving/steady\"}"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("backtest: 1 series (1 processes, 1 workloads)"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());

    // Bad input: one line, exit 1.
    let url = prom.url();
    let cases: [(Vec<&str>, String); 3] = [
        (
            vec!["--prometheus", &url, "--from", "2026-11-02T00:00:00Z", "--to", "2026-11-01T00:00:00Z"],
            "cudatrace: --to 2026-11-01T00:00:00Z is not after --from 2026-11-02T00:00:00Z: give a range forward in time".into(),
        ),
        (
            vec!["--prometheus", &url, "--from", "2020-01-01T00:00:00Z", "--to", "2020-01-02T00:00:00Z", "--step", "60"],
            format!("cudatrace: {url} holds no cudatrace_signal_value from 2020-01-01T00:00:00Z to 2020-01-02T00:00:00Z: check the range, the selector, and that Prometheus scrapes cudatrace"),
        ),
        (
            vec!["--prometheus", "ftp://x", "--from", "2026-11-01T00:00:00Z", "--to", "2026-11-02T00:00:00Z"],
            "cudatrace: --prometheus ftp://x: not an http or https URL: give http[s]://HOST[:PORT][/PATH]".into(),
        ),
    ];
    for (args, want) in cases {
        let out = Command::new(&env.bin)
            .arg("backtest")
            .args(&args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert_eq!(err.trim_end(), want);
    }
}
