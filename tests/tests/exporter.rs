//! End-to-end: `cudatrace run` scraped by a real Prometheus server on loopback, with the
//! stand-in NVML replaying a scenario.
use std::{
    io::Write as _,
    process::{Command, Stdio},
    time::Duration,
};

use integration_tests::{
    device_file, env, exposition, free_port, guards::TempDir, http, servers::Prometheus, Cudatrace,
    Scenario, Workload,
};

const SCENARIO: &str = "\
gpu 0 uuid=GPU-11111111-2222-3333-4444-555555555555 sm=75 mem=40 total=85899345920 used=4294967296 temp=65 power_mw=250000 sm_clock=1980 reasons=0x20 pcie_tx_kbs=1000 pcie_rx_kbs=2000
gpu 1 uuid=GPU-66666666-7777-8888-9999-000000000000 sm=5 mem=1 total=85899345920 used=1073741824 temp=40 power_mw=90000 sm_clock=1410 reasons=0x1 pcie_tx_kbs=10 pcie_rx_kbs=20
proc 0 pid=4242 used=1048576 sm=50 memutil=20
";

/// Exact call counts per pid and a p99 consistent with the simulated durations, through
/// PromQL on a real Prometheus; promtool finds the exposition clean; NVML gauges match the
/// replayed scenario; OpenMetrics by content negotiation.
#[test]
fn prometheus_scrapes_exact_counts() {
    let Some(env) = env() else { return };
    let dir = TempDir::new("exporter");
    let scenario = dir.write("nvml.txt", SCENARIO);
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let lib = env.libcuda();
    let nvml = env.libnvml();
    let config = dir.write("cudatrace.toml", "nvml_period_ms = 200\ntop_kernels = 5\n");
    let daemon = Cudatrace::start_daemon(
        &env,
        &[
            "--lib",
            lib.to_str().unwrap(),
            "--listen",
            &listen,
            "--nvml-lib",
            nvml.to_str().unwrap(),
            "--config",
            config.to_str().unwrap(),
        ],
        &[("NVML_STANDIN_SCENARIO", scenario.to_str().unwrap())],
    );
    let prom = Prometheus::start(port);
    let dev = device_file("prom");
    // 20 µs of driver time in every call.
    let report = Workload::new(
        &env,
        Scenario::Basic {
            launches: 3000,
            copies: 400,
        },
    )
    .device(&dev)
    .vars(&[
        ("CUDA_STANDIN_CALL_NS", "20000"),
        ("CUDA_STANDIN_NS_PER_BLOCK", "1"),
    ])
    .run();
    let pid = report["pid"].as_u64().unwrap();

    let launches = prom.wait_for(
        &format!("cudatrace_calls_total{{pid=\"{pid}\",api=\"cuLaunchKernel\"}}"),
        3000.0,
    );
    let htod = prom.wait_for(
        &format!("cudatrace_calls_total{{pid=\"{pid}\",api=\"cuMemcpyHtoD_v2\"}}"),
        200.0,
    );
    let dtoh = prom.wait_for(
        &format!("cudatrace_calls_total{{pid=\"{pid}\",api=\"cuMemcpyDtoH_v2\"}}"),
        200.0,
    );
    let bytes = prom.query(&format!(
        "sum(cudatrace_memcpy_bytes_total{{pid=\"{pid}\",direction=\"htod\"}})"
    ));
    let p99 = prom.query(&format!(
        "histogram_quantile(0.99, sum by (le) (cudatrace_call_duration_seconds_bucket{{pid=\"{pid}\",api=\"cuLaunchKernel\"}}))"
    ));
    let sketch_p99 = prom.query(&format!(
        "cudatrace_call_duration_quantile_seconds{{pid=\"{pid}\",api=\"cuLaunchKernel\",window=\"all\",q=\"0.99\"}}"
    ));
    let sketch_p50 = prom.query(&format!(
        "cudatrace_call_duration_quantile_seconds{{pid=\"{pid}\",api=\"cuLaunchKernel\",window=\"1m\",q=\"0.5\"}}"
    ));
    let kernel = prom.query(&format!(
        "cudatrace_calls_total{{pid=\"{pid}\",api=\"cuLaunchKernel\"}}"
    ));
    eprintln!(
        "e2e prometheus_scrapes_exact_counts: launches in=3000 promql={launches} htod in=200 promql={htod} dtoh in=200 promql={dtoh} \
         p99(histogram)={:?} p99(sketch)={:?} p50(sketch,1m)={:?}",
        p99.first().map(|v| v.1),
        sketch_p99.first().map(|v| v.1),
        sketch_p50.first().map(|v| v.1)
    );
    assert_eq!((launches, htod, dtoh), (3000.0, 200.0, 200.0));
    // Copy j of the one thread moves 1024 + 16 j bytes, host to device when j is even.
    let want_bytes: u64 = (0..400u64)
        .filter(|j| j % 2 == 0)
        .map(|j| 1024 + 16 * j)
        .sum();
    assert_eq!(bytes[0].1, want_bytes as f64);
    // Every call spins 20 µs in the library: no quantile can be below that. The median sits just
    // above it; the tail carries the probes and, on 2 cores, preemption by the tracer and
    // Prometheus, so p99 is bounded by the 250 µs bucket rather than pinned.
    let p99 = p99[0].1;
    assert!(
        (20e-6..=250e-6).contains(&p99),
        "histogram p99 {p99} s for 20 µs calls"
    );
    let sketch_p99 = sketch_p99[0].1;
    assert!(
        (20e-6..=250e-6).contains(&sketch_p99),
        "sketch p99 {sketch_p99} s for 20 µs calls"
    );
    let p50 = sketch_p50[0].1;
    assert!(
        (20e-6..=40e-6).contains(&p50),
        "sketch p50 {p50} s for 20 µs calls"
    );
    assert!(p50 <= sketch_p99);
    assert_eq!(kernel[0].0["kernel"], "hidden_gemm(float*, float*, int)");
    // Outside Kubernetes, a process's workload is its executable and its command name.
    let exe = std::fs::canonicalize(env.workload()).unwrap();
    assert_eq!(
        kernel[0].0["workload"],
        format!("{}:cuda-workload", exe.display()).as_str()
    );

    // NVML gauges, as replayed.
    for (q, want) in [
        ("cudatrace_nvml_up", 1.0),
        ("cudatrace_gpu_utilization_ratio{gpu=\"0\",uuid=\"GPU-11111111-2222-3333-4444-555555555555\"}", 0.75),
        ("cudatrace_gpu_utilization_ratio{gpu=\"1\"}", 0.05),
        ("cudatrace_gpu_memory_used_bytes{gpu=\"0\"}", 4294967296.0),
        ("cudatrace_gpu_temperature_celsius{gpu=\"0\"}", 65.0),
        ("cudatrace_gpu_power_watts{gpu=\"1\"}", 90.0),
        ("cudatrace_gpu_sm_clock_hertz{gpu=\"0\"}", 1.98e9),
        ("cudatrace_gpu_clock_event_reason{gpu=\"0\",reason=\"sw_thermal_slowdown\"}", 1.0),
        ("cudatrace_gpu_clock_event_reason{gpu=\"0\",reason=\"gpu_idle\"}", 0.0),
        ("cudatrace_gpu_pcie_throughput_bytes_per_second{gpu=\"0\",direction=\"rx\"}", 2048000.0),
        ("cudatrace_gpu_process_memory_bytes{gpu=\"0\",pid=\"4242\"}", 1048576.0),
        ("cudatrace_gpu_process_sm_utilization_ratio{gpu=\"0\",pid=\"4242\"}", 0.5),
        ("cudatrace_events_dropped_total{reason=\"ring_full\"}", 0.0),
        ("cudatrace_events_dropped_total{reason=\"rate_limit\"}", 0.0),
    ] {
        assert_eq!(prom.wait_for(q, want), want, "{q}");
    }

    // The exposition itself: promtool is clean, OpenMetrics on request.
    let text = http::scrape(&listen);
    let mut check = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    check
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = check.wait_with_output().unwrap();
    let lint = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && lint.trim().is_empty(),
        "promtool check metrics: {lint}"
    );
    let om = http::get(
        &format!("http://{listen}/metrics"),
        Some("application/openmetrics-text; version=1.0.0"),
    );
    assert!(
        om.trim_end().ends_with("# EOF"),
        "OpenMetrics ends with # EOF"
    );
    assert!(!text.contains("# EOF"));

    drop(prom);
    let traced = daemon.stop();
    assert_eq!(traced.code, Some(0));
}

/// Without NVML the daemon runs on, says why once, and reports nvml_up 0; a taken port and a
/// bad config are one line each.
#[test]
fn runs_without_nvml_and_reports_bad_input() {
    let Some(env) = env() else { return };
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let lib = env.libcuda();
    let missing = env.standin.join("no-such-libnvidia-ml.so.1");
    let daemon = Cudatrace::start_daemon(
        &env,
        &[
            "--lib",
            lib.to_str().unwrap(),
            "--listen",
            &listen,
            "--nvml-lib",
            missing.to_str().unwrap(),
        ],
        &[],
    );
    std::thread::sleep(Duration::from_millis(1500));
    let text = http::scrape(&listen);
    let samples = exposition::parse(&text);
    let nvml_up: Vec<f64> = exposition::select(&samples, "cudatrace_nvml_up", &[])
        .iter()
        .map(|s| s.value)
        .collect();
    assert_eq!(nvml_up, vec![0.0], "{text}");
    assert!(exposition::select(&samples, "cudatrace_gpu_utilization_ratio", &[]).is_empty());
    assert_eq!(
        exposition::select(
            &samples,
            "cudatrace_probe_attached",
            &[("symbol", "cuLaunchKernel")]
        )
        .len(),
        1,
        "{text}"
    );

    // Same port again: one line, before anything is loaded.
    let out = Command::new(&env.bin)
        .args(["run", "--lib", lib.to_str().unwrap(), "--listen", &listen])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains(&format!("port in use: {listen}")), "{err}");
    let traced = daemon.stop();
    let nvml_lines = traced
        .stderr
        .iter()
        .filter(|l| l.contains("NVML unavailable"))
        .count();
    assert_eq!(nvml_lines, 1, "{:?}", traced.stderr);

    let dir = TempDir::new("bad-config");
    let bad = dir.write("bad.toml", "top_kernels = 0\n");
    let out = Command::new(&env.bin)
        .args(["run", "--config", bad.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("bad config") && err.contains("top_kernels = 0"),
        "{err}"
    );

    // Alert settings: a bad detector table and a sink URL it cannot use, one line each.
    std::fs::write(&bad, "[detect]\nwarning = 0.5\n").unwrap();
    let out = Command::new(&env.bin)
        .args(["run", "--config", bad.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("bad config") && err.contains("0 < warning < critical < page"),
        "{err}"
    );
    // A library over max_library_mib is refused unread, in one line.
    let big = dir.join("libcuda.so.1");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(3 << 20)
        .unwrap();
    std::fs::write(&bad, "max_library_mib = 2\n").unwrap();
    let out = Command::new(&env.bin)
        .args([
            "run",
            "--config",
            bad.to_str().unwrap(),
            "--lib",
            big.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        (out.status.code(), err.lines().count()),
        (Some(1), 1),
        "{err}"
    );
    assert!(
        err.contains("is 3145728 bytes, over the 2097152 byte limit"),
        "{err}"
    );
    for (flag, url, want) in [
        (
            "--alertmanager",
            "ftp://am.example:9093",
            "not an http or https URL: give http[s]://HOST[:PORT][/PATH]",
        ),
        (
            "--webhook",
            "hooks.example/x",
            "not a URL: give http[s]://HOST[:PORT][/PATH]",
        ),
    ] {
        let out = Command::new(&env.bin)
            .args(["run", flag, url])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            (out.status.code(), err.lines().count()),
            (Some(1), 1),
            "{err}"
        );
        assert!(
            err.starts_with(&format!("cudatrace: {flag} {url}: {want}")),
            "{err}"
        );
    }
}

/// With a web config file (the Prometheus exporter-toolkit's format) the metrics server speaks
/// TLS only and wants a user's password: a real Prometheus scraping over TLS with the right
/// password counts every launch; the same target with a wrong password, and over plain HTTP,
/// is down; a request without a password gets 401.
#[test]
fn prometheus_scrapes_over_tls_with_basic_auth() {
    let Some(env) = env() else { return };
    let cert = integration_tests::tls::Certificate::new();
    let ca = cert.pem();
    let hash = bcrypt::hash("scrape-s3cret", 10).unwrap();
    // Paths relative to the web config file's folder, as the exporter-toolkit reads them.
    let web = cert.dir.write(
        "web.yml",
        &format!("tls_server_config:\n  cert_file: cert.pem\n  key_file: key.pem\nbasic_auth_users:\n  prometheus: '{hash}'\n"),
    );
    let (daemon, listen) = Cudatrace::start_daemon_on_loopback(
        &env,
        &["--web-config-file", web.to_str().unwrap()],
        &[],
    );
    assert!(
        daemon
            .stderr_now()
            .iter()
            .any(|l| l.ends_with(&format!("metrics at https://{listen}/metrics"))),
        "{:?}",
        daemon.stderr_now()
    );
    let job = |name: &str, extra: &str| {
        format!("  - job_name: {name}\n{extra}    static_configs:\n      - targets: ['{listen}']\n")
    };
    let tls = |password: &str| {
        format!("    scheme: https\n    tls_config:\n      ca_file: {}\n    basic_auth:\n      username: prometheus\n      password: {password}\n", ca.display())
    };
    let prometheus = Prometheus::start_scraping(
        &(job("good", &tls("scrape-s3cret")) + &job("wrong", &tls("not-it")) + &job("plain", "")),
    );
    let dev = device_file("tls");
    let report = Workload::new(
        &env,
        Scenario::Basic {
            launches: 1500,
            copies: 0,
        },
    )
    .device(&dev)
    .run();
    let pid = report["pid"].as_u64().unwrap();
    let counted = prometheus.wait_for(
        &format!("sum(cudatrace_calls_total{{job=\"good\",pid=\"{pid}\",api=\"cuLaunchKernel\"}})"),
        1500.0,
    );
    let up = |job: &str| {
        prometheus.wait_for(
            &format!("up{{job=\"{job}\"}}"),
            if job == "good" { 1.0 } else { 0.0 },
        )
    };
    let (good, wrong, plain) = (up("good"), up("wrong"), up("plain"));
    let plain_get = http::try_get(&format!("http://{listen}/metrics"), None);
    let traced = daemon.stop();
    let _ = std::fs::remove_file(&dev);
    eprintln!(
        "e2e prometheus_scrapes_over_tls_with_basic_auth: launches in=1500 counted over TLS={counted}; up good={good} wrong={wrong} plain={plain}; \
         plain GET: {:?}",
        plain_get.as_ref().map(|b| b.len())
    );
    assert_eq!(counted, 1500.0);
    assert_eq!((good, wrong, plain), (1.0, 0.0, 0.0));
    assert!(plain_get.is_err(), "plain HTTP was answered");
    assert_eq!(traced.code, Some(0), "{:?}", traced.stderr);
}
