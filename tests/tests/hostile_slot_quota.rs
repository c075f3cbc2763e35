//! End-to-end: one tenant's one-off libraries leave a slot for another tenant's job (finding 9
//! of the third tenant review: 40 copies of the library, each mapped by a short process, then a
//! real job's copy 2 s later: its 5,000 launches counted 0 in two of three runs). A tenant
//! holds at most half of `max_libraries`, and a slot whose holder exited is given back by the
//! pass that exit asks for. Three rounds, each with fresh copies.
use std::time::Duration;

use integration_tests::{
    device_file, env, exposition, free_port,
    guards::{Cgroup, TempDir},
    Cudatrace, Scenario, Workload,
};

#[test]
fn forty_one_off_libraries_leave_a_later_job_counted() {
    let Some(env) = env() else { return };
    let dir = TempDir::new("quota");
    let listen = format!("127.0.0.1:{}", free_port());
    let daemon = Cudatrace::start_daemon(&env, &["--listen", &listen], &[]);
    let flood = Cgroup::new("one-offs");
    let dev = device_file("quota");
    let (mut counted, mut latency_ms) = (Vec::new(), Vec::new());
    for round in 0..3 {
        // 40 short processes of one tenant, each with its own copy, 20 at a time: more than the
        // tenant's share (16) hold a library at once, however soon exits give slots back.
        for batch in 0..2 {
            let running: Vec<_> = (0..20)
                .map(|k| {
                    let name = format!("r{round}/one-off-{batch}-{k}/libcuda.so.1");
                    let lib = dir.copy(&env.libcuda(), &name);
                    let launches = Scenario::Basic {
                        launches: 5,
                        copies: 0,
                    };
                    Workload::new(&env, launches)
                        .lib(&lib)
                        .device(&dev)
                        .cgroup(flood.path())
                        .settle_ms(300)
                        .spawn()
                })
                .collect();
            for r in running {
                r.finish();
            }
        }
        // The real job 2 s later, in another tenant, with a copy of its own.
        std::thread::sleep(Duration::from_secs(2));
        let lib = dir.copy(&env.libcuda(), &format!("r{round}/job/libcuda.so.1"));
        let launches = Scenario::Basic {
            launches: 5000,
            copies: 0,
        };
        let report = Workload::new(&env, launches)
            .lib(&lib)
            .device(&dev)
            .settle_ms(1000)
            .run();
        let pid = report["pid"].as_u64().unwrap().to_string();
        let loaded = report["loaded_ns"].as_u64().unwrap_or(0);
        let found = daemon.wait_event(Duration::from_secs(5), "discovered", |r| {
            r["path"]
                .as_str()
                .is_some_and(|p| p.contains(&format!("r{round}/job/")))
        });
        let at = found.and_then(|r| r["at_ns"].as_u64());
        latency_ms.push(at.map(|at| (at as i64 - loaded as i64) / 1_000_000));
        counted.push(exposition::wait_for_launches(
            &listen,
            &pid,
            5000.0,
            Duration::from_secs(10),
        ));
    }
    let traced = daemon.stop();
    let _ = std::fs::remove_file(&dev);
    let tenant_full = traced
        .stderr
        .iter()
        .filter(|l| l.contains("libraries already (half of max_libraries)"))
        .count();
    let attached = traced.log_events("attached").len();
    eprintln!(
        "e2e forty_one_off_libraries_leave_a_later_job_counted: 3 rounds of 40 one-offs then a job: the jobs' \
         libraries discovered {latency_ms:?} ms after they were loaded, launches in=5000 counted={counted:?}; attached {attached}, refused for the tenant's share {tenant_full}"
    );
    let job_lines: Vec<&String> = traced
        .stderr
        .iter()
        .filter(|l| l.contains("/job/"))
        .collect();
    assert_eq!(counted, vec![Some(5000.0); 3], "{job_lines:#?}");
    assert!(tenant_full > 0, "the one-offs met their tenant's share");
    assert_eq!(traced.code, Some(0), "{:?}", traced.stderr);
}
