//! End-to-end: the pair's windows (`CUDATRACE_ATTACH=pair`, as on kernels without uprobe
//! sessions) cut the returns of launches still in the driver when a window closes, unless
//! another window is open when they return; a cut one is counted at its thread's next call (or
//! its exit), untimed, so counts stay exact. Six slow jobs enter their first launch (1.2 to
//! 2.7 s long) while the windows are open (nothing else runs); then a fast job raises the node's
//! launch rate above the windows' threshold, and the windows' ends cut the launches that return
//! while no window is open (each about three times in four).
use std::time::Duration;

use integration_tests::{device_file, env, exposition, http, Cudatrace, Scenario, Workload};

const FAST: u64 = 5_000_000;
/// Launches of each slow job.
const SLOW: u64 = 2;

#[test]
fn launches_cut_by_a_window_are_counted_once() {
    let Some(env) = env() else { return };
    let (daemon, listen) =
        Cudatrace::start_daemon_on_loopback(&env, &[], &[("CUDATRACE_ATTACH", "pair")]);
    let dev = device_file("windows");
    let slow: Vec<_> = (0..6u64)
        .map(|i| {
            let ns = (1_200_000_000 + i * 300_000_000).to_string();
            Workload::new(&env, Scenario::Calls(SLOW))
                .device(&dev)
                .var("CUDA_STANDIN_CALL_NS", "0")
                .var("CUDA_STANDIN_LAUNCH_NS", &ns)
                .var("CUDA_STANDIN_NS_PER_BLOCK", "0")
                .spawn()
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let fast = Workload::new(&env, Scenario::Calls(FAST))
        .device(&dev)
        .var("CUDA_STANDIN_CALL_NS", "0")
        .var("CUDA_STANDIN_NS_PER_BLOCK", "0")
        .spawn();
    let fast_pid = fast.pid().to_string();
    let slow_pids: Vec<String> = slow.iter().map(|w| w.pid().to_string()).collect();
    let made: Vec<u64> = slow
        .into_iter()
        .map(|w| w.finish()["calls"].as_u64().unwrap_or(0))
        .collect();
    let fast_made = fast.finish()["calls"].as_u64();
    let of = |samples: &[exposition::Sample], pid: &str, name: &str| {
        exposition::sum(samples, name, &[("pid", pid), ("api", "cuLaunchKernel")])
    };
    let seen = integration_tests::poll(Duration::from_secs(15), || {
        let samples = exposition::parse(&http::scrape(&listen));
        let fast = of(&samples, &fast_pid, "cudatrace_calls_total");
        let slow: Vec<f64> = slow_pids
            .iter()
            .map(|p| of(&samples, p, "cudatrace_calls_total"))
            .collect();
        let untimed: f64 = slow_pids
            .iter()
            .map(|p| of(&samples, p, "cudatrace_calls_untimed_total"))
            .sum();
        (fast == FAST as f64 && slow.iter().all(|c| *c == SLOW as f64))
            .then_some((fast, slow, untimed))
    });
    let traced = daemon.stop();
    let _ = std::fs::remove_file(&dev);
    let summary = traced.summary();
    eprintln!(
        "e2e windows: launches in fast={fast_made:?} slow={made:?} seen (fast, slow each, slow untimed)={seen:?} \
         windows_closed={} counted_late={} orphan_returns={}",
        summary["windows_closed"], summary["counted_late"], summary["orphan_returns"],
    );
    assert_eq!((fast_made, made), (Some(FAST), vec![SLOW; 6]));
    let (_, _, untimed) = seen.expect("every launch counted, once");
    assert!(summary["windows_closed"] >= 2, "{summary:?}");
    // Some first launch returned while no window was open: counted late, untimed.
    assert!(summary["counted_late"] >= 1, "{summary:?}");
    assert!(
        untimed >= summary["counted_late"] as f64,
        "{untimed} untimed"
    );
    assert_eq!(summary["orphan_returns"], 0);
}
