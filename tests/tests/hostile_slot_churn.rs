//! End-to-end (issue 56, items 2 and 3): the entry slots' share counters drain as fast as they
//! fill, and no share hides a process's launches. Measured before: after 16,400 short-lived
//! cgroups each made one driver call, a job in a new cgroup was counted 0 of 5,000, silently
//! (the per-cgroup counters were never deleted, and the map filled; a thread that moved to
//! another cgroup gave its slot back to that one); a process that parked
//! 2,100 threads in driver calls (its 2,048-slot share) launched uncounted from a new thread.
use std::time::Duration;

use integration_tests::{
    device_file, env, exposition, guards::Cgroup, http, poll, Cudatrace, Scenario, Workload,
};

/// `name`'s samples summed, with `labels`, at `listen`.
fn metric(listen: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    exposition::sum(&exposition::parse(&http::scrape(listen)), name, labels)
}

/// Polls until `pid`'s calls of `api` reach `want` (10 s at most); what was counted last.
fn calls(listen: &str, pid: &str, api: &str, want: f64) -> f64 {
    let labels = [("pid", pid), ("api", api)];
    poll(Duration::from_secs(10), || {
        let n = metric(listen, "cudatrace_calls_total", &labels);
        (n >= want).then_some(n)
    })
    .unwrap_or_else(|| metric(listen, "cudatrace_calls_total", &labels))
}

#[test]
fn sixteen_thousand_cgroups_and_leader_first_processes_leave_every_slot_drained() {
    let Some(env) = env() else { return };
    const N: u64 = 16_400;
    const MIGRATED: u64 = 2_000;
    let (daemon, listen) = Cudatrace::start_daemon_on_loopback(&env, &[], &[]);
    let dev = device_file("slot-churn");
    let base = Cgroup::top("churn");
    let started = std::time::Instant::now();
    let cgroups = Workload::new(&env, Scenario::Named("churn-cgroups", vec![N]))
        .device(&dev)
        .var("WORKLOAD_CGROUP_BASE", base.path().to_str().unwrap())
        .run();
    let leader_first = Workload::new(&env, Scenario::Named("churn-leader-first", vec![N]))
        .device(&dev)
        .run();
    // Slots taken in one cgroup, given back from another (the thread moved itself).
    let migrated = Workload::new(&env, Scenario::Named("churn-migrate", vec![MIGRATED]))
        .device(&dev)
        .var("WORKLOAD_CGROUP_BASE", base.path().to_str().unwrap())
        .run();
    let churn_s = started.elapsed().as_secs_f64();
    assert_eq!(cgroups["ok"].as_u64(), Some(N), "{cgroups}");
    assert_eq!(leader_first["ok"].as_u64(), Some(N), "{leader_first}");
    assert_eq!(migrated["ok"].as_u64(), Some(MIGRATED), "{migrated}");
    // A job in a cgroup never seen: every one of its copies timed (one record each, which
    // needs a slot), and its launches counted.
    let job_cg = Cgroup::top("churn-job");
    let job = Workload::new(&env, Scenario::CopyCalls(2000))
        .device(&dev)
        .cgroup(job_cg.path())
        .run();
    let pid = job["pid"].as_u64().unwrap().to_string();
    let timed = calls(&listen, &pid, "cuMemcpyHtoD_v2", 2000.0);
    let launches = Workload::new(
        &env,
        Scenario::Basic {
            launches: 5000,
            copies: 0,
        },
    )
    .device(&dev)
    .cgroup(job_cg.path())
    .run();
    let launch_pid = launches["pid"].as_u64().unwrap().to_string();
    let counted = calls(&listen, &launch_pid, "cuLaunchKernel", 5000.0);
    let traced = daemon.stop();
    let _ = std::fs::remove_file(&dev);
    let summary = traced.summary();
    eprintln!(
        "e2e slot churn: {N} processes in cgroups of their own, {N} leader-first processes and {MIGRATED} that moved to another cgroup after their call, in {churn_s:.1} s; \
         then a job in a new cgroup: copies in=2000 timed={timed}, launches in=5000 counted={counted}; \
         at stop: slot_processes={} slot_cgroups={} inflight_entries={}",
        summary["slot_processes"], summary["slot_cgroups"], summary["inflight_entries"]
    );
    assert_eq!(timed, 2000.0);
    assert_eq!(counted, 5000.0);
    // Every share counter is gone with what it counted.
    assert_eq!(summary["slot_processes"], 0, "{summary:?}");
    assert_eq!(summary["slot_cgroups"], 0, "{summary:?}");
    assert_eq!(summary["inflight_entries"], 0, "{summary:?}");
}

#[test]
fn launches_behind_2100_parked_threads_are_counted() {
    let Some(env) = env() else { return };
    let (daemon, listen) = Cudatrace::start_daemon_on_loopback(&env, &[], &[]);
    let dev = device_file("parked-launches");
    // 2,100 threads parked in cuCtxSynchronize on 3 s of device work (past the 2,048 slots of
    // the process's share), then 5,000 launches from a new thread, which has no slot.
    let report = Workload::new(&env, Scenario::Named("park", vec![2100, 3000]))
        .device(&dev)
        .var("CUDA_STANDIN_NS_PER_BLOCK", "1000000")
        .var("WORKLOAD_PARKED_LAUNCHES", "5000")
        .run();
    assert_eq!(report["threads"].as_u64(), Some(2100), "{report}");
    let pid = report["pid"].as_u64().unwrap().to_string();
    // The first launch (before parking, with a slot) and the 5,000 without one.
    let counted = calls(&listen, &pid, "cuLaunchKernel", 5001.0);
    let traced = daemon.stop();
    let _ = std::fs::remove_file(&dev);
    let summary = traced.summary();
    eprintln!(
        "e2e parked launches: 2100 threads parked; launches in=5001 counted={counted}; counted without a slot {}",
        summary["counted_unslotted"]
    );
    assert_eq!(counted, 5001.0);
    assert_eq!(summary["counted_unslotted"], 5000, "{summary:?}");
}
