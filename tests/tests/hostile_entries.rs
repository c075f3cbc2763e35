//! End-to-end: a tenant parking thousands of threads in driver calls cannot take another
//! tenant's entry slots (finding 3 of the third tenant review: the entry map was a per-CPU LRU
//! of 16,384 slots, so a tenant parking about 100 threads per CPU in probed calls evicted other
//! tenants' long waits, whose returns became uncounted orphans). Now no slot is taken from a
//! live thread, a process holds at most 2,048 and a cgroup 4,096, and a call that found no slot
//! is counted against its own process (`no_slot`). 20 processes of 1,000 threads each, parked
//! in `cuCtxSynchronize` in one cgroup, beside a victim making 1,000 waits of 5 ms each: the
//! victim's 1,000 waits are counted, with no orphan, and every call left untimed is the
//! tenant's.
use std::{path::Path, time::Duration};

use integration_tests::{
    device_file, env, exposition, guards::Cgroup, http, poll, Cudatrace, Scenario, Workload,
};

/// Threads of every process in `cgroup`.
fn threads(cgroup: &Path) -> u64 {
    std::fs::read_to_string(cgroup.join("cgroup.threads"))
        .map(|s| s.lines().count() as u64)
        .unwrap_or(0)
}

#[test]
fn twenty_thousand_parked_threads_leave_a_victims_waits_counted() {
    let Some(env) = env() else { return };
    let (daemon, listen) = Cudatrace::start_daemon_on_loopback(&env, &[], &[]);
    let tenant = Cgroup::new("parking");
    let (tenant_dev, victim_dev) = (device_file("parking"), device_file("parked-victim"));
    // 30 s of device work each (1 ms a block), 1,000 threads waiting on it.
    let parkers: Vec<_> = (0..20)
        .map(|_| {
            Workload::new(&env, Scenario::Named("park", vec![1000, 30_000]))
                .device(&tenant_dev)
                .var("CUDA_STANDIN_NS_PER_BLOCK", "1000000")
                .cgroup(tenant.path())
                .spawn()
        })
        .collect();
    let parked = poll(Duration::from_secs(60), || {
        let n = threads(tenant.path());
        (n >= 20_000).then_some(n)
    });
    // 1,000 waits of 5 ms each (5,000 blocks of 1 us): one after each of 999 launches, and the
    // loop's last.
    let victim = Workload::new(&env, Scenario::Named("loop", vec![60, 5000, 1, 999]))
        .device(&victim_dev)
        .var("CUDA_STANDIN_NS_PER_BLOCK", "1000")
        .run();
    let pid = victim["pid"].as_u64().unwrap().to_string();
    let waits = poll(Duration::from_secs(10), || {
        let samples = exposition::parse(&http::scrape(&listen));
        let n = exposition::sum(
            &samples,
            "cudatrace_calls_total",
            &[("pid", &pid), ("api", "cuStreamSynchronize")],
        );
        (n >= 1000.0).then_some(n)
    });
    let samples = exposition::parse(&http::scrape(&listen));
    let no_slot: Vec<(String, f64)> = samples
        .iter()
        .filter(|s| {
            s.name == "cudatrace_events_dropped_by_process_total" && s.label("reason") == "no_slot"
        })
        .map(|s| (s.label("pid").to_owned(), s.value))
        .collect();
    let parker_pids: Vec<String> = parkers.iter().map(|p| p.pid().to_string()).collect();
    let _ = std::fs::write(tenant.path().join("cgroup.kill"), "1");
    for p in parkers {
        let _ = p.kill();
    }
    let traced = daemon.stop();
    let _ = std::fs::remove_file(&tenant_dev);
    let _ = std::fs::remove_file(&victim_dev);
    let summary = traced.summary();
    let untimed: f64 = no_slot.iter().map(|(_, n)| n).sum();
    eprintln!(
        "e2e twenty_thousand_parked_threads_leave_a_victims_waits_counted: {parked:?} tenant threads parked; the \
         victim's waits in=1000 counted={waits:?}; orphan returns {:?}; calls without a slot {untimed} in {} \
         processes (all the tenant's: {})",
        summary.get("orphan_returns"),
        no_slot.len(),
        no_slot.iter().all(|(p, _)| parker_pids.contains(p))
    );
    assert!(parked.is_some(), "20,000 threads parked");
    assert_eq!(waits, Some(1000.0), "{:?}", traced.stderr);
    assert_eq!(
        summary.get("orphan_returns"),
        Some(&0),
        "{:?}",
        traced.stderr
    );
    // The cgroup's share: past 4,096 slots, its threads' calls are untimed and its own.
    assert!(untimed >= 15_000.0, "{no_slot:?}");
    assert!(
        no_slot.iter().all(|(p, _)| parker_pids.contains(p)),
        "{no_slot:?}"
    );
    assert!(!no_slot.iter().any(|(p, _)| *p == pid));
}
