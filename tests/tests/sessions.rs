//! End-to-end: uprobe sessions (Linux 6.13+, this machine's kernel) against the uprobe_multi
//! pair (`CUDATRACE_ATTACH=pair`), on the same workloads: counts exact on both; with sessions
//! only the sampled launches (and batch openers) pay the return probe, the rest are counted
//! untimed, and the p99 read from the sample is within 5% of the pair's, which times every
//! launch, on a workload whose slow launches come at random and on one where they come every
//! 50th launch (which sampling every n-th launch would alias with).
use std::time::Duration;

use integration_tests::{device_file, env, exposition, http, Cudatrace, Env, Scenario, Workload};

const LAUNCHES: u64 = 300_000;

/// What one traced run of the workload showed.
#[derive(Debug)]
struct Seen {
    /// How launches were probed (the summary's `launch_probes`).
    probes: String,
    calls: f64,
    untimed: f64,
    p99_s: f64,
    samples: u64,
}

/// `LAUNCHES` launches of 2 µs, one in 50 ten times as slow (`slow`: the standin's variable
/// and its value), traced with `CUDATRACE_ATTACH=attach` (empty: the default).
fn traced(env: &Env, attach: &str, slow: (&str, &str), name: &str) -> Seen {
    let vars: Vec<(&str, &str)> = if attach.is_empty() {
        Vec::new()
    } else {
        vec![("CUDATRACE_ATTACH", attach)]
    };
    let (daemon, listen) = Cudatrace::start_daemon_on_loopback(env, &[], &vars);
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
    let probes = traced
        .log_events("summary")
        .last()
        .and_then(|r| r["launch_probes"].as_str())
        .unwrap_or_default()
        .to_owned();
    Seen {
        probes,
        calls,
        untimed,
        p99_s,
        samples: traced.summary()["launch_samples"],
    }
}

/// Sessions and the pair, one after the other on the same workload.
fn compare(slow: (&str, &str), name: &str) {
    let Some(env) = env() else { return };
    let session = traced(&env, "", slow, name);
    let pair = traced(&env, "pair", slow, name);
    let error = (session.p99_s - pair.p99_s).abs() / pair.p99_s;
    eprintln!(
        "e2e sessions {name}: launches in={LAUNCHES} session={session:?} pair={pair:?} p99 error={:.2}%",
        error * 100.0
    );
    assert_eq!(session.probes, "uprobe_session");
    assert_eq!(pair.probes, "uprobe_multi_pair");
    assert_eq!(
        (session.calls, pair.calls),
        (LAUNCHES as f64, LAUNCHES as f64)
    );
    // Every launch the return did not see was counted untimed, and only those.
    assert_eq!(session.untimed, (LAUNCHES - session.samples) as f64);
    assert_eq!(pair.untimed, 0.0);
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
