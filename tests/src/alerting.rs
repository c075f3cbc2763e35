//! What the alerting end-to-end tests share: a daemon with a webhook (and an Alertmanager),
//! shortened detection times, and readers of alert records.
use std::time::Duration;

use serde_json::Value;

use crate::{guards::TempDir, servers::Webhook, Cudatrace, Env, Scenario, Workload};

/// Tiers and times shortened so that each test fits in about a minute and a half.
pub const FAST: &str = "[detect]\nfiring_after_s = 15\nresolve_after_s = 20\n";

/// The workload looping launches of `grid` blocks (1 µs each below), a wait every `sync_every`.
pub fn looping(env: &Env, seconds: f64, grid: u32, sync_every: u64) -> Workload {
    Workload::new(
        env,
        Scenario::Loop {
            seconds,
            grid,
            sync_every,
        },
    )
}

/// The simulated GPU 0 of device file `dev`: 1 µs a block.
pub fn gpu0(dev: &str) -> [(&'static str, &str); 3] {
    [
        ("CUDA_STANDIN_DEVICE", dev),
        ("CUDA_STANDIN_NS_PER_BLOCK", "1000"),
        ("CUDA_VISIBLE_DEVICES", "0"),
    ]
}

/// A model server on `vars`' GPU, 1 ms kernels and a wait after each, for `seconds`, its
/// baseline learned under `daemon`: the victim of the contention tests.
pub fn learned_victim(
    env: &Env,
    daemon: &Cudatrace,
    vars: &[(&str, &str)],
    seconds: f64,
) -> crate::Running {
    let victim = looping(env, seconds, 1000, 1)
        .comm("model-server")
        .vars(vars)
        .spawn();
    learn(daemon, victim.pid());
    victim
}

/// Starts the daemon with `config` (TOML), a webhook and, when given, an Alertmanager.
pub fn daemon_with_hook(
    env: &Env,
    dir: &TempDir,
    config: &str,
    hook: &Webhook,
    am: Option<&str>,
) -> (Cudatrace, String) {
    let config = dir.write("cudatrace.toml", config);
    let hook_url = format!("http://127.0.0.1:{}/hook", hook.port);
    let mut args = vec!["--webhook", &hook_url, "--config", config.to_str().unwrap()];
    if let Some(url) = am {
        args.extend(["--alertmanager", url]);
    }
    Cudatrace::start_daemon_on_loopback(env, &args, &[])
}

/// Waits up to 60 s for the victim's `wait_per_launch` baseline.
pub fn learn(daemon: &Cudatrace, pid: u64) {
    let learned = daemon.wait_event(Duration::from_secs(60), "baseline", |r: &Value| {
        r["pid"].as_u64() == Some(pid) && r["signal"] == "wait_per_launch"
    });
    assert!(
        learned.is_some(),
        "no baseline within 60 s: {:?}",
        daemon.stderr_now()
    );
}

/// An alert record's aggressors: (pid, comm, share).
pub fn parties(record: &Value) -> Vec<(u64, &str, f64)> {
    record["aggressors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["pid"].as_u64().unwrap(),
                a["comm"].as_str().unwrap(),
                a["share"].as_f64().unwrap(),
            )
        })
        .collect()
}

/// Whether an alert record is `alert` of victim `pid` in `state`.
pub fn of_victim(pid: u64, alert: &'static str, state: &'static str) -> impl Fn(&Value) -> bool {
    move |v: &Value| {
        v["victim"]["pid"].as_u64() == Some(pid) && v["alert"] == alert && v["state"] == state
    }
}
