//! End-to-end: a tenant that asks `cuGetProcAddress_v2` for the same entry point in a loop,
//! with a /proc/PID/maps of 20,000 mappings, costs the agent one read of its maps, not one per
//! call: each answer a process gets is checked against the probes once per name.
use std::time::{Duration, Instant};

use integration_tests::{cpu_seconds, env, exposition, http, Cudatrace, Scenario, Workload};

#[test]
fn a_cu_get_proc_address_flood_over_a_long_maps_file_stays_cheap() {
    let Some(env) = env() else { return };
    let (daemon, listen) = Cudatrace::start_daemon_on_loopback(&env, &[], &[]);
    let cpu_before = cpu_seconds(daemon.pid());
    const LOOKUPS: u64 = 20_000;
    let tenant = Workload::new(&env, Scenario::Named("resolve", vec![LOOKUPS, 20_000])).spawn();
    // Scrapes answer while the flood is read.
    let mut slowest = Duration::ZERO;
    let pid = tenant.pid().to_string();
    let seen = integration_tests::poll(Duration::from_secs(60), || {
        let t = Instant::now();
        let samples = exposition::parse(&http::scrape(&listen));
        slowest = slowest.max(t.elapsed());
        let n = exposition::sum(
            &samples,
            "cudatrace_calls_total",
            &[("pid", pid.as_str()), ("api", "cuGetProcAddress_v2")],
        );
        (n == LOOKUPS as f64).then_some(n)
    });
    let report = tenant.finish();
    let cpu = cpu_seconds(daemon.pid()) - cpu_before;
    let traced = daemon.stop();
    eprintln!(
        "e2e a_cu_get_proc_address_flood_over_a_long_maps_file_stays_cheap: {LOOKUPS} lookups over {} mappings in {} s; \
         traced {seen:?}; agent CPU {cpu:.2} s; slowest scrape {slowest:?}",
        report["mappings"], report["seconds"]
    );
    assert_eq!(seen, Some(LOOKUPS as f64), "every lookup traced");
    assert!(cpu < 3.0, "the agent spent {cpu:.2} s of CPU");
    assert!(
        slowest < Duration::from_secs(1),
        "a scrape took {slowest:?}"
    );
    assert!(
        !traced
            .stderr
            .iter()
            .any(|l| l.contains("not a probed entry point")),
        "the stand-in hands out its exported cuLaunchKernel: {:?}",
        traced.stderr
    );
}
