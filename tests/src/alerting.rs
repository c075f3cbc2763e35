//! What the alerting end-to-end tests share: a daemon with a webhook (and an Alertmanager),
//! shortened detection times, and readers of alert records.
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::{
    exposition, guards::TempDir, http, poll, servers::Webhook, Cudatrace, Env, Running, Scenario,
    Traced, Workload,
};

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
) -> Running {
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

/// The `cudatrace_alert_active` samples of `pid`'s `signal` alert in a scrape.
pub fn alert_active(text: &str, pid: u64, signal: &str) -> Vec<exposition::Sample> {
    let samples = exposition::parse(text);
    let pid = pid.to_string();
    exposition::select(
        &samples,
        "cudatrace_alert_active",
        &[("pid", &pid), ("signal", signal)],
    )
    .into_iter()
    .cloned()
    .collect()
}

/// Whether a `baseline` stderr record is of process `pid`'s `signal`.
pub fn baseline_of(pid: u64, signal: &str) -> impl Fn(&Value) -> bool {
    let signal = signal.to_owned();
    move |r: &Value| r["pid"].as_u64() == Some(pid) && r["signal"] == signal.as_str()
}

/// The alert records of `signal`, in order.
pub fn of_signal<'a>(events: &'a [Value], signal: &str) -> Vec<&'a Value> {
    events
        .iter()
        .filter(|e| e["evidence"]["signal"] == signal)
        .collect()
}

/// alert/signal/state of each record.
pub fn names(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| {
            format!(
                "{}/{}/{}",
                e["alert"].as_str().unwrap(),
                e["evidence"]["signal"].as_str().unwrap(),
                e["state"].as_str().unwrap()
            )
        })
        .collect()
}

/// Asserts who the records blame: every record that names aggressors is about `victim` and names
/// exactly `aggressors` (pid, comm; none: nobody may be named). A record about any other process
/// names nobody: it can only be that process's own launch latency (`CudatraceLaunchLatencyHigh`,
/// `cpu_or_driver_contention`), which the CPU load of these tests on a 2-core machine can really
/// raise for a while, and it never gets past pending.
pub fn blames_only(events: &[Value], victim: u64, aggressors: &[(u64, &str)]) {
    for e in events {
        let about = e["victim"]["pid"].as_u64();
        let named: Vec<(u64, &str)> = parties(e).iter().map(|&(p, c, _)| (p, c)).collect();
        if about == Some(victim) {
            assert!(named.is_empty() || named == aggressors, "{e}");
            continue;
        }
        assert!(
            named.is_empty()
                && e["alert"] == "CudatraceLaunchLatencyHigh"
                && e["cause"] == "cpu_or_driver_contention"
                && e["state"] != "firing",
            "a record about another process than the victim {victim}: {e}"
        );
    }
}

/// Waits (up to 60 s) until the metrics show the victim's `signal` alert firing, then ends the
/// load and the victim, lets a window pass so the victim's exit resolves the alert, and stops
/// the daemon. Returns how long firing took (panics when it did not fire) and what it printed.
pub fn fire_then_exit(
    listen: &str,
    daemon: Cudatrace,
    victim: Running,
    load: Running,
    signal: &str,
) -> (Duration, Traced) {
    let victim_pid = victim.pid();
    let start = Instant::now();
    let firing = poll(Duration::from_secs(60), || {
        let text = http::scrape(listen);
        alert_active(&text, victim_pid, signal)
            .iter()
            .any(|a| a.label("state") == "firing")
            .then_some(())
    });
    let fired_after = start.elapsed();
    // Killed: the load first, then the victim.
    drop(load);
    drop(victim);
    std::thread::sleep(Duration::from_secs(6));
    let traced = daemon.stop();
    assert!(
        firing.is_some(),
        "no firing {signal} alert within 60 s: {:?}",
        traced.events
    );
    (fired_after, traced)
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::blames_only;

    fn record(victim: u64, alert: &str, cause: &str, state: &str, aggressors: Value) -> Value {
        json!({"victim": {"pid": victim}, "alert": alert, "cause": cause, "state": state,
               "aggressors": aggressors})
    }

    fn trainer() -> Value {
        json!([{"pid": 20, "comm": "trainer", "share": 1.0}])
    }

    #[test]
    fn the_victims_contention_and_the_aggressors_own_pending_latency_pass() {
        let c = "CudatraceComputeContention";
        let l = "CudatraceLaunchLatencyHigh";
        blames_only(
            &[
                record(10, c, "compute_contention", "pending", trainer()),
                record(20, l, "cpu_or_driver_contention", "pending", json!([])),
                record(20, l, "cpu_or_driver_contention", "resolved", json!([])),
                record(10, c, "compute_contention", "firing", trainer()),
            ],
            10,
            &[(20, "trainer")],
        );
    }

    #[test]
    #[should_panic(expected = "another process than the victim 10")]
    fn blaming_the_trainer_for_a_third_process_fails() {
        let r = record(
            30,
            "CudatraceComputeContention",
            "compute_contention",
            "pending",
            trainer(),
        );
        blames_only(&[r], 10, &[(20, "trainer")]);
    }

    #[test]
    #[should_panic(expected = "another process than the victim 10")]
    fn the_aggressors_own_latency_firing_fails() {
        let r = record(
            20,
            "CudatraceLaunchLatencyHigh",
            "cpu_or_driver_contention",
            "firing",
            json!([]),
        );
        blames_only(&[r], 10, &[(20, "trainer")]);
    }

    #[test]
    #[should_panic(expected = "\"pid\":21")]
    fn naming_another_aggressor_for_the_victim_fails() {
        let other = json!([{"pid": 21, "comm": "trainer", "share": 1.0}]);
        blames_only(
            &[record(
                10,
                "CudatraceComputeContention",
                "compute_contention",
                "firing",
                other,
            )],
            10,
            &[(20, "trainer")],
        );
    }

    #[test]
    #[should_panic(expected = "\"comm\":\"trainer\"")]
    fn naming_anyone_where_nobody_may_be_named_fails() {
        let r = record(
            10,
            "CudatraceGpuThrottled",
            "throttling",
            "firing",
            trainer(),
        );
        blames_only(&[r], 10, &[]);
    }
}
