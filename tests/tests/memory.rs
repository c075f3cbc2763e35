//! End-to-end: baselines that outlive processes and restarts. cudatrace restarted between a
//! victim's warm-up and an aggressor's arrival resumes the victim's workload baseline from the
//! state file and fires on time; a victim restarted (new pid, same workload) next to an
//! aggressor already running is alerted on; a corrupt state file is one line, set aside, and a
//! fresh start.
use std::time::{Duration, Instant};

use integration_tests::{
    alerting::{daemon_with_hook, learn, looping, of_victim, FAST},
    device_file, env,
    guards::TempDir,
    servers::Webhook,
};
use serde_json::Value;

/// FAST, with baselines saved under `dir` every second.
fn with_state(dir: &std::path::Path) -> String {
    format!(
        "{FAST}[state]\ndir = {:?}\nsave_every_s = 1\n",
        dir.display().to_string()
    )
}

/// The workloads a state file holds.
fn saved_workloads(file: &std::path::Path) -> Vec<String> {
    let v: Value = serde_json::from_slice(&std::fs::read(file).unwrap()).unwrap();
    v["workloads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w[0].as_str().unwrap().to_owned())
        .collect()
}

/// A model server learns its waits under one cudatrace, which stops (saving its baselines);
/// a second cudatrace starts on the same state, resumes them (no new warm-up: no `baseline`
/// line for the server), and a trainer arriving at once fires compute contention within 40 s.
#[test]
fn a_restarted_cudatrace_resumes_baselines_and_fires_on_time() {
    let Some(env) = env() else { return };
    let hook = Webhook::start();
    let dir = TempDir::new("resume");
    let state = dir.join("state");
    std::fs::create_dir(&state).unwrap();
    let config = with_state(&state);
    let dev = device_file("resume");
    let vars = integration_tests::alerting::gpu0(&dev);
    let (first, _) = daemon_with_hook(&env, &dir, &config, &hook, None);
    let victim = looping(&env, 300.0, 1000, 1)
        .comm("model-server")
        .vars(&vars)
        .spawn();
    let victim_pid = victim.pid();
    learn(&first, victim_pid);
    let first = first.stop();
    assert_eq!(first.code, Some(0), "{:?}", first.stderr);
    let file = state.join("baselines").join("baselines.json");
    let saved = saved_workloads(&file);
    assert_eq!(
        saved
            .iter()
            .filter(|w| w.ends_with(":model-server"))
            .count(),
        1,
        "{saved:?}"
    );

    let (second, _) = daemon_with_hook(&env, &dir, &config, &hook, None);
    let resumed: Vec<String> = second
        .stderr_now()
        .into_iter()
        .filter(|l| l.starts_with("state: "))
        .collect();
    let arrived = Instant::now();
    let trainer = looping(&env, 45.0, 4000, 2)
        .comm("trainer")
        .vars(&vars)
        .spawn();
    let trainer_pid = trainer.pid();
    let firing = hook.wait_for(
        Duration::from_secs(40),
        of_victim(victim_pid, "CudatraceComputeContention", "firing"),
    );
    let after = arrived.elapsed();
    drop(trainer);
    drop(victim);
    let second = second.stop();
    eprintln!(
        "e2e a_restarted_cudatrace_resumes_baselines_and_fires_on_time: saved {saved:?}; {resumed:?}; fired {after:?} after the trainer arrived: {}",
        firing.as_ref().map_or("none".into(), |f| f["severity"].to_string())
    );
    let firing = firing.unwrap_or_else(|| panic!("no alert within 40 s: {:?}", second.stderr));
    assert_eq!(
        resumed.len(),
        1,
        "one state line at start: {:?}",
        second.stderr
    );
    assert!(
        resumed[0].starts_with(&format!(
            "state: resumed {} workloads' baselines from {}",
            saved.len(),
            file.display()
        )),
        "{resumed:?}"
    );
    assert_eq!(firing["aggressors"][0]["pid"].as_u64(), Some(trainer_pid));
    assert_eq!(firing["aggressors"][0]["comm"], "trainer");
    // Resumed, not learned again: no baseline line for the server under the second cudatrace.
    let relearned: Vec<&Value> = second
        .log_events("baseline")
        .into_iter()
        .filter(|r| r["pid"].as_u64() == Some(victim_pid))
        .collect();
    assert!(relearned.is_empty(), "{relearned:?}");
    assert_eq!(second.code, Some(0), "{:?}", second.stderr);
}

/// A model server learns its waits, exits; a trainer starts; a new model server (new pid, same
/// workload) starts next to it and is alerted on at once, from its workload's baseline.
#[test]
fn a_restarted_victim_next_to_a_running_aggressor_is_alerted_on() {
    let Some(env) = env() else { return };
    let hook = Webhook::start();
    let dir = TempDir::new("victim-restart");
    let dev = device_file("victim-restart");
    let vars = integration_tests::alerting::gpu0(&dev);
    let (daemon, _) = daemon_with_hook(&env, &dir, FAST, &hook, None);
    let before = looping(&env, 300.0, 1000, 1)
        .comm("model-server")
        .vars(&vars)
        .spawn();
    let before_pid = before.pid();
    learn(&daemon, before_pid);
    before.kill();
    let trainer = looping(&env, 90.0, 4000, 2)
        .comm("trainer")
        .vars(&vars)
        .spawn();
    let trainer_pid = trainer.pid();
    std::thread::sleep(Duration::from_secs(5));
    let started = Instant::now();
    let after = looping(&env, 120.0, 1000, 1)
        .comm("model-server")
        .vars(&vars)
        .spawn();
    let after_pid = after.pid();
    let firing = hook.wait_for(
        Duration::from_secs(45),
        of_victim(after_pid, "CudatraceComputeContention", "firing"),
    );
    let took = started.elapsed();
    drop(trainer);
    drop(after);
    let traced = daemon.stop();
    eprintln!(
        "e2e a_restarted_victim_next_to_a_running_aggressor_is_alerted_on: pid {before_pid} learned, exited; pid {after_pid} fired {took:?} after it started: {}",
        firing.as_ref().map_or("none".into(), |f| f["victim"]["workload"].to_string())
    );
    let firing = firing.unwrap_or_else(|| panic!("no alert within 45 s: {:?}", hook.received()));
    assert_eq!(firing["aggressors"][0]["pid"].as_u64(), Some(trainer_pid));
    let workload = firing["victim"]["workload"].as_str().unwrap();
    assert!(workload.ends_with(":model-server"), "{workload}");
    let relearned = traced
        .log_events("baseline")
        .into_iter()
        .filter(|r| r["pid"].as_u64() == Some(after_pid))
        .count();
    assert_eq!(relearned, 0, "the new pid learned no baseline of its own");
}

/// A state file of garbage: one line saying so and where it was set aside, the file there
/// byte for byte, tracing as usual (every launch counted), and a good file saved at stop.
#[test]
fn a_corrupt_state_file_is_set_aside_and_tracing_goes_on() {
    let Some(env) = env() else { return };
    let hook = Webhook::start();
    let dir = TempDir::new("corrupt-state");
    let state = dir.join("state");
    let baselines = state.join("baselines");
    std::fs::create_dir_all(&baselines).unwrap();
    let file = baselines.join("baselines.json");
    let garbage = b"{\"format\":\"cudatrace-baselines\",\"version\":1,\"workloads\":[[\"x\",{\"ser";
    std::fs::write(&file, garbage).unwrap();
    let (daemon, listen) = daemon_with_hook(&env, &dir, &with_state(&state), &hook, None);
    let job = integration_tests::Workload::new(
        &env,
        integration_tests::Scenario::Basic {
            launches: 1000,
            copies: 0,
        },
    )
    .run();
    let pid = job["pid"].as_u64().unwrap().to_string();
    let counted = integration_tests::exposition::wait_for_launches(
        &listen,
        &pid,
        1000.0,
        Duration::from_secs(10),
    );
    let traced = daemon.stop();
    let lines: Vec<&String> = traced
        .stderr
        .iter()
        .filter(|l| l.starts_with("state: "))
        .collect();
    eprintln!(
        "e2e a_corrupt_state_file_is_set_aside_and_tracing_goes_on: {lines:?}; launches in=1000 counted={counted:?}; exit {:?}",
        traced.code
    );
    assert_eq!(lines.len(), 1, "{:?}", traced.stderr);
    let aside = baselines.join("baselines.json.bad");
    let (head, tail) = (
        format!(
            "state: {} cannot be used (not a whole cudatrace-baselines file: EOF while parsing",
            file.display()
        ),
        format!("): set aside as {}; baselines start fresh", aside.display()),
    );
    assert!(
        lines[0].starts_with(&head) && lines[0].ends_with(&tail),
        "{}",
        lines[0]
    );
    assert_eq!(std::fs::read(&aside).unwrap(), garbage);
    assert_eq!(counted, Some(1000.0));
    assert_eq!(traced.code, Some(0), "{:?}", traced.stderr);
    let v: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(
        (v["format"].as_str(), v["version"].as_u64()),
        (Some("cudatrace-baselines"), Some(1))
    );
}
