//! End-to-end: short-lived tenants cannot use up the library slots (finding 3 of the second
//! tenant review: 32 one-second processes of `nobody`, each mapping its own copy of a libcuda,
//! took every `max_libraries` slot for good, and a later job's 3,198 launches were not counted).
//! A discovered library is detached once no process maps it (seen by a pass over every
//! process: when a file waits for a slot, or at each rescan when polling), its slot given back.
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
    // Six tenants at once, each with its own copy, each alive about 1.5 s: four get a slot.
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
        (refused == 2.0).then_some(refused)
    });
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
    assert_eq!(released, Some(2.0), "{:?}", traced.stderr);
    assert_eq!(counted, Some(3000.0), "{:?}", traced.stderr);
    // Four tenants' files and the job's were attached. The tenants' four were detached once
    // unmapped: when the job's file waited for a slot (event-driven discovery), or at the next
    // pass (polling, which may detach the job's too before the daemon stops).
    assert_eq!(attached, 5, "{:?}", traced.stderr);
    assert!((4..=5).contains(&detached), "{:?}", traced.stderr);
}
