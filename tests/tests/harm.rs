//! End-to-end (issue 44, "do no harm"): a traced process is unharmed. More threads than cores
//! call every probed family of the stand-in through a thunk that loads every callee-saved
//! register and the floating-point control register with a pattern and checks them and each
//! result after the call; SIGPROF at 2 kHz; a fork every 200 ms whose child makes checked calls;
//! the library unmapped and mapped again every second; meanwhile cudatrace is attached and
//! detached ten times, and after each detach every probed address of the live process holds the
//! file's bytes again.
use std::time::{Duration, Instant};

use integration_tests::{
    env, exposition, http,
    sites::{altered_sites, objdump_paths, probed_offsets},
    Cudatrace, Scenario, Workload,
};

/// Bytes equal to the file's at every probed address of `pid` (retried while a remap is under way).
fn assert_nothing_left(
    pid: u64,
    lib: &std::path::Path,
    offsets: &[(&'static str, u64)],
    after: &str,
) {
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        match altered_sites(pid, lib, offsets) {
            Some(altered) => {
                assert_eq!(altered, Vec::<String>::new(), "bytes left behind {after}");
                return;
            }
            None if Instant::now() < until => std::thread::sleep(Duration::from_millis(20)),
            None => panic!("the library stayed unmapped in {pid} {after}"),
        }
    }
}

#[test]
fn a_traced_process_is_unharmed_through_attaches_forks_signals_and_remaps() {
    let Some(env) = env() else { return };
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let threads = (2 * cores + 1).min(64) as u32;
    // At most: the test ends it (SIGUSR1) once it is done attaching.
    const SECONDS: u64 = 300;
    const CYCLES: usize = 10;
    let lib = env.libcuda();
    let offsets = probed_offsets(&lib);
    assert_eq!(
        offsets.len(),
        tracer_common::Api::ALL.len(),
        "the stand-in exports every entry point"
    );
    let mut workload = Workload::new(&env, Scenario::Named("harm", vec![SECONDS]))
        .threads(threads)
        .spawn();
    let pid = workload.pid();
    let began = Instant::now();
    let mut hits_per_cycle = Vec::new();
    for cycle in 0..CYCLES {
        let (daemon, listen) = Cudatrace::start_daemon_on_loopback(&env, &[], &[]);
        if cycle == 0 {
            // The sites by path, exactly as objdump's disassembly says them.
            let samples = exposition::parse(&http::scrape(&listen));
            let path = |p: &str| {
                exposition::sum(
                    &samples,
                    "cudatrace_probe_sites",
                    &[("arch", "x86_64"), ("path", p)],
                ) as u64
            };
            let want = objdump_paths(&lib);
            assert_eq!((path("emulated"), path("stepped")), want, "sites by path");
            eprintln!(
                "e2e harm: sites {} emulated, {} stepped (as objdump says)",
                want.0, want.1
            );
        }
        if cycle == 1 {
            // The code check's control: while attached, the breakpoints show (a cycle after
            // the first, when the workload surely runs its loop).
            // SAFETY: kill only sends a signal to the workload, a child this test started.
            unsafe { libc::kill(pid as i32, libc::SIGWINCH) };
        }
        std::thread::sleep(Duration::from_millis(1200));
        let stopping = Instant::now();
        let traced = daemon.stop();
        let stop_s = stopping.elapsed().as_secs_f64();
        let s = traced.summary();
        // Calls seen: every record, less the launches among them, plus the launches counted.
        hits_per_cycle.push(s["events"] - s["launch_samples"] + s["launches_counted"]);
        assert!(
            stop_s < 1.0,
            "cycle {cycle}: SIGTERM to exit took {stop_s:.2} s under the load"
        );
        assert_nothing_left(pid, &lib, &offsets, &format!("after detach {cycle}"));
        // And the workload's own look at its code (the check the arm64 VM runs).
        // SAFETY: kill only sends a signal to the workload, a child this test started.
        unsafe { libc::kill(pid as i32, libc::SIGUSR2) };
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            !workload.exited(),
            "the workload ended before cycle {cycle} did"
        );
    }
    let cycles_s = began.elapsed().as_secs_f64();
    // SAFETY: kill only sends a signal to the workload, a child this test started.
    unsafe { libc::kill(pid as i32, libc::SIGUSR1) };
    let r = workload.finish();
    let n = |k: &str| r[k].as_u64().unwrap_or_else(|| panic!("{k} in {r}"));
    let hits: u64 = hits_per_cycle.iter().sum();
    eprintln!(
        "e2e harm: {} threads on {cores} cores, {:.0} s: {} checked calls ({} in {} forked children), \
         {hits} probe hits in {CYCLES} attach cycles ({hits_per_cycle:?}, {cycles_s:.1} s), {} remaps ({} unmapped), \
         {} SIGPROF ({:.0}/s); mismatches {}, bad results {}, abnormal exits {}; code bytes differing from the file: {} after {} detaches, {} while attached",
        n("threads"),
        r["seconds"].as_f64().unwrap(),
        n("calls") + n("child_calls"),
        n("child_calls"),
        n("children"),
        n("remaps"),
        n("unmapped"),
        n("signals"),
        n("signals") as f64 / r["seconds"].as_f64().unwrap(),
        n("mismatches"),
        n("bad_results"),
        n("abnormal"),
        n("code_differ"),
        n("code_checks"),
        r["control_differ"],
    );
    assert_eq!(
        (n("mismatches"), n("bad_results"), n("abnormal")),
        (0, 0, 0),
        "{r}"
    );
    assert!(
        hits_per_cycle.iter().all(|h| *h > 0),
        "a cycle saw no call: {hits_per_cycle:?}"
    );
    assert!(n("children") >= 50 && n("remaps") >= 10, "{r}");
    assert_eq!(
        n("unmapped"),
        n("remaps"),
        "each close unmapped the library: {r}"
    );
    assert_eq!(
        (n("code_checks"), n("code_differ")),
        (CYCLES as u64, 0),
        "{r}"
    );
    // One breakpoint byte per site at least (int3 on x86-64) while attached.
    assert!(
        r["control_differ"].as_i64().unwrap() >= offsets.len() as i64,
        "{r}"
    );
    // Signals land on probe sites throughout: at least a quarter of the timer's 2 kHz. Fewer
    // arrive while attach cycles hold the process's memory map (208 probes a cycle now; 930/s
    // on CI's busy 2 cores once, over 1,000/s before).
    assert!(
        n("signals") as f64 / r["seconds"].as_f64().unwrap() >= 500.0,
        "{r}"
    );
}
