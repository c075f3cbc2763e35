//! End-to-end: OTLP export of slow driver calls. A workload whose every wait takes 2 ms gives
//! exactly one span per wait (over http/protobuf and over gRPC), with its process, thread,
//! result, stream and workload, and the configured header; a collector down for 10 s costs
//! dropped spans, counted, and export resumes when it is back, memory flat.
use std::time::{Duration, Instant};

use integration_tests::{
    alerting::looping, device_file, env, exposition, guards::TempDir, otlp::Receiver, Cudatrace,
};

/// The daemon exporting to `url` over `protocol`, with `extra` lines in `[otlp]`.
fn daemon(
    env: &integration_tests::Env,
    dir: &TempDir,
    url: &str,
    protocol: &str,
    extra: &str,
) -> (Cudatrace, String) {
    let config = dir.write(
        "cudatrace.toml",
        &format!("[otlp]\nendpoint = {url:?}\nprotocol = {protocol:?}\nheaders = {{ x-tenant = \"gpu-team\" }}\n{extra}"),
    );
    Cudatrace::start_daemon_on_loopback(env, &["--config", config.to_str().unwrap()], &[])
}

/// A metric's value in a scrape, its series with these labels summed (0 when absent).
fn metric(listen: &str, name: &str, with: &[(&str, &str)]) -> f64 {
    exposition::sum(
        &exposition::parse(&integration_tests::http::scrape(listen)),
        name,
        with,
    )
}

fn slow_waits(protocol: &str) {
    let Some(env) = env() else { return };
    let receiver = Receiver::start();
    let dir = TempDir::new("otlp");
    let (daemon, listen) = daemon(&env, &dir, &receiver.url(), protocol, "");
    let dev = device_file("otlp");
    // 2 ms kernels, a wait after each: every wait but the last (on an idle stream) is slow.
    let report = looping(&env, 1.0, 2000, 1)
        .vars(&[
            ("CUDA_STANDIN_DEVICE", dev.as_str()),
            ("CUDA_STANDIN_NS_PER_BLOCK", "1000"),
        ])
        .run();
    let (pid, launches) = (
        report["pid"].as_u64().unwrap(),
        report["launches"].as_u64().unwrap() as usize,
    );
    let stream = format!("{:#x}", report["stream"].as_u64().unwrap());
    let spans = receiver.wait_for(launches, Duration::from_secs(15));
    std::thread::sleep(Duration::from_secs(2));
    let spans_after = receiver.spans();
    let sent = metric(&listen, "cudatrace_otlp_sent_total", &[("signal", "spans")]);
    let dropped = metric(
        &listen,
        "cudatrace_otlp_dropped_total",
        &[("signal", "spans")],
    );
    let traced = daemon.stop();
    eprintln!(
        "e2e otlp_{protocol}: waits of 2 ms in={launches} spans out={} (after 2 s more: {}), sent={sent} dropped={dropped}; first {:?}",
        spans.len(),
        spans_after.len(),
        spans.first().map(|s| (&s.span.name, &s.attributes, &s.resource))
    );
    assert_eq!(spans_after.len(), launches, "{:?}", traced.stderr);
    assert_eq!((sent, dropped), (launches as f64, 0.0));
    for s in &spans_after {
        assert_eq!(s.span.name, "cuStreamSynchronize");
        assert_eq!(s.protocol, if protocol == "grpc" { "grpc" } else { "http" });
        assert_eq!(
            s.headers.get("x-tenant").map(String::as_str),
            Some("gpu-team")
        );
        let a = &s.attributes;
        assert_eq!(a["process.pid"], pid.to_string());
        assert_eq!(a["thread.id"], pid.to_string());
        assert_eq!(a["process.executable.name"], "cuda-workload");
        assert_eq!(a["cuda.result"], "0");
        assert_eq!(a["cuda.stream"], stream);
        assert!(!a["host.name"].is_empty());
        let took = s.span.end_time_unix_nano - s.span.start_time_unix_nano;
        assert!((1_000_000..20_000_000).contains(&took), "{took} ns");
        assert!(
            s.resource["service.name"].ends_with(":cuda-workload"),
            "{:?}",
            s.resource
        );
        assert_eq!(s.resource["service.name"], s.resource["cudatrace.workload"]);
        assert_eq!(s.span.trace_id.len(), 16);
        assert_eq!(s.span.span_id.len(), 8);
    }
    // Real start times: within the run, in wall-clock time.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    assert!(spans_after
        .iter()
        .all(|s| s.span.start_time_unix_nano + 60_000_000_000 > now
            && s.span.start_time_unix_nano < now));
    assert_eq!(traced.code, Some(0), "{:?}", traced.stderr);
}

#[test]
fn otlp_http_protobuf_gives_a_span_per_slow_wait() {
    slow_waits("http/protobuf");
}

#[test]
fn otlp_grpc_gives_a_span_per_slow_wait() {
    slow_waits("grpc");
}

/// The collector goes away for 10 s while waits keep coming: the queue (64) fills, the rest is
/// dropped and counted; when it is back, spans come again; every slow wait is either sent or
/// counted dropped; the daemon's memory stays flat.
#[test]
fn otlp_collector_down_then_back_drops_counted_and_resumes() {
    let Some(env) = env() else { return };
    let receiver = Receiver::start();
    let port = receiver.addr.port();
    let dir = TempDir::new("otlp-down");
    let (daemon, listen) = daemon(
        &env,
        &dir,
        &receiver.url(),
        "http/protobuf",
        "max_queue = 64\ntimeout_s = 1\n",
    );
    let rss = |pid: u32| -> u64 {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
            .unwrap_or(0)
    };
    let dev = device_file("otlp-down");
    let job = looping(&env, 20.0, 2000, 1)
        .vars(&[
            ("CUDA_STANDIN_DEVICE", dev.as_str()),
            ("CUDA_STANDIN_NS_PER_BLOCK", "1000"),
        ])
        .spawn();
    std::thread::sleep(Duration::from_secs(4));
    let before_down = receiver.spans().len();
    let rss_up = rss(daemon.pid());
    drop(receiver);
    std::thread::sleep(Duration::from_secs(10));
    let rss_down = rss(daemon.pid());
    let back_at = Instant::now();
    let receiver = Receiver::start_on(port);
    let report = job.finish();
    let launches = report["launches"].as_u64().unwrap() as f64;
    // Every slow wait is sent or dropped, once the queue has drained.
    let start = Instant::now();
    let (mut sent, mut dropped) = (0.0, 0.0);
    while start.elapsed() < Duration::from_secs(20) {
        sent = metric(&listen, "cudatrace_otlp_sent_total", &[("signal", "spans")]);
        dropped = metric(
            &listen,
            "cudatrace_otlp_dropped_total",
            &[("signal", "spans")],
        );
        if sent + dropped >= launches {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let after = receiver.spans().len();
    let failures = metric(&listen, "cudatrace_otlp_export_failures_total", &[]);
    let traced = daemon.stop();
    eprintln!(
        "e2e otlp_collector_down_then_back_drops_counted_and_resumes: waits in={launches} sent={sent} dropped={dropped} failed exports={failures}; spans before down {before_down}, after back ({:?} up) {after}; VmRSS up {rss_up} kB, down {rss_down} kB",
        back_at.elapsed()
    );
    assert!(before_down > 0);
    assert!(
        after > 0,
        "no span after the collector came back: {:?}",
        traced.stderr
    );
    assert!(dropped > 0.0);
    assert!(failures > 0.0);
    assert_eq!(sent + dropped, launches);
    assert!(
        rss_down < rss_up + 8 * 1024,
        "RSS grew {rss_up} -> {rss_down} kB"
    );
    let said: Vec<&String> = traced
        .stderr
        .iter()
        .filter(|l| l.starts_with("otlp: "))
        .collect();
    assert_eq!(said.len(), 2, "{said:?}");
    assert!(
        said[0].contains("failed") && said[1].contains("work again"),
        "{said:?}"
    );
}
