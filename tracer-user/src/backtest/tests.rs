//! Replays of synthetic weeks through the detector: the outcomes the issue asks for, without a
//! Prometheus (the end-to-end test reads the same kind of weeks back from a real one).
use std::time::{Duration, SystemTime};

use super::{prometheus::Matrix, replay};
use crate::{alert::AlertChange, config::DetectConfig};

/// 2026-11-02T00:00:00Z, a Monday.
const FROM: u64 = 1_793_577_600;
const STEP: u64 = 60;
const DAY: u64 = 86_400;

/// Deterministic noise of ±2%.
fn noise(k: u64) -> f64 {
    let x = (k.wrapping_mul(2_654_435_761) % 1000) as f64 / 1000.0;
    1.0 + 0.04 * (x - 0.5)
}

/// One workload's wait_per_launch over `days`, in seconds, from `f(seconds since FROM)`.
fn one(workload: &str, days: u64, f: impl Fn(u64) -> f64) -> (Matrix, u64) {
    let windows = days * DAY / STEP;
    let labels = [
        ("signal", "wait_per_launch"),
        ("workload", workload),
        ("comm", "server"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let values = (0..windows).map(|k| (k, f(k * STEP) * noise(k))).collect();
    (Matrix::from([(labels, values)]), windows)
}

fn run(m: Matrix, windows: u64) -> Vec<AlertChange> {
    let mut out = Vec::new();
    let from = SystemTime::UNIX_EPOCH + Duration::from_secs(FROM);
    let s = replay(
        m,
        &DetectConfig::default(),
        (from, Duration::from_secs(STEP), windows),
        |c| out.push(c.clone()),
    );
    assert_eq!(s.windows, windows);
    out
}

/// Seconds since FROM of a record's `at`.
fn at(c: &AlertChange) -> u64 {
    humantime::parse_rfc3339(&c.at)
        .unwrap()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        - FROM
}

fn firing(out: &[AlertChange]) -> Vec<&AlertChange> {
    out.iter()
        .filter(|c| c.state == crate::alert::AlertState::Firing)
        .collect()
}

/// 1 ms, 1.6 ms from 09:00 to 10:00 UTC.
fn peaked(t: u64) -> f64 {
    if (t % DAY) / 3600 == 9 {
        1.6e-3
    } else {
        1e-3
    }
}

#[test]
fn a_daily_peak_is_expected_once_a_season_is_learned() {
    let (m, w) = one("serving/llm/server", 14, peaked);
    let out = run(m, w);
    let late: Vec<_> = firing(&out)
        .into_iter()
        .filter(|c| at(c) >= 2 * DAY)
        .collect();
    assert!(late.is_empty(), "{late:?}");
    // The first day, nothing is known of the peak: it fires.
    let first: Vec<_> = firing(&out).into_iter().filter(|c| at(c) < DAY).collect();
    assert_eq!(first.len(), 1, "{first:?}");
    assert_eq!(first[0].alert, "CudatraceSlowdown");
}

#[test]
fn a_peak_at_an_unusual_hour_fires() {
    // The daily peak, and on day 10 the same rise at 03:00.
    let (m, w) = one("serving/llm/server", 11, |t| {
        if t / DAY == 10 && (t % DAY) / 3600 == 3 {
            1.6e-3
        } else {
            peaked(t)
        }
    });
    let out = run(m, w);
    let late: Vec<_> = firing(&out)
        .into_iter()
        .filter(|c| at(c) >= 2 * DAY)
        .collect();
    assert_eq!(late.len(), 1, "{late:?}");
    let t = at(late[0]);
    assert!(
        (10 * DAY + 3 * 3600..10 * DAY + 3 * 3600 + 300).contains(&t),
        "fired at {t}"
    );
    assert_eq!(
        late[0].victim.workload.as_deref(),
        Some("serving/llm/server")
    );
}

#[test]
fn a_drift_of_ten_percent_a_week_fires_and_a_stable_series_does_not() {
    let (m, w) = one("serving/llm/server", 14, |t| {
        1e-3 * 1.1f64.powf(t as f64 / (7.0 * DAY as f64))
    });
    let out = run(m, w);
    let fired = firing(&out);
    assert_eq!(fired.len(), 1, "{out:?}");
    let d = fired[0];
    assert_eq!(
        (d.alert, d.severity.as_str(), d.cause.as_str()),
        ("CudatraceGradualDegradation", "warning", "degradation")
    );
    let rate = d.evidence.drift_pct_per_week.unwrap();
    assert!((9.0..=11.0).contains(&rate), "{rate}");
    assert_eq!(d.victim.workload.as_deref(), Some("serving/llm/server"));
    // Hourly summaries spanning 6 of 7 days, then held a day.
    let t = at(d);
    assert!((7 * DAY..=8 * DAY + 3600).contains(&t), "fired at {t}");
    let (m, w) = one("serving/llm/steady", 14, |_| 1e-3);
    assert!(run(m, w).is_empty());
}

#[test]
fn a_five_fold_spike_pages_within_five_minutes() {
    let spike = 3 * DAY + 12 * 3600;
    let (m, w) = one("serving/llm/server", 4, |t| {
        if (spike..spike + 1800).contains(&t) {
            5e-3
        } else {
            1e-3
        }
    });
    let out = run(m, w);
    let f = firing(&out);
    assert_eq!(f.len(), 1, "{out:?}");
    assert!(
        matches!(f[0].severity.as_str(), "critical" | "page"),
        "{:?}",
        f[0].severity
    );
    assert!(
        at(f[0]) - spike <= 300,
        "fired {} s after",
        at(f[0]) - spike
    );
}

/// Seven rises of +20% for 20 minutes at unusual hours over days 2 and 3, and a two-fold
/// spike for 30 minutes on day 3: seven warnings and one page with the defaults.
fn bumpy(t: u64) -> f64 {
    let bumps = [
        2 * DAY + 3 * 3600,
        2 * DAY + 7 * 3600 + 1800,
        2 * DAY + 13 * 3600,
        2 * DAY + 20 * 3600,
        3 * DAY + 3600,
        3 * DAY + 9 * 3600,
        3 * DAY + 15 * 3600 + 1800,
    ];
    let spike = 3 * DAY + 18 * 3600;
    if (spike..spike + 1800).contains(&t) {
        2e-3
    } else if bumps.iter().any(|b| (*b..b + 1200).contains(&t)) {
        1.2e-3
    } else {
        1e-3
    }
}

#[test]
fn proposals_are_measured_on_the_replayed_history() {
    let (m, w) = one("serving/llm/server", 4, bumpy);
    let from = SystemTime::UNIX_EPOCH + Duration::from_secs(FROM);
    let p = super::propose::propose(
        &m,
        &DetectConfig::default(),
        (from, Duration::from_secs(STEP), w),
    );
    let got: Vec<(&str, [u64; 3], u64, bool)> = p
        .variants
        .iter()
        .map(|e| (e.change.as_str(), e.tiers, e.pages_lost, e.proposed))
        .collect();
    assert_eq!(p.windows, w);
    assert_eq!(p.tiers, [1, 0, 7]);
    assert_eq!(
        got,
        vec![
            ("warning at +15% instead of +10%", [1, 0, 0], 0, true),
            ("warning at +20% instead of +10%", [1, 0, 0], 0, true),
            ("critical at +40% instead of +30%", [1, 0, 7], 0, false),
            (
                "pending after 5 breaching windows instead of 3",
                [1, 0, 7],
                0,
                false
            ),
            ("firing after 60 s instead of 30 s", [1, 0, 7], 0, false),
            (
                "resolved after 120 s without a breach instead of 60 s",
                [1, 0, 7],
                0,
                false
            ),
        ]
    );
    let lines = p.lines(STEP);
    assert_eq!(
        lines[1],
        "proposed: warning at +15% instead of +10%: 7 of 8 incidents gone (page 1 -> 1, critical 0 -> 0, warning 7 -> 0), every page kept"
    );
    assert_eq!(
        lines[3],
        "not proposed: critical at +40% instead of +30%: nothing gone (page 1 -> 1, critical 0 -> 0, warning 7 -> 7)"
    );
}

#[test]
fn a_variant_that_loses_a_page_is_not_proposed() {
    // A three-fold rise for 4 windows pages; pending after 5 windows loses it.
    let short = 2 * DAY + 12 * 3600;
    let (m, w) = one("serving/llm/server", 3, |t| {
        if (short..short + 4 * STEP).contains(&t) {
            3e-3
        } else {
            1e-3
        }
    });
    let from = SystemTime::UNIX_EPOCH + Duration::from_secs(FROM);
    let p = super::propose::propose(
        &m,
        &DetectConfig::default(),
        (from, Duration::from_secs(STEP), w),
    );
    assert_eq!(p.tiers, [1, 0, 0]);
    let pending = &p.variants[3];
    assert_eq!(
        pending.change,
        "pending after 5 breaching windows instead of 3"
    );
    assert_eq!(
        (pending.tiers, pending.pages_lost, pending.proposed),
        ([0, 0, 0], 1, false)
    );
    assert_eq!(
        p.lines(STEP)[4],
        "not proposed: pending after 5 breaching windows instead of 3: 1 of 1 pages lost (page 1 -> 0, critical 0 -> 0, warning 0 -> 0)"
    );
}
