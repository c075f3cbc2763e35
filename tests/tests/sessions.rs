//! End-to-end: uprobe sessions (Linux 6.13+, this machine's kernel) and the uprobe_multi pair's
//! windows (`CUDATRACE_ATTACH=pair`) against the pair with its returns always attached
//! (`CUDATRACE_PAIR_WINDOWS=off` too), on the same workloads: counts exact on all three; with
//! sessions only the sampled launches (and batch openers) pay the return probe, with windows
//! only those inside a window, the rest are counted untimed; and the p99 read from either
//! sample is within 5% of the full pair's, which times every launch, on a workload whose slow
//! launches come at random and on one where they come every 50th launch (which sampling every
//! n-th launch would alias with).
use std::time::Duration;

use integration_tests::{device_file, env, exposition, http, Cudatrace, Env, Scenario, Workload};

const LAUNCHES: u64 = 300_000;

/// What one traced run of the workload showed.
#[derive(Debug)]
struct Seen {
    /// How launches were probed (the summary's `launch_probes`).
    probes: String,
    /// Windows of the pair closed (the summary's `windows_closed`).
    windows: u64,
    /// Returns with no entry to pair with (the summary's `orphan_returns`).
    orphans: u64,
    calls: f64,
    untimed: f64,
    p99_s: f64,
    samples: u64,
}

/// `LAUNCHES` launches of 2 µs, one in 50 ten times as slow (`slow`: the standin's variable
/// and its value), traced with the variables `vars`.
fn traced(env: &Env, vars: &[(&str, &str)], slow: (&str, &str), name: &str) -> Seen {
    let (daemon, listen) = Cudatrace::start_daemon_on_loopback(env, &[], vars);
    let dev = device_file(name);
    let report = Workload::new(
        env,
        Scenario::Basic {
            launches: LAUNCHES,
            copies: 0,
        },
    )
    .device(&dev)
    .var("CUDA_STANDIN_CALL_NS", "2000")
    .var("CUDA_STANDIN_NS_PER_BLOCK", "1")
    .var(slow.0, slow.1)
    .run();
    let pid = report["pid"].as_u64().unwrap().to_string();
    let with = [("pid", pid.as_str()), ("api", "cuLaunchKernel")];
    let seen = integration_tests::poll(Duration::from_secs(15), || {
        let samples = exposition::parse(&http::scrape(&listen));
        let calls = exposition::sum(&samples, "cudatrace_calls_total", &with);
        let untimed = exposition::sum(&samples, "cudatrace_calls_untimed_total", &with);
        let p99 = exposition::sum(
            &samples,
            "cudatrace_call_duration_quantile_seconds",
            &[
                ("pid", pid.as_str()),
                ("api", "cuLaunchKernel"),
                ("window", "all"),
                ("q", "0.99"),
            ],
        );
        (calls == LAUNCHES as f64).then_some((calls, untimed, p99))
    });
    let traced = daemon.stop();
    let _ = std::fs::remove_file(&dev);
    let (calls, untimed, p99_s) =
        seen.unwrap_or_else(|| panic!("{LAUNCHES} launches not all counted"));
    let summary = traced.log_events("summary").last().copied().cloned();
    let summary = summary.unwrap_or_default();
    Seen {
        probes: summary["launch_probes"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        windows: summary["windows_closed"].as_u64().unwrap_or(u64::MAX),
        orphans: summary["orphan_returns"].as_u64().unwrap_or(u64::MAX),
        calls,
        untimed,
        p99_s,
        samples: traced.summary()["launch_samples"],
    }
}

/// Sessions, the pair's windows and the full pair, one after the other on the same workload.
fn compare(slow: (&str, &str), name: &str) {
    let Some(env) = env() else { return };
    let session = traced(&env, &[], slow, name);
    let windows = traced(&env, &[("CUDATRACE_ATTACH", "pair")], slow, name);
    let off = [
        ("CUDATRACE_ATTACH", "pair"),
        ("CUDATRACE_PAIR_WINDOWS", "off"),
    ];
    let pair = traced(&env, &off, slow, name);
    let error = (session.p99_s - pair.p99_s).abs() / pair.p99_s;
    let windows_error = (windows.p99_s - pair.p99_s).abs() / pair.p99_s;
    eprintln!(
        "e2e sessions {name}: launches in={LAUNCHES} session={session:?} windows={windows:?} \
         pair={pair:?} p99 error: sessions {:.2}%, windows {:.2}%",
        error * 100.0,
        windows_error * 100.0
    );
    assert_eq!(session.probes, "uprobe_session");
    assert_eq!(
        (windows.probes.as_str(), pair.probes.as_str()),
        ("uprobe_multi_pair", "uprobe_multi_pair")
    );
    assert_eq!(
        (session.calls, windows.calls, pair.calls),
        (LAUNCHES as f64, LAUNCHES as f64, LAUNCHES as f64)
    );
    // Every launch the return did not see was counted untimed, and only those.
    assert_eq!(session.untimed, (LAUNCHES - session.samples) as f64);
    assert_eq!((pair.untimed, pair.windows, session.windows), (0.0, 0, 0));
    // A return that a window's opening let run after its entry counted the launch is no orphan.
    assert_eq!((session.orphans, windows.orphans, pair.orphans), (0, 0, 0));
    // Windows closed, and the launches made outside them were counted untimed: some, not all.
    assert!(windows.windows >= 1, "{windows:?}");
    assert!(
        windows.untimed > 0.0 && windows.untimed < LAUNCHES as f64,
        "{windows:?}"
    );
    assert!(
        windows_error <= 0.05,
        "p99 {} s in windows, {} s timed",
        windows.p99_s,
        pair.p99_s
    );
    // About 1 in 100 sampled (binomial: 3,000 ± 55), plus the first 10 of each second.
    assert!(
        (2_700..=3_600).contains(&session.samples),
        "{} samples",
        session.samples
    );
    // The slow launches (2%) hold the p99; the sample finds it within 5%.
    assert!(pair.p99_s > 15e-6, "p99 {} s", pair.p99_s);
    assert!(
        error <= 0.05,
        "p99 {} s sampled, {} s timed",
        session.p99_s,
        pair.p99_s
    );
}

#[test]
fn random_slow_launches_keep_their_p99() {
    compare(("CUDA_STANDIN_OUTLIER_PPM", "20000"), "sessions-random");
}

#[test]
fn periodic_slow_launches_keep_their_p99() {
    compare(("CUDA_STANDIN_OUTLIER_EVERY", "50"), "sessions-periodic");
}
