//! End-to-end: the alerts that must hold in the worst case. A victim starved by a neighbour
//! holding the simulated GPU (none of its waits return) is alerted on, naming the holder; a
//! slowdown that grows while firing escalates to one page in a real Alertmanager.
use std::time::{Duration, Instant};

use integration_tests::{
    alerting::{daemon_with_hook, learn, looping, of_victim, parties, FAST},
    device_file, env,
    guards::TempDir,
    servers::{Alertmanager, Webhook},
};
use serde_json::Value;

/// A model server learns its 1 ms waits; then a neighbour on the same GPU launches one kernel of
/// 40 s: not one of the server's waits returns meanwhile. It is alerted on as starved, naming
/// the neighbour, while stuck; it resolves once its waits are back for `resolve_after_s`.
#[test]
fn a_starved_victim_fires_naming_the_holder_and_resolves_after() {
    let Some(env) = env() else { return };
    let hook = Webhook::start();
    let dir = TempDir::new("starved");
    let (daemon, _listen) = daemon_with_hook(&env, &dir, FAST, &hook, None);
    let dev = device_file("starved");
    let vars = integration_tests::alerting::gpu0(&dev);
    let victim = looping(&env, 200.0, 1000, 1)
        .comm("model-server")
        .vars(&vars)
        .spawn();
    let victim_pid = victim.pid();
    // A neighbour that waits by events (no batch of its ever closes) and goes idle after 8 s:
    // its oldest launch is old, but it holds nobody's GPU.
    let mut ev_vars = vars.to_vec();
    ev_vars.extend([("WORKLOAD_SYNC", "event"), ("WORKLOAD_IDLE_AFTER", "8")]);
    let evented = looping(&env, 200.0, 20, 1)
        .comm("evented")
        .vars(&ev_vars)
        .spawn();
    learn(&daemon, victim_pid);
    // One launch of 40,000,000 blocks: 40 s of the simulated GPU, then its wait returns.
    let held_at = Instant::now();
    let holder = looping(&env, 0.001, 40_000_000, 1)
        .comm("batch-job")
        .vars(&vars)
        .spawn();
    let holder_pid = holder.pid();
    let name = "CudatraceGpuStarved";
    let firing = hook.wait_for(
        Duration::from_secs(40),
        of_victim(victim_pid, name, "firing"),
    );
    let fired_after = held_at.elapsed();
    let firing =
        firing.unwrap_or_else(|| panic!("no starvation alert within 40 s: {:?}", hook.received()));
    assert!(
        fired_after < Duration::from_secs(40),
        "fired after the hold: {fired_after:?}"
    );
    assert_eq!(firing["cause"], "starvation");
    assert_eq!(firing["severity"], "page", "{firing}");
    assert_eq!(firing["gpu"], "0");
    assert_eq!(firing["victim"]["comm"], "model-server");
    let holders: Vec<(u64, &str, f64)> = parties(&firing);
    assert_eq!(holders, vec![(holder_pid, "batch-job", 1.0)]);
    let stuck = firing["evidence"]["stuck_s"].as_f64().unwrap();
    assert!(
        stuck >= 5.0 && stuck < fired_after.as_secs_f64() + 1.0,
        "stuck_s {stuck}"
    );
    assert_eq!(firing["evidence"]["samples"], 0, "{firing}");
    // No alert of its own for the holder: its own long kernel is no starvation.
    let holder_report = holder.finish();
    let held = held_at.elapsed();
    assert_eq!(holder_report["launches"], 1);
    let resolved = hook.wait_for(
        Duration::from_secs(60),
        of_victim(victim_pid, name, "resolved"),
    );
    let resolved_after = held_at.elapsed() - held;
    let resolved =
        resolved.unwrap_or_else(|| panic!("not resolved within 60 s: {:?}", hook.received()));
    assert_eq!(resolved["reason"], "back_to_baseline");
    drop((victim, evented));
    let traced = daemon.stop();
    let received = hook.received();
    assert!(
        received
            .iter()
            .all(|r| r["victim"]["pid"].as_u64() == Some(victim_pid)),
        "{received:?}"
    );
    let states: Vec<&str> = received
        .iter()
        .filter(|r| r["alert"] == name)
        .map(|r| r["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["pending", "firing", "resolved"]);
    eprintln!(
        "e2e a_starved_victim_fires_naming_the_holder_and_resolves_after: fired {:.1} s into a {:.1} s hold \
         (stuck_s {stuck}), resolved {:.1} s after it; {} records on stdout",
        fired_after.as_secs_f64(),
        held.as_secs_f64(),
        resolved_after.as_secs_f64(),
        traced.events.len()
    );
    assert!(
        resolved_after <= Duration::from_secs(20 + 3 * 5 + 5),
        "{resolved_after:?}"
    );
}

/// A light neighbour slows the server by tens of percent (warning); a heavy one joins while the
/// alert fires: the same alert escalates to page, and Alertmanager lists exactly one active
/// alert for the server, at page.
#[test]
fn a_growing_slowdown_escalates_to_one_page() {
    let Some(env) = env() else { return };
    let am = Alertmanager::start();
    let hook = Webhook::start();
    let dir = TempDir::new("escalate");
    // Warning over +10%, critical over +200%, page over +300%.
    let config = format!("{FAST}warning = 0.1\ncritical = 2.0\npage = 3.0\n");
    let (daemon, _listen) = daemon_with_hook(&env, &dir, &config, &hook, Some(&am.url()));
    let dev = device_file("escalate");
    let vars = integration_tests::alerting::gpu0(&dev);
    let victim = looping(&env, 300.0, 1000, 1)
        .comm("model-server")
        .vars(&vars)
        .spawn();
    let victim_pid = victim.pid();
    learn(&daemon, victim_pid);
    // 0.3 ms kernels, a wait after each: the server waits up to 0.3 ms more per launch.
    let light = looping(&env, 200.0, 300, 1)
        .comm("light-job")
        .vars(&vars)
        .spawn();
    let is_wait = move |state: &'static str| {
        move |v: &Value| {
            v["victim"]["pid"].as_u64() == Some(victim_pid)
                && v["evidence"]["signal"] == "wait_per_launch"
                && v["state"] == state
        }
    };
    let first = hook.wait_for(Duration::from_secs(60), is_wait("firing"));
    let first =
        first.unwrap_or_else(|| panic!("no firing alert within 60 s: {:?}", hook.received()));
    assert_eq!(first["severity"], "warning", "{first}");
    // 20 ms kernels, two queued before each wait.
    let heavy_at = Instant::now();
    let heavy = looping(&env, 200.0, 20_000, 2)
        .comm("trainer")
        .vars(&vars)
        .spawn();
    let paged = hook.wait_for(Duration::from_secs(50), move |v: &Value| {
        is_wait("firing")(v) && v["severity"] == "page"
    });
    let escalated_after = heavy_at.elapsed();
    let paged = paged.unwrap_or_else(|| panic!("no escalation within 50 s: {:?}", hook.received()));
    assert_eq!(paged["escalated_from"], "warning");
    assert_eq!(paged["alert"], first["alert"]);
    assert_eq!(paged["started_at"], first["started_at"]);
    let ours = |alerts: &[Value]| -> Vec<Value> {
        alerts
            .iter()
            .filter(|a| {
                a["labels"]["pid"] == victim_pid.to_string().as_str()
                    && a["labels"]["signal"] == "wait_per_launch"
            })
            .cloned()
            .collect()
    };
    let listed = am.wait_until(|a| {
        let o = ours(a);
        o.len() == 1 && o[0]["labels"]["severity"] == "page"
    });
    let listed = ours(&listed);
    assert_eq!(listed.len(), 1, "Alertmanager lists {listed:?}");
    assert_eq!(listed[0]["labels"]["severity"], "page");
    assert_eq!(listed[0]["status"]["state"], "active");
    // Never two firing records at once, and severity never falls while it fires.
    let firing: Vec<String> = hook
        .received()
        .iter()
        .filter(|v| is_wait("firing")(v))
        .map(|v| v["severity"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(firing, ["warning", "page"]);
    drop((victim, light, heavy));
    let _ = daemon.stop();
    eprintln!(
        "e2e a_growing_slowdown_escalates_to_one_page: warning at ratio {}, page {:.1} s after the heavy job started (ratio {})",
        first["evidence"]["ratio"],
        escalated_after.as_secs_f64(),
        paged["evidence"]["ratio"]
    );
}
