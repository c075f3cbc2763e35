//! End-to-end: `cudatrace actuator`, the separate process that caps cgroups for `[mitigate]`.
//! Its protocol on a real cpu cgroup: a cap is journalled and written, undone when asked, when
//! its client's connection ends, at its time limit, and, when the actuator was killed holding
//! it, at its next start; a reused pid and hostile lines are refused. Then the whole loop: a
//! page caps the preemptible aggressor, the victim recovers while the aggressor still runs, the
//! cap is undone; the next page caps it again, and cudatrace killed with SIGKILL while it holds
//! leaves no cap behind.
use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use integration_tests::{
    alerting::{gpu0, learned_victim, looping, FAST},
    cpucap::{start_actuator, ActuatorClient, CpuCgroup},
    device_file, env,
    guards::TempDir,
    servers::Webhook,
    Cudatrace,
};
use serde_json::{json, Value};

/// Waits up to `limit` for the cgroup's cap to read `want`; returns what it read last.
fn wait_cap(cg: &CpuCgroup, want: &str, limit: Duration) -> String {
    let start = Instant::now();
    loop {
        let now = cg.cap();
        if now == want || start.elapsed() > limit {
            return now;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_cap_is_journalled_and_undone_when_asked_when_its_client_goes_at_its_limit_and_after_a_kill() {
    let Some(env) = env() else { return };
    let dir = TempDir::new("actuator");
    let cg = CpuCgroup::new("actuator");
    let free = cg.cap();
    assert!(
        free.starts_with("max "),
        "a fresh cgroup is uncapped: {free}"
    );
    let mut sleeper = Command::new("sh")
        .args(["-c", "echo $$ > \"$0\" && exec sleep 300"])
        .arg(cg.path().join("cgroup.procs"))
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let pid = sleeper.id();
    std::thread::sleep(Duration::from_millis(200));
    // Its start time as a verdict reads it (/proc/PID/stat field 22, after the comm).
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let start: u64 = stat[stat.rfind(')').unwrap() + 1..]
        .split_whitespace()
        .nth(19)
        .unwrap()
        .parse()
        .unwrap();
    let cap_of = |key: &str, comm: &str, hold: u64, start: u64| json!({"op": "cap", "key": key, "pid": pid, "comm": comm, "start_time": start, "cpu_max": "1000 100000", "hold_s": hold});
    let cap = |key: &str, comm: &str, hold: u64| cap_of(key, comm, hold, start);
    let actuator = start_actuator(&env, &dir, true);
    let mut c = ActuatorClient::connect(&dir);
    // Asked, and undone when asked.
    let r = c.ask(&cap("k1", "sleep", 600));
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(cg.cap(), "1000 100000");
    let r = c.ask(&cap("k2", "trainer", 600));
    assert_eq!(r["ok"], false, "{r}");
    assert!(
        r["detail"].as_str().unwrap().contains("is not trainer now"),
        "{r}"
    );
    // The same name, another start time (a pid reused by a process of the same name): refused;
    // and a request without the start time is no request.
    let r = c.ask(&cap_of("k2", "sleep", 600, start + 1));
    assert_eq!(r["ok"], false, "{r}");
    assert!(
        r["detail"].as_str().unwrap().contains("its pid was reused"),
        "{r}"
    );
    let r = c.ask(&json!({"op": "cap", "key": "k2", "pid": pid, "comm": "sleep", "cpu_max": "1000 100000", "hold_s": 600}));
    assert_eq!(r["ok"], false, "{r}");
    assert_eq!(cg.cap(), "1000 100000", "only k1's cap");
    assert_eq!(
        c.ask(&json!({"op": "undo", "key": "k1"}))["detail"],
        "1 cap(s) undone"
    );
    assert_eq!(cg.cap(), free);
    // Undone when the connection that took it ends (cudatrace died or stopped).
    assert_eq!(c.ask(&cap("k1", "sleep", 600))["ok"], true);
    drop(c);
    assert_eq!(
        wait_cap(&cg, &free, Duration::from_secs(3)),
        free,
        "undone at the client's end"
    );
    // Undone at its time limit.
    let mut c = ActuatorClient::connect(&dir);
    assert_eq!(c.ask(&cap("k3", "sleep", 2))["ok"], true);
    assert_eq!(cg.cap(), "1000 100000");
    let t = Instant::now();
    assert_eq!(
        wait_cap(&cg, &free, Duration::from_secs(5)),
        free,
        "undone at its limit"
    );
    let held = t.elapsed().as_secs_f64();
    assert!((1.0..4.5).contains(&held), "held {held:.1} s of 2");
    // Hostile lines: too long, not a request.
    assert_eq!(c.ask(&json!({"op": "launch"}))["ok"], false);
    // Killed while holding: the cap stays, the journal has it, the next start undoes it.
    assert_eq!(c.ask(&cap("k4", "sleep", 600))["ok"], true);
    let journal: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("actuator.json")).unwrap()).unwrap();
    assert_eq!(
        (
            journal.as_array().unwrap().len(),
            &journal[0]["key"],
            journal[0]["pid"].as_u64()
        ),
        (1, &json!("k4"), Some(u64::from(pid)))
    );
    let killed = actuator.kill();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        cg.cap(),
        "1000 100000",
        "a killed actuator's cap stays until its next start"
    );
    let again = start_actuator(&env, &dir, true);
    assert_eq!(cg.cap(), free, "the next start undid it");
    let mut long = ActuatorClient::connect(&dir);
    let r = long.ask(&json!({"op": "undo", "key": "x".repeat(5000)}));
    assert!(
        r["detail"].as_str().unwrap().contains("at most 4096 bytes"),
        "{r}"
    );
    let traced = again.stop();
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    let left: Vec<&String> = traced
        .stderr
        .iter()
        .filter(|l| l.contains("left by a previous run:"))
        .collect();
    eprintln!(
        "e2e actuator: capped, refused a reused pid (by name and by start time), undone by request, at the client's end, at its 2 s limit after {held:.2} s, and after a SIGKILL at the next start; first run said {} lines",
        killed.stderr.len()
    );
    assert_eq!(left.len(), 1, "{:?}", traced.stderr);
    assert!(traced
        .stderr
        .iter()
        .any(|l| l.contains("1 cap(s) left by a previous run undone")));
}

#[test]
fn a_page_caps_the_preemptible_aggressor_the_victim_recovers_the_cap_is_undone_and_a_killed_cudatrace_leaves_none(
) {
    let Some(env) = env() else { return };
    let dir = TempDir::new("actuator-loop");
    let cg = CpuCgroup::new("trainer");
    let free = cg.cap();
    let actuator = start_actuator(&env, &dir, false);
    // Only cudatrace's own uid may ask by default: this test's own process (root) is refused.
    let r = ActuatorClient::connect(&dir).ask(&json!({"op": "undo", "key": "k"}));
    assert_eq!(r["ok"], false, "{r}");
    assert!(
        r["detail"]
            .as_str()
            .unwrap()
            .contains("uid 0 is not allowed"),
        "{r}"
    );
    let hook = Webhook::start();
    let archive = dir.join("incidents.jsonl");
    let config = dir.write(
        "cudatrace.toml",
        &format!(
            "{FAST}[alerts]\narchive = \"{}\"\nalertmanager_url = \"http://127.0.0.1:{}/am\"\nresend_s = 2\n[mitigate]\nenabled = true\ndry_run = false\nactuator = \"{}\"\nwebhook = \"http://127.0.0.1:{}/mitigate\"\npreemptible = [\"*:trainer\"]\ncpu_max = \"1000 100000\"\nmin_interval_s = 0\n",
            archive.display(),
            hook.port,
            dir.join("actuator.sock").display(),
            hook.port
        ),
    );
    let (daemon, _) =
        Cudatrace::start_daemon_on_loopback(&env, &["--config", config.to_str().unwrap()], &[]);
    let dev = device_file("actuator");
    let vars = gpu0(&dev);
    let victim = learned_victim(&env, &daemon, &vars, 300.0);
    let vpid = victim.pid();
    // The trainer: 4 ms kernels, two before each wait, 4 ms of CPU a call (a Python loop):
    // its GPU work goes as fast as its CPU, which the cap takes.
    let mut trainer = looping(&env, 280.0, 4000, 2)
        .comm("trainer")
        .vars(&vars)
        .var("CUDA_STANDIN_CALL_NS", "4000000")
        .var("CUDA_STANDIN_CALL_CPU", "1")
        .cgroup(cg.path())
        .spawn();
    let tpid = trainer.pid();
    let of_victim = |event: &'static str| {
        move |b: &Value| b["event"] == event && b["victim"]["pid"].as_u64() == Some(vpid)
    };
    let start = Instant::now();
    let act = hook.wait_for(Duration::from_secs(120), of_victim("act"));
    let capped = cg.cap();
    let acted_s = start.elapsed().as_secs_f64();
    let undo = hook.wait_for(Duration::from_secs(150), of_victim("undo"));
    let undone_s = start.elapsed().as_secs_f64();
    let after = cg.cap();
    let trainer_ran = !trainer.exited();
    // Uncapped, the trainer pages again: capped again; then cudatrace is killed holding it.
    let recapped = wait_cap(&cg, "1000 100000", Duration::from_secs(90));
    // SAFETY: plain kill(2).
    unsafe { libc::kill(daemon.pid() as i32, libc::SIGKILL) };
    let t = Instant::now();
    let left = wait_cap(&cg, &free, Duration::from_secs(5));
    let freed_s = t.elapsed().as_secs_f64();
    trainer.kill();
    drop(victim);
    // The actuator first: the daemon's collection waits for every cudatrace process to go.
    let acting = actuator.stop_without_waiting();
    let traced = daemon.wait();
    let _ = std::fs::remove_file(&dev);
    let bodies = hook.received();
    eprintln!(
        "e2e actuator loop: act at {acted_s:.1} s ({capped}), undo at {undone_s:.1} s ({after}), trainer still running: {trainer_ran}; capped again: {recapped}; after cudatrace's SIGKILL: {left} in {freed_s:.2} s; actuator said {:?}",
        acting.stderr
    );
    let act = act.unwrap_or_else(|| panic!("no act within 120 s: {bodies:?} {:?}", traced.stderr));
    let a = &act["actions"];
    assert_eq!(
        (
            a.as_array().map(Vec::len),
            a[0]["pid"].as_u64(),
            &a[0]["done"],
            &act["dry_run"]
        ),
        (Some(1), Some(tpid), &json!(true), &json!(false)),
        "{act}"
    );
    assert!(
        a[0]["outcome"].as_str().unwrap().starts_with("capped "),
        "{act}"
    );
    assert_eq!(capped, "1000 100000", "capped when the platform is told");
    let undo =
        undo.unwrap_or_else(|| panic!("the victim did not recover under the cap: {bodies:?}"));
    assert!(
        trainer_ran,
        "the victim recovered while the trainer ran, capped"
    );
    assert_eq!(undo["actions"][0]["outcome"], "1 cap(s) undone", "{undo}");
    assert_eq!(after, free, "the cap undone when the verdict resolved");
    assert_eq!(recapped, "1000 100000", "the next page capped it again");
    assert_eq!(left, free, "a killed cudatrace leaves no cap");
    // The archive's incident of the first page says what was done; `incidents` says it too.
    let text = std::fs::read_to_string(&archive).unwrap();
    let incidents: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|v: &Value| v["victim"]["pid"].as_u64() == Some(vpid))
        .collect();
    let acted: Vec<(&Value, Option<u64>, &Value, bool)> = incidents
        .iter()
        .flat_map(|v| v["mitigation"].as_array().into_iter().flatten())
        .map(|m| {
            (
                &m["event"],
                m["pid"].as_u64(),
                &m["done"],
                m["outcome"].as_str().unwrap_or("").starts_with("capped "),
            )
        })
        .collect();
    // The cap, and its undo when the incident ended.
    assert_eq!(
        acted,
        vec![
            (&json!("act"), Some(tpid), &json!(true), true),
            (&json!("undo"), Some(tpid), &Value::Null, false)
        ],
        "{text}"
    );
    let first = incidents
        .iter()
        .find(|v| v["mitigation"].is_array())
        .unwrap();
    assert_eq!(first["mitigation"][1]["at"], first["ended_at"]);
    // Alertmanager was told, while the page fired, what was done.
    let annotated: Vec<String> = bodies
        .iter()
        .filter_map(Value::as_array)
        .flatten()
        .filter(|a| a["labels"]["pid"].as_str().and_then(|p| p.parse().ok()) == Some(vpid))
        .filter_map(|a| a["annotations"]["mitigation"].as_str())
        .map(str::to_owned)
        .collect();
    assert!(
        annotated
            .first()
            .is_some_and(|m| m.starts_with("capped ")
                && m.contains(&format!(":trainer (pid {tpid}): capped "))),
        "{annotated:?}"
    );
    let listed = std::process::Command::new(&env.bin)
        .args(["incidents", "--archive", archive.to_str().unwrap()])
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(
        listed.contains("; capped ") && listed.contains(&format!(":trainer (pid {tpid})")),
        "{listed}"
    );
    assert!(
        acting
            .stderr
            .iter()
            .any(|l| l.contains("cudatrace went away holding 1 cap(s): undone")),
        "{:?}",
        acting.stderr
    );
}
