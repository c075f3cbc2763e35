//! End-to-end: cudatrace's own contention detector on the shared simulated device. Quiet jobs
//! fire nothing; a heavy neighbour on the same GPU fires a compute-contention alert naming both,
//! seen on stdout, by a webhook, in the metrics and by a real Alertmanager, and it resolves after
//! the neighbour stops.
use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use integration_tests::{
    alerting::looping,
    device_file, env, exposition,
    guards::TempDir,
    http, poll,
    servers::{Alertmanager, Webhook},
    Cudatrace, Running, Scenario, Traced, Workload,
};
use serde_json::Value;

/// (pid, signal) -> value of one metric's samples.
fn signal_values(text: &str, metric: &str) -> BTreeMap<(String, String), f64> {
    exposition::parse(text)
        .into_iter()
        .filter(|s| s.name == metric)
        .map(|s| {
            (
                (s.label("pid").to_owned(), s.label("signal").to_owned()),
                s.value,
            )
        })
        .collect()
}

/// The `cudatrace_alert_active` samples of `pid`'s `signal` alert in a scrape.
fn alert_active(text: &str, pid: u64, signal: &str) -> Vec<exposition::Sample> {
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

fn baseline_of(pid: u64, signal: &str) -> impl Fn(&Value) -> bool {
    let signal = signal.to_owned();
    move |r: &Value| r["pid"].as_u64() == Some(pid) && r["signal"] == signal.as_str()
}

/// A steady job alone on its GPU for a minute, and beside it, on another GPU, a job whose calls
/// are at random 10x slower (0.5% of them): both baselines are learned, nothing fires.
#[test]
fn quiet_jobs_fire_nothing() {
    let Some(env) = env() else { return };
    let (daemon, listen) = Cudatrace::start_daemon_on_loopback(&env, &[], &[]);
    let (dev_a, dev_b) = (device_file("steady"), device_file("noisy"));
    // 1 ms kernels, a wait after each: about 1,000 launches and 1,000 waits a second.
    let steady = looping(&env, 62.0, 1000, 1)
        .comm("steady-server")
        .device(&dev_a)
        .vars(&[
            ("CUDA_STANDIN_NS_PER_BLOCK", "1000"),
            ("CUDA_VISIBLE_DEVICES", "1"),
        ])
        .spawn();
    let noisy = looping(&env, 62.0, 1000, 1)
        .comm("noisy-server")
        .device(&dev_b)
        .vars(&[
            ("CUDA_STANDIN_NS_PER_BLOCK", "1000"),
            ("CUDA_STANDIN_OUTLIER_PPM", "5000"),
            ("CUDA_VISIBLE_DEVICES", "2"),
        ])
        .spawn();
    let (steady_pid, noisy_pid) = (steady.pid(), noisy.pid());
    // While they run: the highest window value over baseline p99 each signal reached.
    let mut highest: BTreeMap<(String, String), f64> = BTreeMap::new();
    let (mut steady, mut noisy) = (steady, noisy);
    let mut saw_alert_metric = false;
    while !steady.exited() || !noisy.exited() {
        let text = http::scrape(&listen);
        saw_alert_metric |= text.contains("cudatrace_alert_active");
        let value = signal_values(&text, "cudatrace_signal_value");
        for (key, p99) in signal_values(&text, "cudatrace_signal_baseline_p99") {
            if let Some(v) = value.get(&key) {
                let e = highest.entry(key).or_insert(0.0);
                *e = e.max(v / p99);
            }
        }
        std::thread::sleep(Duration::from_millis(2500));
    }
    let (steady, noisy) = (steady.finish(), noisy.finish());
    let metrics = http::scrape(&listen);
    let traced = daemon.stop();
    let learned = traced.log_events("baseline");
    eprintln!(
        "e2e quiet_jobs_fire_nothing: steady launches={} noisy launches={} baselines learned={} alert records={} \
         highest window/baseline-p99 seen (pid, signal): {highest:?}",
        steady["launches"], noisy["launches"], learned.len(), traced.events.len()
    );
    assert!(!saw_alert_metric);
    for pid in [steady_pid, noisy_pid] {
        assert!(
            highest.keys().any(|(p, _)| *p == pid.to_string()),
            "no signal values were exported for pid {pid}"
        );
    }
    for pid in [steady_pid, noisy_pid] {
        for signal in ["launch_latency_p99", "wait_per_launch"] {
            assert!(
                traced
                    .log_events("baseline")
                    .into_iter()
                    .any(baseline_of(pid, signal)),
                "no {signal} baseline for pid {pid}: {:?}",
                traced.stderr
            );
        }
    }
    assert_eq!(
        traced.events,
        Vec::<Value>::new(),
        "alert records on stdout"
    );
    assert!(!metrics.contains("cudatrace_alert_active"), "{metrics}");
    assert_eq!(traced.summary()["dropped"], 0);
}

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
    let vars = [
        ("CUDA_STANDIN_DEVICE", dev.as_str()),
        ("CUDA_STANDIN_NS_PER_BLOCK", "1000"),
        ("CUDA_VISIBLE_DEVICES", "0"),
    ];
    // The victim: 1 ms kernels, a wait after each, for longer than the test needs.
    let victim = looping(&env, 400.0, 1000, 1)
        .comm("model-server")
        .vars(&vars)
        .spawn();
    let victim_pid = victim.pid();
    let learned = daemon.wait_event(
        Duration::from_secs(60),
        "baseline",
        baseline_of(victim_pid, "wait_per_launch"),
    );
    assert!(
        learned.is_some(),
        "no baseline within 60 s: {:?}",
        daemon.stderr_now()
    );

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

    // Stdout: the wait alert's three state changes, in order, each as on the webhook; every record
    // names the light job as the victim (the heavy job was never slowed), and nothing is left open.
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
    assert!(
        traced
            .events
            .iter()
            .all(|e| e["victim"]["pid"].as_u64() == Some(victim_pid)),
        "{:?}",
        traced.events
    );
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

/// With NVML reporting GPU 0's clocks held down (thermal), a slowdown of a job alone on GPU 0 is
/// named throttling, with NVML's facts as evidence; the alert resolves when the victim exits.
/// (The slowdown comes from a job on the same simulated device that says, through
/// `CUDA_VISIBLE_DEVICES`, that it is on GPU 1, as the clocks of a throttled GPU would.)
#[test]
fn throttled_gpu_is_named_from_nvml() {
    let Some(env) = env() else { return };
    let dir = TempDir::new("nvml-throttle");
    let scenario = dir.write(
        "scenario.txt",
        "gpu 0 uuid=GPU-00000000-1111-2222-3333-444444444444 sm=90 mem=30 total=85899345920 used=4294967296 temp=91 power_mw=300000 sm_clock=1100 reasons=0x40 pcie_tx_kbs=0 pcie_rx_kbs=0\n\
         gpu 1 uuid=GPU-55555555-6666-7777-8888-999999999999 sm=5 mem=1 total=85899345920 used=1073741824 temp=40 power_mw=90000 sm_clock=1980 reasons=0x1 pcie_tx_kbs=0 pcie_rx_kbs=0\n",
    );
    let nvml = env.libnvml();
    let (daemon, listen) = Cudatrace::start_daemon_on_loopback(
        &env,
        &["--nvml-lib", nvml.to_str().unwrap()],
        &[("NVML_STANDIN_SCENARIO", scenario.to_str().unwrap())],
    );
    let dev = device_file("throttle");
    let on_gpu = |gpu| {
        [
            ("CUDA_STANDIN_DEVICE", dev.as_str()),
            ("CUDA_STANDIN_NS_PER_BLOCK", "1000"),
            ("CUDA_VISIBLE_DEVICES", gpu),
        ]
    };
    let (v0, v1) = (on_gpu("0"), on_gpu("1"));
    let victim = looping(&env, 400.0, 1000, 1)
        .comm("model-server")
        .vars(&v0)
        .spawn();
    let victim_pid = victim.pid();
    let learned = daemon.wait_event(
        Duration::from_secs(60),
        "baseline",
        baseline_of(victim_pid, "wait_per_launch"),
    );
    assert!(
        learned.is_some(),
        "no baseline within 60 s: {:?}",
        daemon.stderr_now()
    );
    let load = looping(&env, 60.0, 4000, 2)
        .comm("other-gpu-job")
        .vars(&v1)
        .spawn();
    let (fired_after, traced) = fire_then_exit(&listen, daemon, victim, load, "wait_per_launch");
    eprintln!("e2e throttled_gpu_is_named_from_nvml: fired {fired_after:.1?} after the slowdown began; records: {:?}", names(&traced.events));
    let waits = of_signal(&traced.events, "wait_per_launch");
    assert_eq!(
        waits
            .iter()
            .map(|e| e["state"].as_str().unwrap())
            .collect::<Vec<_>>(),
        vec!["pending", "firing", "resolved"]
    );
    let f = waits[1];
    assert_eq!(
        (f["alert"].as_str(), f["cause"].as_str(), f["gpu"].as_str()),
        (Some("CudatraceGpuThrottled"), Some("throttling"), Some("0"))
    );
    assert_eq!(f["victim"]["pid"].as_u64(), Some(victim_pid));
    assert_eq!(f["aggressors"], serde_json::json!([]));
    assert_eq!(
        f["evidence"]["clock_event_reasons"],
        serde_json::json!(["hw_thermal_slowdown"])
    );
    assert_eq!(f["evidence"]["gpu_utilization"].as_f64(), Some(0.9));
    assert_eq!(
        f["evidence"]["gpu_memory_used_ratio"].as_f64(),
        Some(4294967296.0 / 85899345920.0)
    );
    assert_eq!(waits[2]["reason"], "victim_exited");
    assert!(
        traced
            .events
            .iter()
            .all(|e| e["victim"]["pid"].as_u64() == Some(victim_pid)),
        "{:?}",
        traced.events
    );
}

/// A job copying to its GPU slows down while another process copies to the same GPU: copy
/// contention, naming the copier (not compute, though both are busy with the device).
#[test]
fn copy_contention_names_the_copier() {
    let Some(env) = env() else { return };
    let (daemon, listen) = Cudatrace::start_daemon_on_loopback(&env, &[], &[]);
    let dev = device_file("copies");
    let vars = [
        ("CUDA_STANDIN_DEVICE", dev.as_str()),
        ("CUDA_VISIBLE_DEVICES", "0"),
    ];
    // 4 MiB synchronous copies (0.4 ms at the stand-in's 10 GB/s), 1 ms apart.
    let victim = Workload::new(
        &env,
        Scenario::Copies {
            seconds: 400.0,
            bytes: 4_194_304,
            gap_us: 1000,
        },
    )
    .comm("model-server")
    .vars(&vars)
    .spawn();
    let victim_pid = victim.pid();
    let learned = daemon.wait_event(
        Duration::from_secs(60),
        "baseline",
        baseline_of(victim_pid, "copy_time_per_mib"),
    );
    assert!(
        learned.is_some(),
        "no baseline within 60 s: {:?}",
        daemon.stderr_now()
    );
    // 64 MiB copies back to back: the copy engine is always busy.
    let loader = Workload::new(
        &env,
        Scenario::Copies {
            seconds: 60.0,
            bytes: 67_108_864,
            gap_us: 0,
        },
    )
    .comm("data-loader")
    .vars(&vars)
    .spawn();
    let loader_pid = loader.pid();
    let (fired_after, traced) =
        fire_then_exit(&listen, daemon, victim, loader, "copy_time_per_mib");
    eprintln!("e2e copy_contention_names_the_copier: fired {fired_after:.1?} after the copier began; records: {:?}", names(&traced.events));
    let copies = of_signal(&traced.events, "copy_time_per_mib");
    assert_eq!(
        copies
            .iter()
            .map(|e| e["state"].as_str().unwrap())
            .collect::<Vec<_>>(),
        vec!["pending", "firing", "resolved"]
    );
    let f = copies[1];
    assert_eq!(
        (f["alert"].as_str(), f["cause"].as_str(), f["gpu"].as_str()),
        (
            Some("CudatraceCopyContention"),
            Some("copy_contention"),
            Some("0")
        )
    );
    assert_eq!(f["evidence"]["unit"], "seconds_per_mib");
    // The copier arrived: its bytes per second before (0) and now.
    let change = f["aggressors"][0]["change"].clone();
    assert_eq!(
        (&change["measure"], &change["before"], &change["arrived"]),
        (
            &serde_json::json!("copy_bytes_per_s"),
            &serde_json::json!(0.0),
            &serde_json::json!(true)
        ),
        "{f}"
    );
    assert!(change["now"].as_f64().unwrap() > 1e9, "{f}");
    let mut aggressors = f["aggressors"].clone();
    aggressors[0].as_object_mut().unwrap().remove("change");
    assert_eq!(
        aggressors,
        // Outside Kubernetes its workload is its executable and its name.
        serde_json::json!([{"pid": loader_pid, "comm": "data-loader", "namespace": null, "pod": null, "container": null, "share": 1.0,
                            "workload": format!("{}:data-loader", std::fs::canonicalize(env.workload()).unwrap().display())}])
    );
    assert_eq!(copies[2]["reason"], "victim_exited");
    assert!(
        traced
            .events
            .iter()
            .all(|e| e["victim"]["pid"].as_u64() == Some(victim_pid)),
        "{:?}",
        traced.events
    );
}

/// Waits (up to 60 s) until the metrics show the victim's `signal` alert firing, then ends the
/// load and the victim, lets a window pass so the victim's exit resolves the alert, and stops
/// the daemon. Returns how long firing took (panics when it did not fire) and what it printed.
fn fire_then_exit(
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

fn of_signal<'a>(events: &'a [Value], signal: &str) -> Vec<&'a Value> {
    events
        .iter()
        .filter(|e| e["evidence"]["signal"] == signal)
        .collect()
}

/// alert/signal/state of each record.
fn names(events: &[Value]) -> Vec<String> {
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

/// A webhook that accepts connections and never answers holds up neither tracing nor
/// Alertmanager: with short detector timings, a heavy neighbour's contention alert is listed by a
/// real Alertmanager within 15 s, while every post to the webhook waits out its timeouts.
#[test]
fn a_blackholed_webhook_does_not_delay_alertmanager() {
    let Some(env) = env() else { return };
    let am = Alertmanager::start();
    // Listening, never accepting: connections wait in the backlog, requests are never answered.
    let blackhole = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let hook_url = format!("http://{}/hook", blackhole.local_addr().unwrap());
    let dir = TempDir::new("blackhole");
    let config = dir.write(
        "cudatrace.toml",
        "[detect]\nwindow_s = 1\nwarmup_windows = 3\npending_windows = 2\nfiring_after_s = 2\nresolve_after_s = 5\n\n[alerts]\nresend_s = 5\n",
    );
    let (daemon, _listen) = Cudatrace::start_daemon_on_loopback(
        &env,
        &[
            "--config",
            config.to_str().unwrap(),
            "--alertmanager",
            &am.url(),
            "--webhook",
            &hook_url,
        ],
        &[],
    );
    let dev = device_file("blackhole");
    let vars = [
        ("CUDA_STANDIN_DEVICE", dev.as_str()),
        ("CUDA_STANDIN_NS_PER_BLOCK", "1000"),
        ("CUDA_VISIBLE_DEVICES", "0"),
    ];
    let victim = looping(&env, 120.0, 1000, 1)
        .comm("model-server")
        .vars(&vars)
        .spawn();
    let victim_pid = victim.pid();
    let learned = daemon.wait_event(
        Duration::from_secs(30),
        "baseline",
        baseline_of(victim_pid, "wait_per_launch"),
    );
    assert!(
        learned.is_some(),
        "no baseline within 30 s: {:?}",
        daemon.stderr_now()
    );
    let heavy_start = Instant::now();
    let heavy = looping(&env, 30.0, 4000, 2)
        .comm("trainer")
        .vars(&vars)
        .spawn();
    let listed = poll(Duration::from_secs(30), || {
        let alerts = am.alerts()?;
        alerts
            .iter()
            .any(|a| {
                a["labels"]["pid"] == victim_pid.to_string().as_str()
                    && a["labels"]["signal"] == "wait_per_launch"
            })
            .then_some(())
    });
    let after = heavy_start.elapsed();
    // Meanwhile the webhook's posts wait out their timeouts, and say so.
    let stuck = daemon.wait_stderr(Duration::from_secs(30), |l| {
        l.contains("webhook") && l.contains("no answer within 5 s")
    });
    drop(heavy);
    drop(victim);
    let traced = daemon.stop();
    drop(blackhole);
    eprintln!(
        "e2e a_blackholed_webhook_does_not_delay_alertmanager: Alertmanager listed the alert {:.1} s after the heavy job started; records {:?}",
        after.as_secs_f64(),
        names(&traced.events)
    );
    assert!(
        listed.is_some(),
        "not listed within 30 s: {:?}",
        traced.stderr
    );
    assert!(after < Duration::from_secs(15), "{after:?}");
    assert!(stuck.is_some(), "{:?}", traced.stderr);
}

/// Alert sinks over https with credentials: a real Alertmanager serving TLS and asking basic
/// auth (its web config), and a webhook over TLS that wants a bearer token. With short detector
/// timings, a neighbour's contention alert is listed by Alertmanager and posted to the webhook
/// with the token; every POST to the webhook carried it.
#[test]
fn alerts_reach_https_sinks_with_credentials() {
    let Some(env) = env() else { return };
    let cert = integration_tests::tls::Certificate::new();
    let am = Alertmanager::start_secure(&cert, "cudatrace", "am-s3cret");
    let hook = integration_tests::tls::TlsServer::start(|r| {
        if r.header("authorization") == Some("Bearer hook-t0ken") {
            (200, "{}".into())
        } else {
            (401, "{}".into())
        }
    });
    let dir = TempDir::new("https-sinks");
    // Both servers' certificates, as one CA file.
    let ca = dir.write(
        "ca.pem",
        &(std::fs::read_to_string(cert.pem()).unwrap()
            + &std::fs::read_to_string(hook.cert.pem()).unwrap()),
    );
    let password = dir.write("am-password", "am-s3cret\n");
    let token = dir.write("hook-token", "hook-t0ken\n");
    let config = dir.write(
        "cudatrace.toml",
        &format!(
            "[detect]\nwindow_s = 1\nwarmup_windows = 3\npending_windows = 2\nfiring_after_s = 2\nresolve_after_s = 5\n\n\
             [alerts]\nresend_s = 5\nalertmanager_url = \"{}\"\nwebhook_url = \"https://127.0.0.1:{}/hook\"\nca_file = {ca:?}\n\n\
             [alerts.alertmanager_auth]\nusername = \"cudatrace\"\npassword_file = {password:?}\n\n\
             [alerts.webhook_auth]\nbearer_token_file = {token:?}\n",
            am.url(),
            hook.port
        ),
    );
    let (daemon, _listen) =
        Cudatrace::start_daemon_on_loopback(&env, &["--config", config.to_str().unwrap()], &[]);
    let dev = device_file("https-sinks");
    let vars = [
        ("CUDA_STANDIN_DEVICE", dev.as_str()),
        ("CUDA_STANDIN_NS_PER_BLOCK", "1000"),
        ("CUDA_VISIBLE_DEVICES", "0"),
    ];
    let victim = looping(&env, 120.0, 1000, 1)
        .comm("model-server")
        .vars(&vars)
        .spawn();
    let victim_pid = victim.pid();
    let learned = daemon.wait_event(
        Duration::from_secs(30),
        "baseline",
        baseline_of(victim_pid, "wait_per_launch"),
    );
    assert!(
        learned.is_some(),
        "no baseline within 30 s: {:?}",
        daemon.stderr_now()
    );
    let heavy = looping(&env, 30.0, 4000, 2)
        .comm("trainer")
        .vars(&vars)
        .spawn();
    let is_victims = |a: &Value| {
        a["labels"]["pid"] == victim_pid.to_string().as_str()
            && a["labels"]["signal"] == "wait_per_launch"
    };
    let listed = poll(Duration::from_secs(30), || {
        am.alerts()?.into_iter().find(|a| is_victims(a))
    });
    let posted = poll(Duration::from_secs(10), || {
        hook.requests()
            .into_iter()
            .map(|r| serde_json::from_slice::<Value>(&r.body).unwrap_or_default())
            .find(|v| v["state"] == "firing" && v["victim"]["pid"].as_u64() == Some(victim_pid))
    });
    drop(heavy);
    drop(victim);
    let traced = daemon.stop();
    let requests = hook.requests();
    eprintln!(
        "e2e alerts_reach_https_sinks_with_credentials: Alertmanager (TLS, basic auth) listed {:?}; webhook (TLS, bearer) got {} POSTs, firing one: {}",
        listed.as_ref().map(|a| a["labels"]["alertname"].clone()),
        requests.len(),
        posted.is_some()
    );
    assert_eq!(
        listed.map(|a| a["labels"]["alertname"].clone()),
        Some(Value::from("CudatraceComputeContention")),
        "{:?}",
        traced.stderr
    );
    assert!(posted.is_some(), "{:?}", traced.stderr);
    assert!(requests
        .iter()
        .all(|r| r.target == "/hook" && r.header("authorization") == Some("Bearer hook-t0ken")));
    assert!(
        !traced
            .stderr
            .iter()
            .any(|l| l.contains("alertmanager") && l.contains("answered 401")),
        "{:?}",
        traced.stderr
    );
}
