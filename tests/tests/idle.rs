//! End-to-end: a daemon that traces nothing pays nothing. `cudatrace run` with no process
//! traced makes no wake-up at all (no drain timer, no detection window, no NVML sample: only a
//! scrape or a record wakes it), becomes so again once the last traced process's series are
//! gone, and the first record after such a quiet spell is read at once: every launch counted.
use std::time::{Duration, Instant};

use integration_tests::{
    device_file, env, exposition, guards::TempDir, Cudatrace, Scenario, Workload,
};

/// Context switches (each a wake-up of a sleeping thread, or a preemption) and CPU time (ns) of
/// every thread of `pid` so far.
fn woken_and_cpu(pid: u32) -> (u64, u64) {
    let (mut switches, mut cpu_ns) = (0, 0);
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
        switches += status
            .lines()
            .filter(|l| l.contains("voluntary_ctxt_switches"))
            .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            .sum::<u64>();
        let sched = std::fs::read_to_string(task.path().join("schedstat")).unwrap_or_default();
        cpu_ns += sched
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
    }
    (switches, cpu_ns)
}

/// Wake-ups and CPU (ns) of `pid` over `window`.
fn over(pid: u32, window: Duration) -> (u64, u64) {
    let (w0, c0) = woken_and_cpu(pid);
    std::thread::sleep(window);
    let (w1, c1) = woken_and_cpu(pid);
    (w1 - w0, c1 - c0)
}

fn job(env: &integration_tests::Env, dev: &str, listen: &str) -> Option<f64> {
    let report = Workload::new(
        env,
        Scenario::Basic {
            launches: 3000,
            copies: 0,
        },
    )
    .device(dev)
    .run();
    let pid = report["pid"].as_u64().unwrap().to_string();
    exposition::wait_for_launches(listen, &pid, 3000.0, Duration::from_secs(10))
}

#[test]
fn a_daemon_tracing_nothing_does_not_wake() {
    let Some(env) = env() else { return };
    let dir = TempDir::new("idle");
    let config = dir.write("cudatrace.toml", "retain_exited_s = 1\n");
    let (daemon, listen) =
        Cudatrace::start_daemon_on_loopback(&env, &["--config", config.to_str().unwrap()], &[]);
    let pid = daemon.pid();
    // The drain timer sleeps after 100 ms of nothing.
    std::thread::sleep(Duration::from_millis(1500));
    let (woken, cpu_ns) = over(pid, Duration::from_secs(5));
    // A traced job; then, once its series are gone (1 s after its exit, at the next sweep),
    // quiet again: the first 2 s window with no wake-up, looked for over 20 s.
    let dev = device_file("idle");
    let first = job(&env, &dev, &listen);
    let since = Instant::now();
    let quiet_again = loop {
        if since.elapsed() > Duration::from_secs(20) {
            break None;
        }
        let (w, c) = over(pid, Duration::from_secs(2));
        if w == 0 {
            break Some((since.elapsed(), c));
        }
    };
    // The first records after the quiet spell wake it, and every launch is counted.
    let second = job(&env, &dev, &listen);
    let traced = daemon.stop();
    let _ = std::fs::remove_file(&dev);
    eprintln!(
        "e2e a_daemon_tracing_nothing_does_not_wake: idle 5 s: {woken} wake-ups, {:.3} ms CPU; \
         quiet again after the job: {quiet_again:?}; launches in=3000 counted {first:?}, then {second:?}",
        cpu_ns as f64 / 1e6
    );
    assert_eq!(woken, 0, "{:?}", traced.stderr);
    assert!(cpu_ns < 1_000_000, "{cpu_ns} ns of CPU in 5 s idle");
    assert_eq!(first, Some(3000.0), "{:?}", traced.stderr);
    let (after, cpu) =
        quiet_again.unwrap_or_else(|| panic!("never quiet again: {:?}", traced.stderr));
    assert!(
        cpu < 1_000_000,
        "{cpu} ns of CPU in a quiet 2 s window ({after:?})"
    );
    assert_eq!(second, Some(3000.0), "{:?}", traced.stderr);
    assert_eq!(traced.code, Some(0), "{:?}", traced.stderr);
}
