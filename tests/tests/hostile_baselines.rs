//! End-to-end: one tenant's short jobs cannot evict another tenant's saved baseline (finding 5
//! of the third tenant review: job names are unique per run, so more than 256 short GPU jobs
//! while a victim was down evicted its saved baseline; it came back beside the aggressor,
//! learned the contention as normal and was never alerted). A victim in a system unit learns
//! its baseline and stops; 300 one-off jobs of a user, each its own workload, run; the state
//! saved at stop holds 256 workloads, the victim's among them.
use integration_tests::{
    alerting::{daemon_with_hook, learn, looping, FAST},
    device_file, env,
    guards::{Cgroup, TempDir},
    servers::Webhook,
};
use serde_json::Value;

#[test]
fn three_hundred_jobs_leave_a_victims_baseline_in_place() {
    let Some(env) = env() else { return };
    let hook = Webhook::start();
    let dir = TempDir::new("evict");
    let state = dir.join("state");
    std::fs::create_dir(&state).unwrap();
    let config = format!(
        "{FAST}[state]\ndir = {:?}\nsave_every_s = 1\n",
        state.display().to_string()
    );
    let (daemon, _listen) = daemon_with_hook(&env, &dir, &config, &hook, None);
    let system = Cgroup::new("system.slice/victim.service");
    let user = Cgroup::new("user.slice/user-1000.slice/user@1000.service/app.slice/jobs.scope");
    let dev = device_file("evict");
    let victim = looping(&env, 300.0, 1000, 1)
        .comm("model-server")
        .device(&dev)
        .cgroup(system.path())
        .spawn();
    learn(&daemon, victim.pid());
    let _ = victim.kill();
    // 300 one-off jobs, 75 at a time, each alive two windows: each its own workload.
    let mut ran = 0;
    for batch in 0..4 {
        let jobs: Vec<_> = (0..75)
            .map(|k| {
                looping(&env, 11.0, 1, 1)
                    .comm(&format!("job-{batch}-{k}"))
                    .device(&dev)
                    .cgroup(user.path())
                    .spawn()
            })
            .collect();
        for j in jobs {
            let _ = j.finish();
            ran += 1;
        }
    }
    let traced = daemon.stop();
    let _ = std::fs::remove_file(&dev);
    let file = state.join("baselines").join("baselines.json");
    let v: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    let saved: Vec<String> = v["workloads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w[0].as_str().unwrap().to_owned())
        .collect();
    // A job gone before its identity was read is `?:pidN`, of the `host` tenant.
    let jobs = saved
        .iter()
        .filter(|w| w.starts_with("user-1000/") || w.starts_with("?:"))
        .count();
    let victims = saved
        .iter()
        .filter(|w| *w == "victim.service/model-server")
        .count();
    eprintln!(
        "e2e three_hundred_jobs_leave_a_victims_baseline_in_place: {ran} jobs: saved {} workloads ({jobs} of the jobs' tenant), \
         the victim's {victims}",
        saved.len()
    );
    assert_eq!(traced.code, Some(0), "{:?}", traced.stderr);
    assert_eq!(ran, 300);
    assert_eq!(saved.len(), 256, "{saved:?}");
    assert_eq!(victims, 1, "{saved:?}");
    assert_eq!(jobs, 255, "{saved:?}");
}
