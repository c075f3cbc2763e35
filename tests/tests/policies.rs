//! Alert policies end to end: during a quiet period (`[[alerts.quiet]]`) a contention alert is
//! printed and exported with `quiet="true"`, and a real Alertmanager and the webhook get
//! nothing; a bad policy is refused with one line before anything is traced.
use std::time::{Duration, Instant};

use integration_tests::{
    device_file, env, exposition,
    guards::{Cgroup, TempDir},
    http, poll,
    servers::{Alertmanager, Webhook},
    Cudatrace, Scenario, Workload, FAST_DETECTION,
};

/// What one contention run under quiet entries gave: the victim's firing alert in the metrics,
/// Alertmanager's listing and the webhook's bodies 10 s later, the stdout records of the alert.
struct Quieted {
    active: Option<exposition::Sample>,
    listed: Vec<serde_json::Value>,
    hooked: Vec<serde_json::Value>,
    waits: Vec<serde_json::Value>,
}

/// A victim (`model-server`) learns its baseline, then an aggressor named `aggressor`, in
/// `cgroup` when given, slows it, under `quiet` (`[[alerts.quiet]]` entries).
fn contention_under(test: &str, quiet: &str, aggressor: &str, cgroup: Option<&Cgroup>) -> Quieted {
    let env = env().expect("privileged");
    let am = Alertmanager::start();
    let hook = Webhook::start();
    let dir = TempDir::new("quiet");
    let config = dir.write(
        "cudatrace.toml",
        &format!(
            "{FAST_DETECTION}[alerts]\nresend_s = 1\nwebhook_url = \"http://127.0.0.1:{}/hook\"\n\n{quiet}",
            hook.port
        ),
    );
    let (daemon, listen) = Cudatrace::start_daemon_on_loopback(
        &env,
        &[
            "--config",
            config.to_str().unwrap(),
            "--alertmanager",
            &am.url(),
        ],
        &[],
    );
    let dev = device_file("quiet");
    let vars = [
        ("CUDA_STANDIN_DEVICE", dev.as_str()),
        ("CUDA_STANDIN_NS_PER_BLOCK", "1000"),
        ("CUDA_VISIBLE_DEVICES", "0"),
    ];
    let looping = |seconds, grid, sync_every| {
        Workload::new(
            &env,
            Scenario::Loop {
                seconds,
                grid,
                sync_every,
            },
        )
    };
    let victim = looping(60.0, 1000, 1)
        .comm("model-server")
        .vars(&vars)
        .spawn();
    let victim_pid = victim.pid();
    let learned = daemon.wait_event(Duration::from_secs(60), "baseline", |r| {
        r["pid"].as_u64() == Some(victim_pid as u64) && r["signal"] == "wait_per_launch"
    });
    assert!(
        learned.is_some(),
        "no baseline within 60 s: {:?}",
        daemon.stderr_now()
    );
    let mut trainer = looping(40.0, 4000, 2).comm(aggressor).vars(&vars);
    if let Some(cg) = cgroup {
        trainer = trainer.cgroup(cg.path());
    }
    let trainer = trainer.spawn();
    let started = Instant::now();
    // Firing in the metrics.
    let pid = victim_pid.to_string();
    let active = poll(Duration::from_secs(40), || {
        let samples = exposition::parse(&http::scrape(&listen));
        exposition::select(
            &samples,
            "cudatrace_alert_active",
            &[
                ("pid", &pid),
                ("signal", "wait_per_launch"),
                ("state", "firing"),
            ],
        )
        .first()
        .map(|s| (*s).clone())
    });
    let fired_after = started.elapsed();
    // Alertmanager has the alert within a resend period (1 s) when it is sent: give it 10.
    std::thread::sleep(Duration::from_secs(10));
    // The alerts of the signal under test (the victim's waits). A launch-latency verdict of the
    // victim's own (no aggressor named: the trainer's threads can slow its launches on a
    // two-core machine) is another alert than the one a quiet period is about, and is left out.
    let of_waits = |v: &serde_json::Value| {
        let record = v["annotations"]["record"]
            .as_str()
            .and_then(|r| serde_json::from_str::<serde_json::Value>(r).ok())
            .unwrap_or_else(|| v.clone());
        record["evidence"]["signal"] == "wait_per_launch"
    };
    let listed: Vec<serde_json::Value> = am
        .alerts()
        .expect("Alertmanager answers")
        .into_iter()
        .filter(|v| of_waits(v))
        .collect();
    drop((victim, trainer));
    let traced = daemon.stop();
    let _ = std::fs::remove_file(&dev);
    let waits: Vec<serde_json::Value> = traced
        .events
        .iter()
        .filter(|e| {
            e["evidence"]["signal"] == "wait_per_launch" && e["victim"]["comm"] == "model-server"
        })
        .cloned()
        .collect();
    let hooked: Vec<serde_json::Value> = hook
        .received()
        .into_iter()
        .filter(|v| of_waits(v))
        .collect();
    eprintln!(
        "e2e {test}: fired {:.1} s after the aggressor started; stdout states {:?}; \
         Alertmanager lists {} alerts 10 s later; webhook got {} bodies",
        fired_after.as_secs_f64(),
        waits
            .iter()
            .map(|e| (
                e["state"].as_str().unwrap_or_default(),
                e["quiet"].as_str().unwrap_or_default()
            ))
            .collect::<Vec<_>>(),
        listed.len(),
        hooked.len()
    );
    assert!(
        active.is_some(),
        "no firing alert within 40 s: {:?}",
        traced.stderr
    );
    let states: Vec<&str> = waits.iter().map(|e| e["state"].as_str().unwrap()).collect();
    assert_eq!(&states[..2], ["pending", "firing"], "{waits:?}");
    Quieted {
        active,
        listed,
        hooked,
        waits,
    }
}

/// The batch job's own cgroup is quiet (narrowed by its comm), for any role: the alert of the
/// victim it slows is printed and exported as quiet, and neither Alertmanager nor the webhook
/// gets it (nor the trainer's own alert, should the server slow it in turn).
#[test]
fn a_quiet_period_keeps_alertmanager_empty_while_stdout_shows_the_alert() {
    if env().is_none() {
        return;
    }
    let batch = Cgroup::new("batch.slice/train.scope");
    let q = contention_under(
        "a_quiet_period_keeps_alertmanager_empty_while_stdout_shows_the_alert",
        "[[alerts.quiet]]\nname = \"nightly-batch\"\ncgroup = \"*/batch.slice/*\"\ncomm = \"train*\"\nhours = \"00:00-24:00\"\n",
        "trainer",
        Some(&batch),
    );
    let active = q.active.unwrap();
    assert_eq!(
        (active.label("quiet"), active.label("alert")),
        ("true", "CudatraceComputeContention")
    );
    assert_eq!(
        q.listed,
        Vec::<serde_json::Value>::new(),
        "Alertmanager got a quiet alert"
    );
    assert_eq!(
        q.hooked,
        Vec::<serde_json::Value>::new(),
        "the webhook got a quiet alert"
    );
    assert!(
        q.waits
            .iter()
            .all(|e| e["quiet"] == "nightly-batch" && e["alert"] == "CudatraceComputeContention"),
        "{:?}",
        q.waits
    );
}

/// Finding 8 of the second tenant review: with the trainers' comm quiet, an aggressor that
/// names itself `train-evil` (outside the batch cgroup) still has its victim's alert sent.
#[test]
fn an_aggressor_cannot_quiet_its_victims_alert_by_its_name() {
    if env().is_none() {
        return;
    }
    let q = contention_under(
        "an_aggressor_cannot_quiet_its_victims_alert_by_its_name",
        "[[alerts.quiet]]\nname = \"trainers\"\ncomm = \"train*\"\nhours = \"00:00-24:00\"\n\n\
         [[alerts.quiet]]\nname = \"nightly-batch\"\ncgroup = \"*/batch.slice/*\"\nrole = \"aggressor\"\n",
        "train-evil",
        None,
    );
    let active = q.active.unwrap();
    assert_eq!(
        (
            active.label("quiet"),
            active.label("alert"),
            active.label("comm")
        ),
        ("false", "CudatraceComputeContention", "model-server")
    );
    let sent: Vec<_> = q
        .listed
        .iter()
        .map(|a| {
            (
                a["labels"]["alertname"].as_str(),
                a["labels"]["comm"].as_str(),
                a["annotations"]["aggressors"]
                    .as_str()
                    .is_some_and(|s| s.contains("train-evil")),
            )
        })
        .collect();
    assert_eq!(
        sent,
        [(
            Some("CudatraceComputeContention"),
            Some("model-server"),
            true
        )],
        "{:?}",
        q.listed
    );
    assert!(!q.hooked.is_empty(), "the webhook got nothing");
    assert!(
        q.waits
            .iter()
            .all(|e| e["quiet"].is_null() && e["alert"] == "CudatraceComputeContention"),
        "{:?}",
        q.waits
    );
}

#[test]
fn a_bad_policy_is_one_line_before_anything_is_traced() {
    let Some(env) = env() else { return };
    let dir = TempDir::new("bad-policy");
    let config = dir.write(
        "cudatrace.toml",
        "[[detect.schedule]]\nname = \"sale\"\ndates = \"2026-11-27..2026-11-31\"\npage = 0.2\n",
    );
    let out = std::process::Command::new(&env.bin)
        .args([
            "run",
            "--lib",
            env.libcuda().to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
            "--config",
            config.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    eprintln!(
        "e2e a_bad_policy_is_one_line_before_anything_is_traced: exit {:?}: {said}",
        out.status.code()
    );
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        said.trim_end(),
        format!("cudatrace: bad config {}: detect.schedule \"sale\": dates = \"2026-11-27..2026-11-31\": give \"YYYY-MM-DD..YYYY-MM-DD\" (both days in)", config.display())
    );
}
