//! End-to-end: a tenant cannot take another's workload (finding 2 of the third tenant review:
//! `systemd-run --user --unit=triton tritonserver` became the system service's workload, since
//! the rule took the last `*.service` of the cgroup path; and the restart key, executable and
//! command name, ignored where a process ran). A system unit `triton.service` runs the victim;
//! a user's own unit of the same name runs an impostor of the same executable and name, which
//! crashes five times and starts again: the impostor's workload is the user's
//! (`user-1000/triton.service/tritonserver`), the restart loop names it and its process, and
//! nothing of it reaches the victim's workload.
use std::time::Duration;

use integration_tests::{
    alerting::{daemon_with_hook, looping, FAST},
    device_file, env, exposition,
    guards::{Cgroup, TempDir},
    http,
    servers::Webhook,
};
use serde_json::Value;

#[test]
fn an_impostor_unit_gets_its_own_workload_and_restart_key() {
    let Some(env) = env() else { return };
    let hook = Webhook::start();
    let dir = TempDir::new("impostor");
    let (daemon, listen) = daemon_with_hook(&env, &dir, FAST, &hook, None);
    let system = Cgroup::new("system.slice/triton.service");
    let user = Cgroup::new("user.slice/user-1000.slice/user@1000.service/app.slice/triton.service");
    let dev = device_file("impostor");
    let job = |seconds: f64| {
        looping(&env, seconds, 1, 1)
            .comm("tritonserver")
            .device(&dev)
    };
    let victim = job(120.0).cgroup(system.path()).spawn();
    let victim_pid = victim.pid();
    let mut impostor_pids = Vec::new();
    for _ in 0..5 {
        let crash = job(1.0).cgroup(user.path()).exit_code(3).spawn();
        impostor_pids.push(crash.pid());
        assert_eq!(crash.status().code(), Some(3));
    }
    let last = job(60.0).cgroup(user.path()).spawn();
    impostor_pids.push(last.pid());
    let loops = |v: &Value| v["alert"] == "CudatraceRestartLoop";
    let firing = hook.wait_for(Duration::from_secs(20), |v: &Value| {
        loops(v) && v["state"] == "firing"
    });
    let workload_of = |pid: u64| {
        integration_tests::poll(Duration::from_secs(10), || {
            exposition::parse(&http::scrape(&listen))
                .iter()
                .find(|s| s.label("pid") == pid.to_string())
                .map(|s| s.label("workload").to_owned())
        })
    };
    let (victims, impostors) = (workload_of(victim_pid), workload_of(last.pid()));
    let restarts: Vec<Value> = daemon
        .log_now()
        .into_iter()
        .filter(|r| r["event"] == "restart")
        .collect();
    drop(last);
    let _ = victim.kill();
    let _ = daemon.stop();
    let _ = std::fs::remove_file(&dev);
    eprintln!(
        "e2e an_impostor_unit_gets_its_own_workload_and_restart_key: workloads: victim {victims:?}, impostor \
         {impostors:?}; {} restarts; loop firing for {:?} (workload {:?})",
        restarts.len(),
        firing.as_ref().map(|f| f["victim"]["pid"].clone()),
        firing.as_ref().map(|f| f["victim"]["workload"].clone()),
    );
    assert_eq!(victims.as_deref(), Some("triton.service/tritonserver"));
    assert_eq!(
        impostors.as_deref(),
        Some("user-1000/triton.service/tritonserver")
    );
    let firing = firing.unwrap_or_else(|| panic!("no restart loop: {:?}", hook.received()));
    let named = firing["victim"]["pid"].as_u64().unwrap_or(0);
    assert!(impostor_pids.contains(&named), "{firing}");
    assert_eq!(
        firing["victim"]["workload"].as_str(),
        Some("user-1000/triton.service/tritonserver")
    );
    // No alert and no restart ever about the victim's workload or process.
    for v in hook.received() {
        assert_ne!(v["victim"]["pid"].as_u64(), Some(victim_pid), "{v}");
        assert_ne!(
            v["victim"]["workload"], "triton.service/tritonserver",
            "{v}"
        );
    }
    assert!(!restarts.is_empty());
    for r in &restarts {
        assert_ne!(r["pid"].as_u64(), Some(victim_pid), "{r}");
        assert_ne!(r["after"].as_u64(), Some(victim_pid), "{r}");
    }
}
