//! End-to-end: what a tenant writes into its own environment never becomes unbounded metric
//! series or free text in labels: a 60 KB `CUDA_VISIBLE_DEVICES` of made-up GPUs and escape
//! sequences gives at most 16 `cudatrace_process_gpu` series, and every entry left out is
//! counted.
use std::time::Duration;

use integration_tests::{device_file, env, exposition, http, Cudatrace, Scenario, Workload};

#[test]
fn a_huge_cuda_visible_devices_gives_bounded_series() {
    let Some(env) = env() else { return };
    let (daemon, listen) = Cudatrace::start_daemon_on_loopback(&env, &[], &[]);
    // 6,000 made-up GPU UUIDs (about 60 KB), then an escape sequence and a label-breaker.
    let mut cvd: String = (0..6000).map(|i| format!("GPU-{i},")).collect();
    cvd.push_str("\u{1b}[31mevil,x\"} 1\nforged 1");
    let dev = device_file("huge-cvd");
    let job = Workload::new(
        &env,
        Scenario::Basic {
            launches: 200,
            copies: 0,
        },
    )
    .device(&dev)
    .vars(&[("CUDA_VISIBLE_DEVICES", cvd.as_str())])
    .settle_ms(1000)
    .spawn();
    let pid = job.pid().to_string();
    let counted = exposition::wait_for_launches(&listen, &pid, 200.0, Duration::from_secs(15));
    let text = http::scrape(&listen);
    let samples = exposition::parse(&text);
    let gpus: Vec<&str> = exposition::select(&samples, "cudatrace_process_gpu", &[("pid", &pid)])
        .iter()
        .map(|s| s.label("gpu"))
        .collect();
    let dropped = exposition::sum(
        &samples,
        "cudatrace_table_overflows_total",
        &[("table", "visible_devices")],
    );
    let _ = job.finish();
    let traced = daemon.stop();
    let _ = std::fs::remove_file(&dev);
    eprintln!(
        "e2e a_huge_cuda_visible_devices_gives_bounded_series: CUDA_VISIBLE_DEVICES of {} bytes: launches in=200 counted={counted:?}; \
         {} cudatrace_process_gpu series, {dropped} entries dropped; scrape {} bytes",
        cvd.len(),
        gpus.len(),
        text.len()
    );
    assert_eq!(counted, Some(200.0), "{:?}", traced.stderr);
    let want: Vec<String> = (0..16).map(|i| format!("GPU-{i}")).collect();
    assert_eq!(gpus, want);
    assert_eq!(dropped, (6000 - 16 + 2) as f64);
    assert!(
        !text.contains("evil") && !text.contains("forged"),
        "free text in the exposition"
    );
    assert!(text.len() < 256 * 1024, "scrape of {} bytes", text.len());
}
