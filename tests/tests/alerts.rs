//! End-to-end: cudatrace's own contention detector on the shared simulated device. Quiet jobs
//! fire nothing; a heavy neighbour on the same GPU fires a compute-contention alert naming both,
//! seen on stdout, by a webhook, in the metrics and by a real Alertmanager, and it resolves after
//! the neighbour stops.
use std::{
    collections::BTreeMap,
    process::{Child, Command},
    time::{Duration, Instant},
};

use integration_tests::{Server, Tracer, Webhook, poll, device_file, env, finish_workload, http_get, spawn_workload_as};
use serde_json::Value;

/// A real Alertmanager (Debian's prometheus-alertmanager) on loopback.
struct Alertmanager(Server);

impl Alertmanager {
    fn start() -> Alertmanager {
        let config = "route:\n  receiver: none\n  group_wait: 1s\nreceivers:\n  - name: none\n";
        let server = Server::start("prometheus-alertmanager", "prometheus-alertmanager", "alertmanager.yml", config, |config, dir, port| {
            vec![
                format!("--config.file={}", config.display()),
                format!("--storage.path={}", dir.join("data").display()),
                format!("--web.listen-address=127.0.0.1:{port}"),
                "--cluster.listen-address=".into(),
            ]
        });
        let am = Alertmanager(server);
        assert!(poll(Duration::from_secs(30), || am.alerts()).is_some(), "Alertmanager did not answer within 30 s");
        am
    }

    /// The alerts its API lists (active ones), or None while it does not answer.
    fn alerts(&self) -> Option<Vec<Value>> {
        let out = Command::new("curl")
            .args(["-sf", "--max-time", "5", &format!("http://127.0.0.1:{}/api/v2/alerts", self.0.port)])
            .output()
            .ok()?;
        out.status.success().then(|| serde_json::from_slice::<Value>(&out.stdout).ok()?.as_array().cloned()).flatten()
    }

    /// Waits (up to 15 s) until `pred` holds for the listed alerts; returns the last listing.
    fn wait_until(&self, pred: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let mut last = Vec::new();
        poll(Duration::from_secs(15), || {
            last = self.alerts().unwrap_or_default();
            pred(&last).then_some(())
        });
        last
    }
}

/// (pid, signal) -> value of one metric's samples.
fn signal_values(text: &str, metric: &str) -> BTreeMap<(String, String), f64> {
    let label = |line: &str, name: &str| -> String {
        let start = line.find(&format!("{name}=\"")).map(|i| i + name.len() + 2).unwrap_or(0);
        line[start..].split('"').next().unwrap_or_default().to_owned()
    };
    text.lines()
        .filter(|l| l.starts_with(&format!("{metric}{{")))
        .filter_map(|l| Some(((label(l, "pid"), label(l, "signal")), l.rsplit(' ').next()?.parse().ok()?)))
        .collect()
}

fn baseline_line(pid: u64, signal: &str) -> impl Fn(&str) -> bool {
    let prefix = format!("baseline: pid={pid} ");
    let signal = format!(" signal={signal} ");
    move |l: &str| l.starts_with(&prefix) && l.contains(&signal)
}

/// The pid of a spawned workload (the symlink is exec'd directly, so it is the workload itself).
fn pid(child: &Child) -> u64 {
    u64::from(child.id())
}

/// A steady job alone on its GPU for a minute, and beside it, on another GPU, a job whose calls
/// are at random 10x slower (0.5% of them): both baselines are learned, nothing fires.
#[test]
fn quiet_jobs_fire_nothing() {
    let Some(env) = env() else { return };
    let (daemon, listen) = Tracer::start_daemon_on_loopback(&env, &[], &[]);
    let (dev_a, dev_b) = (device_file("steady"), device_file("noisy"));
    // 1 ms kernels, a wait after each: about 1,000 launches and 1,000 waits a second.
    let steady = spawn_workload_as(
        &env,
        "steady-server",
        &[("CUDA_STANDIN_DEVICE", &dev_a), ("CUDA_STANDIN_NS_PER_BLOCK", "1000"), ("CUDA_VISIBLE_DEVICES", "1")],
        &["loop", "62", "1000", "1"],
    );
    let noisy = spawn_workload_as(
        &env,
        "noisy-server",
        &[
            ("CUDA_STANDIN_DEVICE", &dev_b),
            ("CUDA_STANDIN_NS_PER_BLOCK", "1000"),
            ("CUDA_STANDIN_OUTLIER_PPM", "5000"),
            ("CUDA_VISIBLE_DEVICES", "2"),
        ],
        &["loop", "62", "1000", "1"],
    );
    let (steady_pid, noisy_pid) = (pid(&steady), pid(&noisy));
    // While they run: the highest window value over baseline p99 each signal reached.
    let mut highest: BTreeMap<(String, String), f64> = BTreeMap::new();
    let (mut steady, mut noisy) = (steady, noisy);
    let mut saw_alert_metric = false;
    while steady.try_wait().unwrap().is_none() || noisy.try_wait().unwrap().is_none() {
        let text = http_get(&format!("http://{listen}/metrics"), None);
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
    let (steady, noisy) = (finish_workload(steady), finish_workload(noisy));
    let metrics = http_get(&format!("http://{listen}/metrics"), None);
    let traced = daemon.stop();
    let learned: Vec<&String> = traced.stderr.iter().filter(|l| l.starts_with("baseline: ")).collect();
    eprintln!(
        "e2e quiet_jobs_fire_nothing: steady launches={} noisy launches={} baselines learned={} alert records={} \
         highest window/baseline-p99 seen (pid, signal): {highest:?}",
        steady["launches"], noisy["launches"], learned.len(), traced.events.len()
    );
    assert!(!saw_alert_metric);
    for pid in [steady_pid, noisy_pid] {
        assert!(highest.keys().any(|(p, _)| *p == pid.to_string()), "no signal values were exported for pid {pid}");
    }
    for pid in [steady_pid, noisy_pid] {
        for signal in ["launch_latency_p99", "wait_per_launch"] {
            assert!(traced.stderr.iter().any(|l| baseline_line(pid, signal)(l)), "no {signal} baseline for pid {pid}: {:?}", traced.stderr);
        }
    }
    assert_eq!(traced.events, Vec::<Value>::new(), "alert records on stdout");
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
    let (am_url, hook_url) = (format!("http://127.0.0.1:{}", am.0.port), format!("http://127.0.0.1:{}/hook", hook.port));
    let (daemon, listen) = Tracer::start_daemon_on_loopback(&env, &["--alertmanager", &am_url, "--webhook", &hook_url], &[]);
    let dev = device_file("contention");
    let vars = [("CUDA_STANDIN_DEVICE", dev.as_str()), ("CUDA_STANDIN_NS_PER_BLOCK", "1000"), ("CUDA_VISIBLE_DEVICES", "0")];
    // The victim: 1 ms kernels, a wait after each, for longer than the test needs.
    let mut victim = spawn_workload_as(&env, "model-server", &vars, &["loop", "400", "1000", "1"]);
    let victim_pid = pid(&victim);
    let learned = daemon.wait_stderr(Duration::from_secs(60), baseline_line(victim_pid, "wait_per_launch"));
    assert!(learned.is_some(), "no baseline within 60 s: {:?}", daemon.stderr_now());

    // The aggressor: 4 ms kernels, two queued before each wait, for 45 s.
    let heavy_start = Instant::now();
    let heavy = spawn_workload_as(&env, "trainer", &vars, &["loop", "45", "4000", "2"]);
    let heavy_pid = pid(&heavy);
    let is = |state: &'static str| {
        move |v: &Value| v["state"] == state && v["evidence"]["signal"] == "wait_per_launch" && v["victim"]["pid"].as_u64() == Some(victim_pid)
    };
    let firing = hook.wait_for(Duration::from_secs(60), is("firing"));
    let fired_after = heavy_start.elapsed();
    let firing = firing.unwrap_or_else(|| panic!("no firing alert within 60 s; webhook got {:?}", hook.received()));
    assert_eq!(firing["alert"], "CudatraceComputeContention");
    assert_eq!(firing["cause"], "compute_contention");
    assert_eq!(firing["gpu"], "0");
    assert_eq!(firing["victim"]["comm"], "model-server");
    let aggressors: Vec<(u64, &str)> =
        firing["aggressors"].as_array().unwrap().iter().map(|a| (a["pid"].as_u64().unwrap(), a["comm"].as_str().unwrap())).collect();
    assert_eq!(aggressors, vec![(heavy_pid, "trainer")]);
    let share = firing["aggressors"][0]["share"].as_f64().unwrap();
    let ratio = firing["evidence"]["ratio"].as_f64().unwrap();
    assert_eq!(share, 1.0, "the only other process on GPU 0");
    assert!(ratio > 1.5 && firing["severity"] == "page", "{firing}");
    assert!(firing["evidence"]["now"].as_f64().unwrap() > firing["evidence"]["baseline_p99"].as_f64().unwrap());

    // The metric and Alertmanager.
    let metrics = http_get(&format!("http://{listen}/metrics"), None);
    let active = metrics.lines().find(|l| l.starts_with("cudatrace_alert_active{") && l.contains(&format!("pid=\"{victim_pid}\"")) && l.contains("signal=\"wait_per_launch\""));
    let active = active.unwrap_or_else(|| panic!("no cudatrace_alert_active for the victim:\n{metrics}"));
    assert!(active.contains("alert=\"CudatraceComputeContention\"") && active.contains("state=\"firing\"") && active.rsplit(' ').next() == Some("1.0"), "{active}");
    assert!(active.contains(&format!("aggressors=\"{heavy_pid}:trainer\"")), "{active}");
    let ours = |alerts: &[Value]| -> Option<Value> {
        alerts
            .iter()
            .find(|a| a["labels"]["alertname"] == "CudatraceComputeContention" && a["labels"]["pid"] == victim_pid.to_string().as_str())
            .cloned()
    };
    let listed = am.wait_until(|a| ours(a).is_some());
    let listed = ours(&listed).unwrap_or_else(|| panic!("Alertmanager does not list the alert: {listed:?}"));
    assert_eq!(listed["labels"]["cause"], "compute_contention");
    assert_eq!(listed["labels"]["comm"], "model-server");
    assert_eq!(listed["labels"]["signal"], "wait_per_launch");
    assert_eq!(listed["annotations"]["aggressors"], format!("{heavy_pid}:trainer").as_str());
    assert_eq!(listed["status"]["state"], "active");

    // The heavy job ends; the victim is back to its baseline and the alert resolves.
    let heavy = finish_workload(heavy);
    let heavy_end = Instant::now();
    let resolved = hook.wait_for(Duration::from_secs(90), is("resolved"));
    let resolved_after = heavy_end.elapsed();
    let resolved = resolved.unwrap_or_else(|| panic!("not resolved within 90 s of the heavy job's end; webhook got {:?}", hook.received()));
    assert_eq!(resolved["reason"], "back_to_baseline");
    let gone = am.wait_until(|a| ours(a).is_none());
    assert!(ours(&gone).is_none(), "Alertmanager still lists it: {gone:?}");
    let metrics = http_get(&format!("http://{listen}/metrics"), None);
    let _ = victim.kill();
    let _ = victim.wait();
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
    assert!(resolved_after <= Duration::from_secs(60 + 2 * 5 + 5), "{resolved_after:?}");
    assert!(!metrics.lines().any(|l| l.starts_with("cudatrace_alert_active{") && l.contains("signal=\"wait_per_launch\"")), "{metrics}");

    // Stdout: the wait alert's three state changes, in order, each as on the webhook; every record
    // names the light job as the victim (the heavy job was never slowed), and nothing is left open.
    let waits = of_signal(&traced.events, "wait_per_launch");
    assert_eq!(waits.iter().map(|e| e["state"].as_str().unwrap()).collect::<Vec<_>>(), vec!["pending", "firing", "resolved"]);
    assert_eq!(*waits[1], firing);
    assert_eq!(*waits[2], resolved);
    assert!(traced.events.iter().all(|e| e["victim"]["pid"].as_u64() == Some(victim_pid)), "{:?}", traced.events);
    assert_eq!(hook.received(), traced.events, "the webhook gets exactly the stdout records");
    assert_eq!(traced.summary()["dropped"], 0);
}

/// With NVML reporting GPU 0's clocks held down (thermal), a slowdown of a job alone on GPU 0 is
/// named throttling, with NVML's facts as evidence; the alert resolves when the victim exits.
/// (The slowdown comes from a job on the same simulated device that says, through
/// `CUDA_VISIBLE_DEVICES`, that it is on GPU 1, as the clocks of a throttled GPU would.)
#[test]
fn throttled_gpu_is_named_from_nvml() {
    let Some(env) = env() else { return };
    let scenario = std::env::temp_dir().join(format!("cudatrace-nvml-throttle-{}.txt", std::process::id()));
    std::fs::write(
        &scenario,
        "gpu 0 uuid=GPU-00000000-1111-2222-3333-444444444444 sm=90 mem=30 total=85899345920 used=4294967296 temp=91 power_mw=300000 sm_clock=1100 reasons=0x40 pcie_tx_kbs=0 pcie_rx_kbs=0\n\
         gpu 1 uuid=GPU-55555555-6666-7777-8888-999999999999 sm=5 mem=1 total=85899345920 used=1073741824 temp=40 power_mw=90000 sm_clock=1980 reasons=0x1 pcie_tx_kbs=0 pcie_rx_kbs=0\n",
    )
    .unwrap();
    let nvml = env.standin.join("libnvidia-ml.so.1");
    let (daemon, listen) =
        Tracer::start_daemon_on_loopback(&env, &["--nvml-lib", nvml.to_str().unwrap()], &[("NVML_STANDIN_SCENARIO", scenario.to_str().unwrap())]);
    let dev = device_file("throttle");
    let on_gpu = |gpu| [("CUDA_STANDIN_DEVICE", dev.as_str()), ("CUDA_STANDIN_NS_PER_BLOCK", "1000"), ("CUDA_VISIBLE_DEVICES", gpu)];
    let (v0, v1) = (on_gpu("0"), on_gpu("1"));
    let victim = spawn_workload_as(&env, "model-server", &v0, &["loop", "400", "1000", "1"]);
    let victim_pid = pid(&victim);
    let learned = daemon.wait_stderr(Duration::from_secs(60), baseline_line(victim_pid, "wait_per_launch"));
    assert!(learned.is_some(), "no baseline within 60 s: {:?}", daemon.stderr_now());
    let load = spawn_workload_as(&env, "other-gpu-job", &v1, &["loop", "60", "4000", "2"]);
    let (fired_after, traced) = fire_then_exit(&listen, daemon, victim, load, "wait_per_launch");
    let _ = std::fs::remove_file(&scenario);
    eprintln!("e2e throttled_gpu_is_named_from_nvml: fired {fired_after:.1?} after the slowdown began; records: {:?}", names(&traced.events));
    let waits = of_signal(&traced.events, "wait_per_launch");
    assert_eq!(waits.iter().map(|e| e["state"].as_str().unwrap()).collect::<Vec<_>>(), vec!["pending", "firing", "resolved"]);
    let f = waits[1];
    assert_eq!((f["alert"].as_str(), f["cause"].as_str(), f["gpu"].as_str()), (Some("CudatraceGpuThrottled"), Some("throttling"), Some("0")));
    assert_eq!(f["victim"]["pid"].as_u64(), Some(victim_pid));
    assert_eq!(f["aggressors"], serde_json::json!([]));
    assert_eq!(f["evidence"]["clock_event_reasons"], serde_json::json!(["hw_thermal_slowdown"]));
    assert_eq!(f["evidence"]["gpu_utilization"].as_f64(), Some(0.9));
    assert_eq!(f["evidence"]["gpu_memory_used_ratio"].as_f64(), Some(4294967296.0 / 85899345920.0));
    assert_eq!(waits[2]["reason"], "victim_exited");
    assert!(traced.events.iter().all(|e| e["victim"]["pid"].as_u64() == Some(victim_pid)), "{:?}", traced.events);
}

/// A job copying to its GPU slows down while another process copies to the same GPU: copy
/// contention, naming the copier (not compute, though both are busy with the device).
#[test]
fn copy_contention_names_the_copier() {
    let Some(env) = env() else { return };
    let (daemon, listen) = Tracer::start_daemon_on_loopback(&env, &[], &[]);
    let dev = device_file("copies");
    let vars = [("CUDA_STANDIN_DEVICE", dev.as_str()), ("CUDA_VISIBLE_DEVICES", "0")];
    // 4 MiB synchronous copies (0.4 ms at the stand-in's 10 GB/s), 1 ms apart.
    let victim = spawn_workload_as(&env, "model-server", &vars, &["copies", "400", "4194304", "1000"]);
    let victim_pid = pid(&victim);
    let learned = daemon.wait_stderr(Duration::from_secs(60), baseline_line(victim_pid, "copy_time_per_mib"));
    assert!(learned.is_some(), "no baseline within 60 s: {:?}", daemon.stderr_now());
    // 64 MiB copies back to back: the copy engine is always busy.
    let loader = spawn_workload_as(&env, "data-loader", &vars, &["copies", "60", "67108864", "0"]);
    let loader_pid = pid(&loader);
    let (fired_after, traced) = fire_then_exit(&listen, daemon, victim, loader, "copy_time_per_mib");
    eprintln!("e2e copy_contention_names_the_copier: fired {fired_after:.1?} after the copier began; records: {:?}", names(&traced.events));
    let copies = of_signal(&traced.events, "copy_time_per_mib");
    assert_eq!(copies.iter().map(|e| e["state"].as_str().unwrap()).collect::<Vec<_>>(), vec!["pending", "firing", "resolved"]);
    let f = copies[1];
    assert_eq!((f["alert"].as_str(), f["cause"].as_str(), f["gpu"].as_str()), (Some("CudatraceCopyContention"), Some("copy_contention"), Some("0")));
    assert_eq!(f["evidence"]["unit"], "seconds_per_mib");
    assert_eq!(f["aggressors"], serde_json::json!([{"pid": loader_pid, "comm": "data-loader", "container": null, "pod": null, "share": 1.0}]));
    assert_eq!(copies[2]["reason"], "victim_exited");
    assert!(traced.events.iter().all(|e| e["victim"]["pid"].as_u64() == Some(victim_pid)), "{:?}", traced.events);
}

/// Waits (up to 60 s) until the metrics show the victim's `signal` alert firing, then ends the
/// load and the victim, lets a window pass so the victim's exit resolves the alert, and stops
/// the daemon. Returns how long firing took (panics when it did not fire) and what it printed.
fn fire_then_exit(listen: &str, daemon: Tracer, mut victim: Child, mut load: Child, signal: &str) -> (Duration, integration_tests::Traced) {
    let victim_pid = victim.id();
    let start = Instant::now();
    let firing = poll(Duration::from_secs(60), || {
        let text = http_get(&format!("http://{listen}/metrics"), None);
        text.lines()
            .any(|l| {
                l.starts_with("cudatrace_alert_active{")
                    && l.contains("state=\"firing\"")
                    && l.contains(&format!("signal=\"{signal}\""))
                    && l.contains(&format!("pid=\"{victim_pid}\""))
            })
            .then_some(())
    });
    let fired_after = start.elapsed();
    for child in [&mut load, &mut victim] {
        let _ = child.kill();
        let _ = child.wait();
    }
    std::thread::sleep(Duration::from_secs(6));
    let traced = daemon.stop();
    assert!(firing.is_some(), "no firing {signal} alert within 60 s: {:?}", traced.events);
    (fired_after, traced)
}

fn of_signal<'a>(events: &'a [Value], signal: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["evidence"]["signal"] == signal).collect()
}

/// alert/signal/state of each record.
fn names(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| format!("{}/{}/{}", e["alert"].as_str().unwrap(), e["evidence"]["signal"].as_str().unwrap(), e["state"].as_str().unwrap()))
        .collect()
}
