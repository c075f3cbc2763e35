//! End-to-end: restart loops are crashes only. Forty short jobs of one executable, eight at a
//! time, each finishing its work (exit 0), raise no loop, and every one of their statuses is
//! read; then five crashes in a row (exit 3) do.
use std::time::{Duration, Instant};

use integration_tests::{
    alerting::{daemon_with_hook, looping, FAST},
    device_file, env,
    guards::TempDir,
    servers::Webhook,
};
use serde_json::Value;

#[test]
fn finishing_jobs_are_no_restart_loop_and_crashes_are() {
    let Some(env) = env() else { return };
    let hook = Webhook::start();
    let dir = TempDir::new("batch-jobs");
    let (daemon, _listen) = daemon_with_hook(&env, &dir, FAST, &hook, None);
    let dev = device_file("batch-jobs");
    let job = |seconds: f64| looping(&env, seconds, 1, 1).comm("batch-job").device(&dev);
    let started = Instant::now();
    let mut finished = 0;
    for _ in 0..5 {
        let round: Vec<_> = (0..8).map(|_| job(1.0).spawn()).collect();
        for j in round {
            assert_eq!(j.status().code(), Some(0));
            finished += 1;
        }
    }
    assert_eq!(finished, 40);
    // Two windows and more for the exits to be counted.
    std::thread::sleep(Duration::from_secs(12));
    let loops = |v: &Value| v["alert"] == "CudatraceRestartLoop";
    let early: Vec<Value> = hook.received().into_iter().filter(|v| loops(v)).collect();
    assert!(early.is_empty(), "finishing jobs raised {early:?}");
    let restarts = daemon
        .stderr_now()
        .iter()
        .filter(|l| l.contains("restart: pid="))
        .count();
    assert_eq!(restarts, 0, "finished jobs counted as restarts");
    eprintln!(
        "e2e finishing_jobs_are_no_restart_loop_and_crashes_are: 40 finished jobs in {:.1} s, 0 restarts, 0 loops",
        started.elapsed().as_secs_f64()
    );

    // Five crashes in a row, each after a second of work, then a sixth start.
    let crasher = |seconds: f64| looping(&env, seconds, 1, 1).comm("crasher").device(&dev);
    for _ in 0..5 {
        assert_eq!(crasher(1.0).exit_code(3).spawn().status().code(), Some(3));
    }
    let last = crasher(60.0).spawn();
    let firing = hook.wait_for(Duration::from_secs(15), |v: &Value| {
        loops(v) && v["state"] == "firing" && v["victim"]["comm"] == "crasher"
    });
    let firing = firing
        .unwrap_or_else(|| panic!("no restart loop after five crashes: {:?}", hook.received()));
    let exits: Vec<&str> = firing["evidence"]["exit_statuses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    assert!(
        exits.len() >= 3 && exits.iter().all(|e| *e == "exit 3"),
        "{firing}"
    );
    assert_eq!(firing["victim"]["pid"].as_u64(), Some(last.pid()));
    // Nothing of the finished jobs' workload was ever called a loop.
    assert!(!hook
        .received()
        .iter()
        .any(|v| loops(v) && v["victim"]["comm"] == "batch-job"));
    drop(last);
    let _ = daemon.stop();
}
