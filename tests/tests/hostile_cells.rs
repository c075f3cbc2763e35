//! End-to-end: one tenant cannot take the in-kernel launch map from the others. A process that
//! launches with endless made-up kernel handles makes at most its quota of cells
//! (`[launches] cells_per_process`, 16,384 by default); its later launches are counted in its
//! overflow cell, so a victim beside it keeps its cells, and with a record rate limit on, loses
//! none of its launches to it (finding 9 of the second tenant review: 999 of 20,000 counted).
use std::time::Duration;

use integration_tests::{
    device_file, env, exposition, guards::TempDir, http, poll, Cudatrace, Scenario, Workload,
};

#[test]
fn one_process_cannot_take_every_launch_cell() {
    let Some(env) = env() else { return };
    let dir = TempDir::new("cells");
    let config = dir.write("cudatrace.toml", "record_rate_limit = 1000\n");
    let (daemon, listen) =
        Cudatrace::start_daemon_on_loopback(&env, &["--config", config.to_str().unwrap()], &[]);
    let hog = Workload::new(
        &env,
        Scenario::Handles {
            launches: 150_000,
            hold_s: 30.0,
        },
    )
    .spawn();
    let hog_pid = hog.pid().to_string();
    let launches = |samples: &[exposition::Sample], pid: &str| {
        exposition::sum(
            samples,
            "cudatrace_calls_total",
            &[("pid", pid), ("api", "cuLaunchKernel")],
        )
    };
    let hogged = poll(Duration::from_secs(30), || {
        let samples = exposition::parse(&http::scrape(&listen));
        (launches(&samples, &hog_pid) == 150_000.0).then_some(())
    });
    assert!(
        hogged.is_some(),
        "the hog's 150,000 launches were not all counted: {:?}",
        daemon.stderr_now()
    );
    // While the hog holds its cells, a victim makes 20,000 launches in well under a second.
    let dev = device_file("cells");
    let victim = Workload::new(
        &env,
        Scenario::Basic {
            launches: 20_000,
            copies: 0,
        },
    )
    .device(&dev)
    .var("CUDA_STANDIN_NS_PER_BLOCK", "1")
    .run();
    let victim_pid = victim["pid"].as_u64().unwrap().to_string();
    let settled = poll(Duration::from_secs(10), || {
        let samples = exposition::parse(&http::scrape(&listen));
        let counts = (
            launches(&samples, &victim_pid),
            exposition::sum(
                &samples,
                "cudatrace_events_dropped_by_process_total",
                &[("pid", &victim_pid), ("reason", "rate_limit")],
            ),
            launches(&samples, &hog_pid),
            exposition::sum(
                &samples,
                "cudatrace_table_overflows_total",
                &[("table", "launch_cells")],
            ),
        );
        (counts.0 == 20_000.0).then_some(counts)
    });
    drop(hog);
    let traced = daemon.stop();
    let _ = std::fs::remove_file(&dev);
    let summary = traced.summary();
    eprintln!(
        "e2e one_process_cannot_take_every_launch_cell: (victim launches, victim rate-limited, hog launches, launches in overflow cells) = {settled:?}; \
         launches_counted={} launch_samples={} rate_limited={} dropped={}",
        summary["launches_counted"], summary["launch_samples"], summary["rate_limited"], summary["dropped"]
    );
    let settled =
        settled.unwrap_or_else(|| panic!("the victim's 20,000 launches: {:?}", traced.stderr));
    // The hog's first 16,384 handles have their own cells; the other 133,616 launches are
    // counted in its overflow cell. Every launch of both is counted in the kernel.
    assert_eq!(settled, (20_000.0, 0.0, 150_000.0, 133_616.0));
    // Samples of the hog past 1,000 a second may be rate-limited (its launches are counted
    // in its cells all the same); none of the victim's.
    assert_eq!(
        (summary["launches_counted"], summary["dropped"]),
        (170_000, 0)
    );
}
