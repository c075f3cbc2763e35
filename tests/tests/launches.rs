//! End-to-end: `cudatrace run` counts launches in the kernel and writes only a sample of them
//! to the ring buffer; the counts stay exact, and the device time (batch span) works from the batch
//! openers and the waits.
use std::time::{Duration, Instant};

use integration_tests::{
    device_file, env, exposition, guards::TempDir, http, Cudatrace, Scenario, Workload,
};

/// 20,000 launches of two threads: every one counted in the metrics (calls, histogram count),
/// none rate-limited although the record limit is 1,000/s, and only about 1% written as
/// records; each thread's stream batch is closed by the final wait with a device time (batch span).
#[test]
fn launches_are_counted_in_the_kernel_and_sampled() {
    counted_and_sampled(false);
}

/// The same with the uprobe_multi pair (`CUDATRACE_ATTACH=pair`), which samples every 100th.
#[test]
fn launches_are_counted_and_sampled_by_the_pair() {
    counted_and_sampled(true);
}

fn counted_and_sampled(pair: bool) {
    let Some(env) = env() else { return };
    let dir = TempDir::new("launches");
    let vars: &[(&str, &str)] = if pair {
        &[("CUDATRACE_ATTACH", "pair")]
    } else {
        &[]
    };
    let config = dir.write(
        "cudatrace.toml",
        "record_rate_limit = 1000\n[launches]\nslow_us = 0\n",
    );
    let (daemon, listen) =
        Cudatrace::start_daemon_on_loopback(&env, &["--config", config.to_str().unwrap()], vars);
    let dev = device_file("launches");
    let began = Instant::now();
    let report = Workload::new(
        &env,
        Scenario::Basic {
            launches: 20_000,
            copies: 0,
        },
    )
    .threads(2)
    .device(&dev)
    .var("CUDA_STANDIN_NS_PER_BLOCK", "1")
    .run();
    let seconds = began.elapsed().as_secs() + 1;
    let pid = report["pid"].as_u64().unwrap().to_string();
    let counts = integration_tests::poll(Duration::from_secs(10), || {
        let samples = exposition::parse(&http::scrape(&listen));
        let with = [("pid", pid.as_str()), ("api", "cuLaunchKernel")];
        let calls = exposition::sum(&samples, "cudatrace_calls_total", &with);
        let observed = exposition::sum(&samples, "cudatrace_call_duration_seconds_count", &with);
        let limited = exposition::sum(
            &samples,
            "cudatrace_events_dropped_total",
            &[("reason", "rate_limit")],
        );
        (calls == 20_000.0).then_some((calls, observed, limited))
    });
    let traced = daemon.stop();
    let _ = std::fs::remove_file(&dev);
    let summary = traced.summary();
    eprintln!(
        "e2e launches_are_counted_in_the_kernel_and_sampled: launches in=20000 (calls, histogram count, rate-limited)={counts:?} \
         launches_counted={} launch_samples={} events={} in about {seconds} s",
        summary["launches_counted"], summary["launch_samples"], summary["events"]
    );
    assert_eq!(counts, Some((20_000.0, 20_000.0, 0.0)));
    assert_eq!(summary["launches_counted"], 20_000);
    // The first 10 of each second, then 1 in 100; the two batch openers are among the first.
    // Uprobe sessions (this kernel) draw the 1 in 100 at random: binomial, 200 ± 14, so 5
    // standard deviations either side. The pair takes every 100th; its per-second count is
    // shared by the CPUs without atomics (`aggregate::sample`): two launches that race on it
    // can both see a multiple of 100 and both be written, a few more samples (seen: 213 in a
    // second), never a count more or less.
    let samples = summary["launch_samples"];
    let within = if pair {
        200 - 2 * seconds..=200 + 10 * seconds + 8
    } else {
        200 - 70..=200 + 10 * seconds + 70
    };
    assert!(
        within.contains(&samples),
        "{samples} samples in {seconds} s"
    );
    for stream in report["streams"].as_array().unwrap() {
        let (batches, estimate, _) =
            traced.device_time(report["pid"].as_u64().unwrap(), stream.as_u64().unwrap());
        assert_eq!(
            batches, 1,
            "one batch per thread's stream, closed by cuCtxSynchronize"
        );
        assert!(estimate > 0);
    }
}

/// With sampling off, the only launches written are those that open a stream batch: a loop
/// that waits on its stream every 10 launches writes exactly one launch in 10, and every batch
/// gets its device time (batch span).
#[test]
fn only_batch_openers_are_written_when_sampling_is_off() {
    let Some(env) = env() else { return };
    let dir = TempDir::new("openers");
    let config = dir.write(
        "cudatrace.toml",
        "[launches]\nsample_first_per_second = 0\nsample_one_in = 0\nslow_us = 0\n",
    );
    let (daemon, _listen) =
        Cudatrace::start_daemon_on_loopback(&env, &["--config", config.to_str().unwrap()], &[]);
    let dev = device_file("openers");
    let report = Workload::new(
        &env,
        Scenario::Loop {
            seconds: 1.0,
            grid: 1,
            sync_every: 10,
        },
    )
    .device(&dev)
    .var("CUDA_STANDIN_NS_PER_BLOCK", "1")
    .run();
    let traced = daemon.stop();
    let _ = std::fs::remove_file(&dev);
    let (pid, launches) = (
        report["pid"].as_u64().unwrap(),
        report["launches"].as_u64().unwrap(),
    );
    let summary = traced.summary();
    let (batches, estimate, _) = traced.device_time(pid, report["stream"].as_u64().unwrap());
    eprintln!(
        "e2e only_batch_openers_are_written_when_sampling_is_off: launches={launches} syncs={} launches_counted={} \
         launch_samples={} batches={batches} batch_span_ns={estimate}",
        report["syncs"], summary["launches_counted"], summary["launch_samples"]
    );
    assert!(launches >= 100, "{launches} launches in a second");
    assert_eq!(summary["launches_counted"], launches);
    assert_eq!(summary["launch_samples"], launches.div_ceil(10));
    assert_eq!(batches, launches.div_ceil(10));
    assert!(estimate > 0);
}
