//! End-to-end: a heavy neighbour on the same simulated GPU fires a compute-contention alert
//! naming both, seen on stdout, by a webhook, in the metrics and by a real Alertmanager; it
//! resolves after the neighbour stops, and `cudatrace incidents` and `review` read it back from
//! the archive.
use std::time::{Duration, Instant};

use integration_tests::{
    alerting::{alert_active, blames_only, gpu0, learned_victim, looping, names, of_signal},
    device_file, env, exposition, http,
    servers::{Alertmanager, Webhook},
    Cudatrace,
};
use serde_json::Value;

/// A light job learns its baseline alone; a heavy second job on the same simulated GPU fires a
/// compute-contention alert naming both within 60 s, which reaches the webhook, the metrics and a
/// real Alertmanager, and resolves after the heavy job stops.
#[test]
fn contention_alert_names_both_and_resolves() {
    let Some(env) = env() else { return };
    let am = Alertmanager::start();
    let hook = Webhook::start();
    let (am_url, hook_url) = (am.url(), format!("http://127.0.0.1:{}/hook", hook.port));
    let dir = integration_tests::guards::TempDir::new("incidents");
    let archive = dir.join("incidents.jsonl");
    let config = dir.write(
        "cudatrace.toml",
        &format!("[alerts]\narchive = {:?}\n", archive.display().to_string()),
    );
    let (daemon, listen) = Cudatrace::start_daemon_on_loopback(
        &env,
        &[
            "--alertmanager",
            &am_url,
            "--webhook",
            &hook_url,
            "--config",
            config.to_str().unwrap(),
        ],
        &[],
    );
    let dev = device_file("contention");
    let vars = gpu0(&dev);
    // The victim: 1 ms kernels, a wait after each, for longer than the test needs.
    let victim = learned_victim(&env, &daemon, &vars, 400.0);
    let victim_pid = victim.pid();

    // The aggressor: 4 ms kernels, two queued before each wait, for 45 s.
    let heavy_start = Instant::now();
    let heavy = looping(&env, 45.0, 4000, 2)
        .comm("trainer")
        .vars(&vars)
        .spawn();
    let heavy_pid = heavy.pid();
    let is = |state: &'static str| {
        move |v: &Value| {
            v["state"] == state
                && v["evidence"]["signal"] == "wait_per_launch"
                && v["victim"]["pid"].as_u64() == Some(victim_pid)
        }
    };
    let firing = hook.wait_for(Duration::from_secs(60), is("firing"));
    let fired_after = heavy_start.elapsed();
    let firing = firing.unwrap_or_else(|| {
        panic!(
            "no firing alert within 60 s; webhook got {:?}",
            hook.received()
        )
    });
    assert_eq!(firing["alert"], "CudatraceComputeContention");
    assert_eq!(firing["cause"], "compute_contention");
    assert_eq!(firing["gpu"], "0");
    assert_eq!(firing["victim"]["comm"], "model-server");
    let aggressors: Vec<(u64, &str)> = firing["aggressors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| (a["pid"].as_u64().unwrap(), a["comm"].as_str().unwrap()))
        .collect();
    assert_eq!(aggressors, vec![(heavy_pid, "trainer")]);
    let share = firing["aggressors"][0]["share"].as_f64().unwrap();
    let ratio = firing["evidence"]["ratio"].as_f64().unwrap();
    assert_eq!(share, 1.0, "the only other process on GPU 0");
    assert!(ratio > 1.5 && firing["severity"] == "page", "{firing}");
    assert!(
        firing["evidence"]["now"].as_f64().unwrap()
            > firing["evidence"]["baseline_p99"].as_f64().unwrap()
    );

    // The metric and Alertmanager.
    let metrics = http::scrape(&listen);
    let active = alert_active(&metrics, victim_pid, "wait_per_launch");
    let active = active
        .first()
        .unwrap_or_else(|| panic!("no cudatrace_alert_active for the victim:\n{metrics}"));
    assert!(
        active.label("alert") == "CudatraceComputeContention"
            && active.label("state") == "firing"
            && active.value == 1.0,
        "{active:?}"
    );
    assert_eq!(
        active.label("aggressors"),
        format!("{heavy_pid}:trainer"),
        "{active:?}"
    );
    // Predicted against actual: the forecast for the window beside the value, under its p99.
    let parsed = exposition::parse(&metrics);
    let pick = |name: &str| {
        exposition::sum(
            &parsed,
            name,
            &[
                ("pid", &victim_pid.to_string()),
                ("signal", "wait_per_launch"),
            ],
        )
    };
    let (value, p99, forecast) = (
        pick("cudatrace_signal_value"),
        pick("cudatrace_signal_baseline_p99"),
        pick("cudatrace_signal_forecast"),
    );
    assert!(
        forecast > 0.0 && forecast < p99 && p99 < value,
        "forecast {forecast}, p99 {p99}, value {value}"
    );
    let ours = |alerts: &[Value]| -> Option<Value> {
        alerts
            .iter()
            .find(|a| {
                // Both of the victim's signals may fire; Alertmanager lists them in no set order.
                a["labels"]["alertname"] == "CudatraceComputeContention"
                    && a["labels"]["pid"] == victim_pid.to_string().as_str()
                    && a["labels"]["signal"] == "wait_per_launch"
            })
            .cloned()
    };
    let listed = am.wait_until(|a| ours(a).is_some());
    let listed =
        ours(&listed).unwrap_or_else(|| panic!("Alertmanager does not list the alert: {listed:?}"));
    assert_eq!(listed["labels"]["cause"], "compute_contention");
    assert_eq!(listed["labels"]["comm"], "model-server");
    assert_eq!(listed["labels"]["signal"], "wait_per_launch");
    assert_eq!(
        listed["annotations"]["aggressors"],
        format!("{heavy_pid}:trainer").as_str()
    );
    assert_eq!(listed["status"]["state"], "active");

    // The heavy job ends; the victim is back to its baseline and the alert resolves.
    let heavy = heavy.finish();
    let heavy_end = Instant::now();
    let resolved = hook.wait_for(Duration::from_secs(90), is("resolved"));
    let resolved_after = heavy_end.elapsed();
    let resolved = resolved.unwrap_or_else(|| {
        panic!(
            "not resolved within 90 s of the heavy job's end; webhook got {:?}",
            hook.received()
        )
    });
    assert_eq!(resolved["reason"], "back_to_baseline");
    let gone = am.wait_until(|a| ours(a).is_none());
    assert!(
        ours(&gone).is_none(),
        "Alertmanager still lists it: {gone:?}"
    );
    let metrics = http::scrape(&listen);
    drop(victim);
    let traced = daemon.stop();
    eprintln!(
        "e2e contention_alert_names_both_and_resolves: heavy launches={} fired {:.1} s after the heavy job started \
         (ratio {ratio:.1}, share {share}), resolved {:.1} s after it ended; stdout records: {:?}; firing record: {firing}",
        heavy["launches"],
        fired_after.as_secs_f64(),
        resolved_after.as_secs_f64(),
        names(&traced.events)
    );
    assert!(fired_after < Duration::from_secs(60));
    assert!(
        resolved_after <= Duration::from_secs(60 + 2 * 5 + 5),
        "{resolved_after:?}"
    );
    let still = exposition::parse(&metrics);
    assert!(
        exposition::select(
            &still,
            "cudatrace_alert_active",
            &[("signal", "wait_per_launch")]
        )
        .is_empty(),
        "{metrics}"
    );

    // Stdout: the wait alert's three state changes, in order, each as on the webhook; only the
    // heavy job is blamed, only for the light job, and nothing is left open.
    let waits = of_signal(&traced.events, "wait_per_launch");
    assert_eq!(
        waits
            .iter()
            .map(|e| e["state"].as_str().unwrap())
            .collect::<Vec<_>>(),
        vec!["pending", "firing", "resolved"]
    );
    assert_eq!(*waits[1], firing);
    assert_eq!(*waits[2], resolved);
    blames_only(&traced.events, victim_pid, &[(heavy_pid, "trainer")]);
    assert_eq!(
        hook.received(),
        traced.events,
        "the webhook gets exactly the stdout records"
    );
    assert_eq!(traced.summary()["dropped"], 0);

    // The incident archive holds the resolved alert; `cudatrace incidents` lists it with its
    // root cause in words.
    let listed = std::process::Command::new(&env.bin)
        .args(["incidents", "--since", "1h", "--archive"])
        .arg(&archive)
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&listed.stdout).into_owned();
    let json = std::process::Command::new(&env.bin)
        .args(["incidents", "--json", "--archive"])
        .arg(&archive)
        .output()
        .unwrap();
    let incidents: Vec<Value> = String::from_utf8_lossy(&json.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    eprintln!("e2e contention_alert_names_both_and_resolves: cudatrace incidents:\n{table}");
    assert!(listed.status.success() && json.status.success());
    let ours: Vec<&Value> = incidents
        .iter()
        .filter(|v| v["evidence"]["signal"] == "wait_per_launch")
        .collect();
    assert_eq!(ours.len(), 1, "{incidents:?}");
    assert_eq!(
        (ours[0]["alert"].as_str(), ours[0]["victim"]["pid"].as_u64()),
        (Some("CudatraceComputeContention"), Some(victim_pid))
    );
    assert_eq!(ours[0]["ended_at"], resolved["at"]);
    assert!(ours[0]["duration_s"].as_f64().unwrap() > 0.0);
    let cause =
        format!("trainer (pid {heavy_pid}) took 100% of GPU 0; model-server's wait per launch ");
    assert!(
        ours[0]["root_cause"].as_str().unwrap().starts_with(&cause),
        "{}",
        ours[0]["root_cause"]
    );
    assert!(
        table
            .lines()
            .any(|l| l.contains("CudatraceComputeContention") && l.contains(&cause)),
        "{table}"
    );

    // `cudatrace review` counts the same archive: every incident, and the victim's row as the
    // archive holds it (its count, its tiers, its longest time to resolve).
    let reviewed = std::process::Command::new(&env.bin)
        .args(["review", "--json", "--archive"])
        .arg(&archive)
        .output()
        .unwrap();
    assert!(reviewed.status.success());
    let r: Value = serde_json::from_slice(&reviewed.stdout).expect("one JSON object");
    assert_eq!(r["incidents"], incidents.len() as u64, "{r}");
    let workload = &ours[0]["victim"]["workload"];
    let same: Vec<&Value> = incidents
        .iter()
        .filter(|v| {
            v["alert"] == "CudatraceComputeContention"
                && v["cause"] == ours[0]["cause"]
                && &v["victim"]["workload"] == workload
        })
        .collect();
    let row = r["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["alert"] == "CudatraceComputeContention" && &x["workload"] == workload)
        .unwrap_or_else(|| panic!("no row of {workload} in {r}"));
    let tiers = ["page", "critical", "warning"]
        .map(|t| same.iter().filter(|v| v["severity"] == t).count() as u64);
    let longest = same
        .iter()
        .filter_map(|v| v["duration_s"].as_f64())
        .fold(0.0, f64::max);
    assert_eq!(
        (
            row["count"].as_u64(),
            row["tiers"].clone(),
            row["max_s"].as_f64()
        ),
        (
            Some(same.len() as u64),
            serde_json::json!(tiers),
            Some(longest)
        ),
        "{r}"
    );
    eprintln!("e2e contention_alert_names_both_and_resolves: cudatrace review: {r}");
}
