//! End-to-end: `cudatrace review` over a synthetic 30-day archive. `--html` writes one
//! self-contained page that a real headless Chromium renders: the screenshot holds the per-day
//! bars of each tier at their scale (pixels of each tier's colour against the bars' areas) and
//! the time-to-resolve medians.
use std::{
    fmt::Write as _,
    process::Command,
    time::{SystemTime, UNIX_EPOCH},
};

use integration_tests::{env, guards::TempDir};
use serde_json::{json, Value};

const DAY: u64 = 86_400;
/// The page's tier colours (page, critical, warning) and the medians' colour, as RGB.
const TIERS: [[u8; 3]; 3] = [[0xd6, 0x27, 0x28], [0xff, 0x7f, 0x0e], [0xf2, 0xc2, 0x00]];
const MEDIAN: [u8; 3] = [0x1f, 0x77, 0xb4];

fn rfc(t: u64) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + std::time::Duration::from_secs(t)).to_string()
}

/// An archived incident of `workload` at `severity`, started `days_ago` days (and an hour)
/// before `now`, lasting `duration_s`.
fn incident(now: u64, workload: &str, severity: &str, days_ago: u64, duration_s: u64) -> Value {
    let start = now - days_ago * DAY - 3_600;
    json!({
        "alert": "CudatraceComputeContention",
        "cause": "compute_contention",
        "severity": severity,
        "gpu": "0",
        "victim": {"pid": 7, "comm": "server", "workload": workload},
        "aggressors": [{"pid": 9, "comm": "trainer", "share": 1.0}],
        "evidence": {"signal": "wait_per_launch", "unit": "us", "now": 1500.0, "baseline_p99": 1000.0},
        "incident": {"gpu": "0", "cause": "compute_contention", "aggressors": "9:trainer"},
        "started_at": rfc(start),
        "ended_at": rfc(start + duration_s),
        "duration_s": duration_s,
        "reason": "back_to_baseline",
    })
}

/// A month: per day ago, the incidents' tiers. Day 5 has the most (4).
fn month(now: u64) -> Vec<Value> {
    let mut v = Vec::new();
    for (days_ago, tiers) in [
        (2, "p"),
        (5, "ppcw"),
        (20, "p"),
        (11, "c"),
        (25, "c"),
        (1, "w"),
        (3, "w"),
        (4, "w"),
        (6, "ww"),
        (7, "w"),
        (8, "w"),
        (9, "w"),
        (10, "w"),
        (12, "w"),
    ] {
        for (i, t) in tiers.chars().enumerate() {
            let severity = match t {
                'p' => "page",
                'c' => "critical",
                _ => "warning",
            };
            let workload = if i % 2 == 0 {
                "serving/llm"
            } else {
                "batch/etl"
            };
            v.push(incident(
                now,
                workload,
                severity,
                days_ago,
                60 + 600 * i as u64,
            ));
        }
    }
    v.sort_by(|a, b| a["ended_at"].as_str().cmp(&b["ended_at"].as_str()));
    v
}

/// RGB pixels of a PNG file.
fn pixels(path: &std::path::Path) -> (u32, u32, Vec<[u8; 3]>) {
    let decoder = png::Decoder::new(std::io::BufReader::new(
        std::fs::File::open(path).expect("the screenshot"),
    ));
    let mut reader = decoder.read_info().expect("a PNG");
    let mut buf = vec![0; reader.output_buffer_size().expect("a size")];
    let info = reader.next_frame(&mut buf).expect("a frame");
    let n = info.color_type.samples();
    let px = buf[..info.buffer_size()]
        .chunks(n)
        .map(|c| [c[0], c[1], c[2]])
        .collect();
    (info.width, info.height, px)
}

#[test]
fn review_page_renders_its_plots_in_headless_chromium() {
    let Some(env) = env() else { return };
    let dir = TempDir::new("review-html");
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let incidents = month(now);
    let archive = dir.path().join("incidents.jsonl");
    let mut lines = String::new();
    for v in &incidents {
        let _ = writeln!(lines, "{v}");
    }
    std::fs::write(&archive, lines).unwrap();
    let page = dir.path().join("review.html");
    let out = Command::new(&env.bin)
        .args(["review", "--since", "30d", "--archive"])
        .arg(&archive)
        .arg("--html")
        .arg(&page)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.starts_with(
            "review: 18 incidents ended in the last 30days\ntiers: page 4, critical 3, warning 11;"
        ),
        "{stdout}"
    );
    // A page that cannot be written: the review is printed all the same, then one line, exit 1.
    let nowhere = Command::new(&env.bin)
        .args(["review", "--since", "30d", "--archive"])
        .arg(&archive)
        .args(["--html", "/nonexistent-dir/review.html"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&nowhere.stderr);
    assert_eq!(nowhere.status.code(), Some(1), "{err}");
    assert_eq!(nowhere.stdout, out.stdout);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("cannot write /nonexistent-dir/review.html: give --html a file in a folder you can write"), "{err}");
    let html = std::fs::read_to_string(&page).unwrap();
    // Self-contained: nothing to fetch, nothing to run.
    for word in ["src=", "href=", "<script", "url(", "@import"] {
        assert!(!html.contains(word), "the page holds {word}");
    }
    let shot = dir.path().join("review.png");
    let chromium = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--force-device-scale-factor=1",
            "--force-color-profile=srgb",
            "--window-size=1000,1600",
        ])
        .arg(format!(
            "--user-data-dir={}",
            dir.path().join("chromium").display()
        ))
        .arg(format!("--screenshot={}", shot.display()))
        .arg(format!("file://{}", page.display()))
        .output()
        .expect("chromium (scripts/setup.sh installs Debian's)");
    assert!(
        chromium.status.success() && shot.exists(),
        "chromium: {}",
        String::from_utf8_lossy(&chromium.stderr)
    );
    let (w, h, px) = pixels(&shot);
    assert_eq!((w, h), (1000, 1600));
    let count = |rgb: [u8; 3]| px.iter().filter(|p| **p == rgb).count() as f64;
    // The per-day plot: 30 bars over 880 px (29.3 apart, 28.3 wide), 200 px for the busiest
    // day's 4 incidents (50 px each); a 12-px legend square per tier in each of two plots.
    // Page: 4 (day 2, two on day 5, day 20); critical 3; warning 11.
    let bar = 880.0 / 30.0 - 1.0;
    let legend = 2.0 * 144.0;
    for (rgb, n) in TIERS.iter().zip([4.0, 3.0, 11.0]) {
        let want = n * 50.0 * bar + legend;
        let got = count(*rgb);
        eprintln!("e2e review_page: colour {rgb:?}: {got} pixels, the bars' area {want:.0}");
        assert!(
            (got - want).abs() <= 0.06 * want,
            "colour {rgb:?}: {got} pixels, want {want:.0} within 6%"
        );
    }
    // Each of the two rows' medians: 20 px tall, 3 wide (1 to 3 columns exactly its colour).
    let medians = count(MEDIAN);
    eprintln!("e2e review_page: median marks {medians} pixels");
    assert!((2.0 * 20.0..=2.0 * 60.0).contains(&medians), "{medians}");
}

/// Writes `incidents` as an archive in `dir`.
fn archive(dir: &TempDir, incidents: &[Value]) -> std::path::PathBuf {
    let path = dir.path().join("incidents.jsonl");
    let mut lines = String::new();
    for v in incidents {
        let _ = writeln!(lines, "{v}");
    }
    std::fs::write(&path, lines).unwrap();
    path
}

#[test]
fn review_counts_the_incidents_people_silenced_in_alertmanager() {
    let Some(env) = env() else { return };
    let am = integration_tests::servers::Alertmanager::start();
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    // A person silenced serving/llm's contention alerts for an hour from now.
    let silence = json!({
        "matchers": [
            {"name": "alertname", "value": "CudatraceComputeContention", "isRegex": false, "isEqual": true},
            {"name": "workload", "value": "serving/.*", "isRegex": true, "isEqual": true},
        ],
        "startsAt": rfc(now),
        "endsAt": rfc(now + 3_600),
        "createdBy": "sre",
        "comment": "known: the nightly trainer",
    });
    let posted = ureq::post(&format!("{}/api/v2/silences", am.url()))
        .header("content-type", "application/json")
        .send(silence.to_string())
        .map(|mut r| r.body_mut().read_to_string().unwrap_or_default());
    assert!(posted.is_ok(), "{posted:?}");
    let dir = TempDir::new("review-silences");
    let during = |mut v: Value, start: u64, end: u64| {
        v["started_at"] = json!(rfc(start));
        v["ended_at"] = json!(rfc(end));
        v["duration_s"] = json!(end - start);
        v
    };
    let llm = |sev| incident(now, "serving/llm", sev, 0, 60);
    let etl = |sev| incident(now, "batch/etl", sev, 0, 60);
    let mut mitigated = during(etl("page"), now - 7_200, now - 7_000);
    mitigated["mitigation"] = json!([{"action": "cpu_cap", "done": true}]);
    let mut quiet = during(llm("warning"), now - 9_000, now - 8_900);
    quiet["quiet"] = json!({"name": "nightly"});
    let incidents = vec![
        quiet,
        during(llm("warning"), now - 3_600, now - 3_500),
        mitigated,
        // In force during these two: only serving/llm's is silenced.
        during(llm("page"), now - 600, now + 5),
        during(etl("warning"), now - 600, now + 5),
    ];
    let path = archive(&dir, &incidents);
    let out = Command::new(&env.bin)
        .args(["review", "--json", "--archive"])
        .arg(&path)
        .args(["--alertmanager", &am.url()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    eprintln!(
        "e2e review_counts_the_incidents_people_silenced_in_alertmanager: {}",
        r["alertmanager"]
    );
    assert_eq!(
        r["alertmanager"],
        json!({"silences": 1, "unreadable": 0, "silenced": 1, "unacknowledged": 2})
    );
    let silenced: Vec<(&str, u64)> = r["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            (
                row["workload"].as_str().unwrap(),
                row["silenced"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(silenced, vec![("serving/llm", 1), ("batch/etl", 0)]);
    // The terminal's line.
    let text = Command::new(&env.bin)
        .args(["review", "--archive"])
        .arg(&path)
        .args(["--alertmanager", &am.url()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains(
            "alertmanager: 1 silences (0 unreadable); 1 incidents silenced; 2 unacknowledged"
        ),
        "{text}"
    );
    // Nobody answering there is one line and exit 1.
    let gone = Command::new(&env.bin)
        .args(["review", "--archive"])
        .arg(&path)
        .args(["--alertmanager", "http://127.0.0.1:9"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&gone.stderr);
    assert_eq!(gone.status.code(), Some(1), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("cannot read Alertmanager's silences: http://127.0.0.1:9/api/v2/silences"),
        "{err}"
    );
}

/// Seven rises of +20% for 20 minutes at unusual hours over days 2 and 3 after `base`, and a
/// two-fold spike for 30 minutes on day 3: with the defaults, seven warnings and one page.
fn bumpy(base: u64, t: u64) -> f64 {
    let t = t - base;
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
fn review_proposes_changes_measured_on_prometheus_history() {
    let Some(env) = env() else { return };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let base = now / DAY * DAY - 4 * DAY;
    let mut om = String::from("# TYPE cudatrace_signal_value gauge\n");
    let (mut t, mut k) = (base, 0u64);
    while t < base + 4 * DAY {
        // ±2% of deterministic noise.
        let noise = 1.0 + 0.04 * ((k.wrapping_mul(2_654_435_761) % 1000) as f64 / 1000.0 - 0.5);
        let _ = writeln!(
            om,
            "cudatrace_signal_value{{signal=\"wait_per_launch\",workload=\"serving/llm/server\",comm=\"server\",namespace=\"serving\"}} {} {t}",
            bumpy(base, t) * noise
        );
        t += 60;
        k += 1;
    }
    om.push_str("# EOF\n");
    let prom = integration_tests::servers::Prometheus::start_with("", None, Some(&om));
    prom.wait_ready();
    let dir = TempDir::new("review-prometheus");
    let path = archive(
        &dir,
        &[incident(now, "serving/llm/server", "warning", 1, 60)],
    );
    let page = dir.path().join("review.html");
    let out = Command::new(&env.bin)
        .args([
            "review",
            "--since",
            &format!("{}s", now - base),
            "--archive",
        ])
        .arg(&path)
        .args(["--prometheus", &prom.url(), "--step", "60", "--html"])
        .arg(&page)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("e2e review_proposes_changes_measured_on_prometheus_history:\n{stdout}");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.starts_with("replayed on Prometheus's history"))
        .expect("the replay's line");
    assert!(
        lines[at].ends_with("page 1, critical 0, warning 7 fired"),
        "{}",
        lines[at]
    );
    assert_eq!(
        &lines[at + 1..],
        &[
            "proposed: warning at +15% instead of +10%: 7 of 8 incidents gone (page 1 -> 1, critical 0 -> 0, warning 7 -> 0), every page kept",
            "proposed: warning at +20% instead of +10%: 7 of 8 incidents gone (page 1 -> 1, critical 0 -> 0, warning 7 -> 0), every page kept",
            "not proposed: critical at +40% instead of +30%: nothing gone (page 1 -> 1, critical 0 -> 0, warning 7 -> 7)",
            "not proposed: pending after 5 breaching windows instead of 3: nothing gone (page 1 -> 1, critical 0 -> 0, warning 7 -> 7)",
            "not proposed: firing after 60 s instead of 30 s: nothing gone (page 1 -> 1, critical 0 -> 0, warning 7 -> 7)",
            "not proposed: resolved after 120 s without a breach instead of 60 s: nothing gone (page 1 -> 1, critical 0 -> 0, warning 7 -> 7)",
        ]
    );
    // The page draws the workload's history from Prometheus, and says the proposals.
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.contains("serving/llm/server: wait_per_launch (Prometheus), ms"));
    assert_eq!(html.matches("<polyline").count(), 1);
    assert!(html.contains("proposed: warning at +15% instead of +10%"));
}
