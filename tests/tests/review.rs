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
