//! End-to-end (issue 44): cudatrace suspects itself first. A stand-in entry point made to fault
//! a few instructions past its entry (what a probe resuming at the wrong place does) counts
//! `cudatrace_probe_harm_total`, opens the library's breaker (its probes detached, kept in the
//! state dir across a restart until `cudatrace breaker --clear`) and fires a critical
//! `CudatraceProbeHarm` naming the process; a workload's own crash, away from any probe, trips
//! nothing and stays its own.
use std::time::Duration;

use integration_tests::{
    breaker::{breaker, refused_restart, state_config},
    env, exposition,
    guards::TempDir,
    http, Cudatrace, Scenario, Workload,
};

#[test]
fn a_fault_past_a_probed_entry_opens_the_breaker_and_the_workloads_own_does_not() {
    let Some(env) = env() else { return };
    let dir = TempDir::new("breaker");
    let config = state_config(&dir);
    let cfg = config.as_str();
    let lib = std::fs::canonicalize(env.libcuda()).unwrap();
    let library = lib.to_str().unwrap();
    let (daemon, listen) = Cudatrace::start_daemon_on_loopback(&env, &["--config", cfg], &[]);

    // The workload's own crash: a SIGSEGV in its own code, a moment after probed calls.
    let own = Workload::new(&env, Scenario::Named("fault-own", vec![])).spawn();
    let own_pid = own.pid();
    let status = own.status();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(libc::SIGSEGV)
    );
    let seen = daemon.wait_event(Duration::from_secs(10), "own_fault", |r| {
        r["pid"].as_u64() == Some(own_pid)
    });
    assert!(
        seen.is_some(),
        "the own fault was not examined: {:?}",
        daemon.stderr_now()
    );

    // The probe's harm, as seen: SIGILL 16 bytes past cuCtxSynchronize's entry.
    let harmed = Workload::new(&env, Scenario::Named("fault-in-call", vec![]))
        .var("CUDA_STANDIN_FAULT", "1")
        .spawn();
    let harmed_pid = harmed.pid();
    let status = harmed.status();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(libc::SIGILL)
    );
    let line = daemon
        .wait_event(Duration::from_secs(10), "probe_harm", |r| {
            r["pid"].as_u64() == Some(harmed_pid)
        })
        .unwrap_or_else(|| panic!("no probe_harm: {:?}", daemon.stderr_now()));
    let msg = line["msg"].as_str().unwrap();
    assert!(
        msg.contains("SIGILL") && msg.contains("bytes past the probed entry of cuCtxSynchronize"),
        "{msg}"
    );
    let samples = exposition::parse(&http::scrape(&listen));
    let harm = exposition::sum(
        &samples,
        "cudatrace_probe_harm_total",
        &[
            ("library", library),
            ("symbol", "cuCtxSynchronize"),
            ("signal", "SIGILL"),
        ],
    );
    assert_eq!(harm, 1.0, "exactly the one harm, of that symbol and signal");
    assert_eq!(
        exposition::sum(&samples, "cudatrace_probe_harm_total", &[]),
        1.0
    );
    assert_eq!(
        exposition::sum(
            &samples,
            "cudatrace_probe_breaker_open",
            &[("library", library)]
        ),
        1.0
    );
    assert_eq!(
        exposition::sum(
            &samples,
            "cudatrace_probe_attached",
            &[("library", library)]
        ),
        0.0,
        "the library's probes are detached"
    );
    // Detached: a later process's calls are not traced.
    let after = Workload::new(&env, Scenario::Named("fault-own", vec![])).spawn();
    let after_pid = after.pid().to_string();
    let _ = after.status();
    std::thread::sleep(Duration::from_millis(500));
    let samples = exposition::parse(&http::scrape(&listen));
    assert_eq!(
        exposition::sum(
            &samples,
            "cudatrace_calls_total",
            &[("pid", after_pid.as_str())]
        ),
        0.0
    );
    let traced = daemon.stop();
    let alerts: Vec<_> = traced
        .events
        .iter()
        .filter(|e| e["alert"] == "CudatraceProbeHarm")
        .collect();
    assert_eq!(alerts.len(), 1, "{:?}", traced.events);
    let a = alerts[0];
    assert_eq!(
        (a["state"].as_str(), a["severity"].as_str()),
        (Some("firing"), Some("critical"))
    );
    assert_eq!(a["victim"]["pid"].as_u64(), Some(harmed_pid));
    assert_eq!(a["cause"], "probe_harm");
    let chain = a["evidence"]["chain"][0].as_str().unwrap();
    assert!(
        chain.contains("cuCtxSynchronize") && chain.contains("kernel "),
        "{chain}"
    );
    // Nobody else is named; the own crash raised nothing.
    assert!(traced
        .events
        .iter()
        .all(|e| e["victim"]["pid"].as_u64() != Some(own_pid)));
    assert!(traced
        .events
        .iter()
        .all(|e| e["alert"] != "CudatraceRestartLoop"));

    // A restart keeps the breaker: the one library is refused, and nothing can be traced.
    refused_restart(&env, cfg, library);
    // The operator lists and clears it; then the library is attached again.
    let out = |args: &[&str]| breaker(&env, cfg, args);
    let listed = out(&[]);
    assert!(
        listed.contains(library) && listed.contains("SIGILL"),
        "{listed}"
    );
    assert!(out(&["--clear", library]).contains("cleared 1"));
    assert!(out(&[]).contains("no probe-harm breaker is open"));
    let (again, _) = Cudatrace::start_daemon_on_loopback(&env, &["--config", cfg], &[]);
    let traced = again.stop();
    assert_eq!(
        traced.summary()["probes"],
        2 * tracer_common::Api::ALL.len() as u64
    );
}
