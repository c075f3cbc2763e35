//! End-to-end: device memory beyond `cuMemAlloc` is in the gauge. A process holding memory
//! through VMM handles (`cuMemCreate`), a pool (`cuMemAllocFromPoolAsync`), managed memory or
//! pitched rows shows exactly the bytes it holds in `cudatrace_device_memory_bytes` (releases:
//! `coverage.rs`; out of memory and leaks under VMM: `failures.rs`).
use std::time::Duration;

use integration_tests::{device_file, env, exposition, http, poll, Cudatrace, Scenario, Workload};

const MIB: u64 = 1 << 20;
/// The workload's set-up: two 4 KiB buffers through `cuMemAlloc_v2`.
const SETUP: u64 = 8192;

#[test]
fn every_kind_of_allocation_is_in_the_gauge() {
    let Some(env) = env() else { return };
    let (daemon, listen) = Cudatrace::start_daemon_on_loopback(&env, &[], &[]);
    let dev = device_file("kinds");
    let mut seen = Vec::new();
    for (kind, api) in [
        ("vmm", "cuMemCreate"),
        ("pool", "cuMemAllocFromPoolAsync"),
        ("managed", "cuMemAllocManaged"),
        ("pitch", "cuMemAllocPitch_v2"),
    ] {
        // Four allocations of 64 MiB, held for 20 s.
        let job = Workload::new(
            &env,
            Scenario::Allocs {
                bytes: 64 * MIB,
                n: 4,
                hold_s: 20.0,
            },
        )
        .device(&dev)
        .var("WORKLOAD_ALLOC", kind)
        .spawn();
        let pid = job.pid().to_string();
        let want = (4 * 64 * MIB + SETUP) as f64;
        let held = poll(Duration::from_secs(10), || {
            let m = exposition::parse(&http::scrape(&listen));
            let held = exposition::sum(&m, "cudatrace_device_memory_bytes", &[("pid", &pid)]);
            let calls =
                exposition::sum(&m, "cudatrace_calls_total", &[("pid", &pid), ("api", api)]);
            (held == want && calls == 4.0).then_some(held)
        });
        drop(job);
        seen.push((kind, held));
    }
    let traced = daemon.stop();
    let _ = std::fs::remove_file(&dev);
    eprintln!("e2e every_kind_of_allocation_is_in_the_gauge: (kind, bytes held) = {seen:?}");
    let want = Some((4 * 64 * MIB + SETUP) as f64);
    assert_eq!(
        seen,
        vec![
            ("vmm", want),
            ("pool", want),
            ("managed", want),
            ("pitch", want)
        ],
        "{:?}",
        traced.stderr
    );
}
