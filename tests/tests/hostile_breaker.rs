//! End-to-end (issue 56, item 1): the probe-harm breaker is no off switch one tenant can pull.
//! Tenant A (a top-level cgroup of its own) faults on purpose right after probed calls while
//! tenant B's job uses the same library: a fault it makes itself (the entry's page made
//! non-executable, SIGILL sent to itself, a call below mmap_min_addr) is its own; a fault that
//! looks like the probe's harm is only suspected (`CudatraceProbeHarmSuspected`, a warning naming
//! tenant A); nothing is detached, B's next job is counted in full, and a daemon restarted on
//! the same state dir attaches. Then B faults the same way: a second tenant corroborates it and
//! the breaker opens (`CudatraceProbeHarm`, naming A as the first), held across a restart; and
//! half-open once the kernel it opened on is not the running one.
use std::time::Duration;

use integration_tests::{
    breaker::{breaker, refused_restart, state_config},
    device_file, env, exposition,
    guards::{Cgroup, TempDir},
    http, Cudatrace, Env, Scenario, Workload,
};
use serde_json::Value;

/// A process of tenant `cg` that faults `how` after a probed call (`in-call`: the stand-in's
/// own SIGILL 16 bytes past cuCtxSynchronize's entry, as a probe's harm looks); its pid and
/// the signal it died of.
fn fault(env: &Env, cg: &Cgroup, how: &str) -> (u64, Option<i32>) {
    let w = match how {
        "in-call" => Workload::new(env, Scenario::Named("fault-in-call", vec![]))
            .var("CUDA_STANDIN_FAULT", "1"),
        "noexec" => Workload::new(env, Scenario::Named("fault-self-noexec", vec![])),
        "raise" => Workload::new(env, Scenario::Named("fault-self-raise", vec![])),
        _ => Workload::new(env, Scenario::Named("fault-self-null", vec![])),
    };
    let running = w.cgroup(cg.path()).spawn();
    let pid = running.pid();
    let status = running.status();
    (pid, std::os::unix::process::ExitStatusExt::signal(&status))
}

/// The daemon's line of `event` about `pid` (within 10 s, else the test fails with its stderr).
fn said(daemon: &Cudatrace, event: &str, pid: u64) -> Value {
    daemon
        .wait_event(Duration::from_secs(10), event, |r| {
            r["pid"].as_u64() == Some(pid)
        })
        .unwrap_or_else(|| panic!("no {event} for pid {pid}: {:?}", daemon.stderr_now()))
}

/// Alerts of `name` in what a daemon printed.
fn alerts<'a>(events: &'a [Value], name: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["alert"] == name).collect()
}

/// `name`'s samples summed, with `labels`.
fn metric(listen: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    exposition::sum(&exposition::parse(&http::scrape(listen)), name, labels)
}

#[test]
fn one_tenants_faults_never_switch_tracing_off_for_the_others() {
    let Some(env) = env() else { return };
    let dir = TempDir::new("hostile-breaker");
    let config = state_config(&dir);
    let cfg = config.as_str();
    let lib = std::fs::canonicalize(env.libcuda()).unwrap();
    let library = lib.to_str().unwrap();
    let (a, b) = (Cgroup::top("tenant-a"), Cgroup::top("tenant-b"));
    let unit_a = format!("/{}", a.path().file_name().unwrap().to_str().unwrap());
    let unit_b = format!("/{}", b.path().file_name().unwrap().to_str().unwrap());
    let dev = device_file("hostile-breaker");
    let probes = tracer_common::Api::ALL.len() as f64;

    let (daemon, listen) = Cudatrace::start_daemon_on_loopback(&env, &["--config", cfg], &[]);
    // Tenant B's job uses the library meanwhile.
    let steady = Scenario::Loop {
        seconds: 14.0,
        grid: 1,
        sync_every: 10,
    };
    let b_job = Workload::new(&env, steady)
        .device(&dev)
        .cgroup(b.path())
        .spawn();
    std::thread::sleep(Duration::from_secs(2));

    // Faults tenant A makes itself: its own, whatever their PC.
    let mut own = Vec::new();
    for (how, signal, why) in [
        ("noexec", libc::SIGSEGV, "non-executable"),
        ("raise", libc::SIGILL, "sent from user space"),
        ("null", libc::SIGSEGV, "mmap_min_addr"),
    ] {
        let (pid, died) = fault(&env, &a, how);
        assert_eq!(died, Some(signal), "{how}");
        let seen = said(&daemon, "own_fault", pid);
        let msg = seen["msg"].as_str().unwrap();
        // `raise` faults in libc's code, and `null` may be judged before its maps are read:
        // either is away from the probe, its own either way.
        assert!(
            msg.contains(why) || (how != "noexec" && msg.contains("away from the probe")),
            "{how}: {msg}"
        );
        own.push(pid);
    }
    // A fault that looks like the probe's harm, from tenant A alone: suspected only.
    let (suspect, died) = fault(&env, &a, "in-call");
    assert_eq!(died, Some(libc::SIGILL));
    let line = said(&daemon, "probe_harm_suspected", suspect);
    assert_eq!(line["tenant"].as_str(), Some(unit_a.as_str()));
    // The same fault from another of A's processes: counted, not alerted on again (a tenant
    // faulting from many processes raises one alert, not one each).
    let (repeat, _) = fault(&env, &a, "in-call");
    let line = said(&daemon, "probe_harm_suspected", repeat);
    assert!(
        line["msg"].as_str().unwrap().contains("counted only"),
        "{line}"
    );
    assert_eq!(
        metric(&listen, "cudatrace_probe_attached", &[("library", library)]),
        probes,
        "nothing detached"
    );
    assert_eq!(metric(&listen, "cudatrace_probe_harm_total", &[]), 0.0);
    assert_eq!(
        metric(
            &listen,
            "cudatrace_probe_harm_suspected_total",
            &[("library", library), ("symbol", "cuCtxSynchronize")]
        ),
        2.0
    );
    assert_eq!(
        metric(&listen, "cudatrace_probe_breaker_open", &[]),
        0.0,
        "no breaker open"
    );
    b_job.finish();
    // B's next job is counted in full.
    let report = Workload::new(
        &env,
        Scenario::Basic {
            launches: 5000,
            copies: 0,
        },
    )
    .device(&dev)
    .cgroup(b.path())
    .settle_ms(300)
    .run();
    let job = report["pid"].as_u64().unwrap().to_string();
    let counted = exposition::wait_for_launches(&listen, &job, 5000.0, Duration::from_secs(10));
    eprintln!(
        "e2e hostile_breaker: tenant A's 3 self-made faults own, 2 harm-looking faults suspected (probe_harm_suspected_total {}, probe_harm_total {}), probes attached {} of {probes}; tenant B's next job: launches in=5000 counted={counted:?}",
        metric(&listen, "cudatrace_probe_harm_suspected_total", &[]),
        metric(&listen, "cudatrace_probe_harm_total", &[]) + 0.0,
        metric(&listen, "cudatrace_probe_attached", &[("library", library)])
    );
    assert_eq!(
        counted,
        Some(5000.0),
        "tenant B's next job, counted in full"
    );
    let traced = daemon.stop();
    assert!(alerts(&traced.events, "CudatraceProbeHarm").is_empty());
    let suspected = alerts(&traced.events, "CudatraceProbeHarmSuspected");
    assert_eq!(suspected.len(), 1, "{:?}", traced.events);
    let s = suspected[0];
    assert_eq!(
        (
            s["state"].as_str(),
            s["severity"].as_str(),
            s["cause"].as_str()
        ),
        (
            Some("firing"),
            Some("warning"),
            Some("probe_harm_suspected")
        )
    );
    assert_eq!(s["victim"]["pid"].as_u64(), Some(suspect));
    assert_eq!(s["aggressors"].as_array().map(Vec::len).unwrap_or(0), 0);
    let chain = s["evidence"]["chain"].to_string();
    assert!(
        chain.contains(&unit_a) && chain.contains("cuCtxSynchronize"),
        "{chain}"
    );
    // Nobody else is named: the own faults and the repeated one raised nothing but, being
    // crashes of A's own, perhaps its restart loop.
    for pid in own.iter().chain([&repeat]) {
        let named: Vec<&Value> = traced
            .events
            .iter()
            .filter(|e| e["victim"]["pid"].as_u64() == Some(*pid))
            // Its crashes are its own: they may count toward its restart loop.
            .filter(|e| e["cause"] != "restart_loop")
            .collect();
        assert!(named.is_empty(), "pid {pid} named: {named:?}");
    }
    assert!(breaker(&env, cfg, &[]).contains("no probe-harm breaker is open"));

    // Restarted on the same state dir: it attaches. B's job runs; A faults the same way again
    // (suspicions are not kept across a restart: suspected again), then B does: a second
    // tenant, so the breaker opens, naming A as the first.
    let (daemon, listen) = Cudatrace::start_daemon_on_loopback(&env, &["--config", cfg], &[]);
    assert_eq!(
        metric(&listen, "cudatrace_probe_attached", &[("library", library)]),
        probes
    );
    let b_job = Workload::new(&env, steady_again())
        .device(&dev)
        .cgroup(b.path())
        .spawn();
    std::thread::sleep(Duration::from_secs(2));
    let (again, _) = fault(&env, &a, "in-call");
    assert_eq!(
        said(&daemon, "probe_harm_suspected", again)["tenant"].as_str(),
        Some(unit_a.as_str())
    );
    let (second, died) = fault(&env, &b, "in-call");
    assert_eq!(died, Some(libc::SIGILL));
    let line = said(&daemon, "probe_harm", second);
    let msg = line["msg"].as_str().unwrap();
    assert!(
        msg.contains("a second tenant faulted the same way") && msg.contains(&unit_a),
        "{msg}"
    );
    assert!(msg.contains(&unit_b), "the second tenant named: {msg}");
    assert_eq!(
        metric(
            &listen,
            "cudatrace_probe_breaker_open",
            &[("library", library)]
        ),
        1.0
    );
    b_job.finish();
    let traced = daemon.stop();
    let harm = alerts(&traced.events, "CudatraceProbeHarm");
    assert_eq!(harm.len(), 1, "{:?}", traced.events);
    assert_eq!(harm[0]["victim"]["pid"].as_u64(), Some(second));
    assert_eq!(harm[0]["severity"].as_str(), Some("critical"));
    assert_eq!(
        alerts(&traced.events, "CudatraceProbeHarmSuspected")
            .iter()
            .map(|e| e["victim"]["pid"].as_u64())
            .collect::<Vec<_>>(),
        vec![Some(again)]
    );
    // Corroborated: held across a restart until cleared.
    let listed = breaker(&env, cfg, &[]);
    assert!(
        listed.contains(library) && listed.contains("second tenant"),
        "{listed}"
    );
    refused_restart(&env, cfg, library);

    // Opened on another kernel (as after a kernel update): half-open, so a restart attaches the
    // library again, and its next harm opens it at once, whoever made it.
    let file = dir.join("state/baselines/probe-breaker.json");
    let mut kept: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    kept[0]["kernel"] = "5.10.0-before-the-update".into();
    std::fs::write(&file, kept.to_string()).unwrap();
    let (daemon, listen) = Cudatrace::start_daemon_on_loopback(&env, &["--config", cfg], &[]);
    assert!(
        daemon
            .stderr_now()
            .iter()
            .any(|l| l.contains("5.10.0-before-the-update") && l.contains("half-open")),
        "{:?}",
        daemon.stderr_now()
    );
    assert_eq!(
        metric(&listen, "cudatrace_probe_attached", &[("library", library)]),
        probes
    );
    let (tripped, _) = fault(&env, &a, "in-call");
    let msg = said(&daemon, "probe_harm", tripped)["msg"].to_string();
    assert!(msg.contains("half-open"), "{msg}");
    assert_eq!(
        metric(
            &listen,
            "cudatrace_probe_breaker_open",
            &[("library", library)]
        ),
        1.0
    );
    drop(daemon.stop());
    refused_restart(&env, cfg, library);
    assert!(breaker(&env, cfg, &["--clear", library]).contains("cleared 1"));
    let _ = std::fs::remove_file(&dev);
}

/// Tenant B's steady job of the second round.
fn steady_again() -> Scenario {
    Scenario::Loop {
        seconds: 10.0,
        grid: 1,
        sync_every: 10,
    }
}
