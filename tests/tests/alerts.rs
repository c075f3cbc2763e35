//! End-to-end: cudatrace's own contention detector on the shared simulated device. Quiet jobs
//! fire nothing; a throttled GPU is named from NVML; a copier is named for copy contention; a
//! webhook that never answers or sinks behind TLS and credentials hold no alert up. (A compute
//! neighbour's alert, from firing to the archive: `contention.rs`.)
use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use integration_tests::{
    alerting::{baseline_of, blames_only, fire_then_exit, looping, names, of_signal},
    device_file, env, exposition,
    guards::TempDir,
    http, poll,
    servers::Alertmanager,
    Cudatrace, Scenario, Workload,
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
    blames_only(&traced.events, victim_pid, &[]);
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
    blames_only(&traced.events, victim_pid, &[(loader_pid, "data-loader")]);
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
