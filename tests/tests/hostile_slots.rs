//! End-to-end: short-lived tenants cannot use up the library slots (finding 3 of the second
//! tenant review: 32 one-second processes of `nobody`, each mapping its own copy of a libcuda,
//! took every `max_libraries` slot for good, and a later job's 3,198 launches were not counted).
//! A discovered library is detached once no process maps it (seen by a pass over every
//! process: when a file waits for a slot, when the process it was found through exits, or at
//! each rescan when polling), its slot given back. One tenant (here every process of the test's
//! cgroup) holds at most half of the slots.
use std::time::Duration;

use integration_tests::{
    device_file, env, exposition, free_port, guards::TempDir, http, poll, Cudatrace, Scenario,
    Workload,
};

#[test]
fn library_slots_come_back_when_no_process_maps_the_file() {
    let Some(env) = env() else { return };
    let dir = TempDir::new("slots");
    let config = dir.write("cudatrace.toml", "max_libraries = 4\nrescan_ms = 100\n");
    let listen = format!("127.0.0.1:{}", free_port());
    let daemon = Cudatrace::start_daemon(
        &env,
        &["--listen", &listen, "--config", config.to_str().unwrap()],
        &[],
    );
    let dev = device_file("slots");
    let job = |lib: &std::path::Path, launches: u64, settle_ms: u64| {
        Workload::new(
            &env,
            Scenario::Basic {
                launches,
                copies: 0,
            },
        )
        .lib(lib)
        .device(&dev)
        .as_user(65534)
        .settle_ms(settle_ms)
    };
    // Six processes of one tenant at once, each with its own copy, each alive about 1.5 s: two
    // get a slot (the tenant's share of four).
    let tenants: Vec<_> = (0..6)
        .map(|k| {
            let lib = dir.copy(&env.libcuda(), &format!("tenant-{k}/libcuda.so.1"));
            job(&lib, 10, 1500).spawn()
        })
        .collect();
    for t in tenants {
        t.finish();
    }
    let released = poll(Duration::from_secs(10), || {
        let samples = exposition::parse(&http::scrape(&listen));
        let refused = exposition::sum(&samples, "cudatrace_libraries_refused_total", &[]);
        (refused == 4.0).then_some(refused)
    });
    // Their holders gone, a pass gives both slots back without waiting for another library.
    let given_back = poll(Duration::from_secs(10), || {
        let n = daemon
            .log_now()
            .iter()
            .filter(|r| r["event"] == "detached")
            .count();
        (n == 2).then_some(n)
    });
    assert_eq!(given_back, Some(2), "{:?}", daemon.stderr_now());
    // A later job, with a library of its own: a slot is free for it.
    let lib = dir.copy(&env.libcuda(), "job/libcuda.so.1");
    let report = job(&lib, 3000, 1000).run();
    let pid = report["pid"].as_u64().unwrap().to_string();
    let counted = exposition::wait_for_launches(&listen, &pid, 3000.0, Duration::from_secs(10));
    let traced = daemon.stop();
    let _ = std::fs::remove_file(&dev);
    let detached = traced.log_events("detached").len();
    let attached = traced.log_events("attached").len();
    eprintln!(
        "e2e library_slots_come_back_when_no_process_maps_the_file: 6 tenants, max_libraries 4: refused {released:?}, \
         attached {attached}, detached {detached}; the later job's launches in=3000 counted={counted:?}"
    );
    assert_eq!(released, Some(4.0), "{:?}", traced.stderr);
    assert_eq!(counted, Some(3000.0), "{:?}", traced.stderr);
    // Two of the tenant's files and the job's were attached. The two were detached once
    // unmapped (a pass when their holders exited, or when the job's file waited for a slot),
    // and the job's may be too before the daemon stops.
    assert_eq!(attached, 3, "{:?}", traced.stderr);
    assert!((2..=3).contains(&detached), "{:?}", traced.stderr);
    // Four files refused for the tenant's share (one may be said again when it is tried again
    // after a slot came back while its process still lived).
    let tenant_full: std::collections::HashSet<&str> = traced
        .stderr
        .iter()
        .filter(|l| l.contains("holds 2 libraries already (half of max_libraries)"))
        .filter_map(|l| l.split(": not attached").next())
        .collect();
    assert_eq!(tenant_full.len(), 4, "{:?}", traced.stderr);
}
