//! End-to-end: what serving stacks call, read as they mean it. CUDA graphs (capture, replays),
//! event waits and polling (batches closed, device time), stream joins (no host wait), and
//! entry points reached through `cuGetProcAddress_v2`.
use std::collections::BTreeMap;
use std::time::Duration;

use integration_tests::{device_file, env, exposition, http, Cudatrace, Scenario, Workload};
use serde_json::Value;

/// A graph of 5 named kernels captured (across two streams joined by events) and replayed
/// 1,000 times, while another thread launches 300 times for real during the capture: 1,000
/// runs of each graph kernel and 300 of the direct one in `cudatrace_kernel_runs_total`, none
/// from the capture; the 5 capture-time calls stay driver calls in `cudatrace_calls_total`.
#[test]
fn a_graph_of_k_kernels_launched_n_times_runs_n_times_k_kernels() {
    let Some(env) = env() else { return };
    let (daemon, listen) = Cudatrace::start_daemon_on_loopback(&env, &[], &[]);
    let dev = device_file("graph");
    let report = Workload::new(&env, Scenario::Named("graph", vec![5, 1000, 300]))
        .device(&dev)
        .run();
    let pid = report["pid"].as_u64().unwrap().to_string();
    let with = |extra: &[(&'static str, &'static str)]| {
        let mut w = vec![("pid", pid.clone())];
        w.extend(extra.iter().map(|(k, v)| (*k, (*v).to_owned())));
        w
    };
    let read =
        |samples: &[exposition::Sample], name: &str, extra: &[(&'static str, &'static str)]| {
            let w = with(extra);
            let w: Vec<(&str, &str)> = w.iter().map(|(k, v)| (*k, v.as_str())).collect();
            exposition::sum(samples, name, &w)
        };
    let samples = integration_tests::poll(Duration::from_secs(10), || {
        let s = exposition::parse(&http::scrape(&listen));
        (read(&s, "cudatrace_kernel_runs_total", &[("kernel", "direct()")]) == 300.0
            && read(
                &s,
                "cudatrace_graph_replays_total",
                &[("composition", "known")],
            ) == 1000.0)
            .then_some(s)
    })
    .expect("the runs reach the metrics");
    let traced = daemon.stop();
    let _ = std::fs::remove_file(&dev);
    let mut runs = BTreeMap::new();
    for s in exposition::select(&samples, "cudatrace_kernel_runs_total", &[("pid", &pid)]) {
        runs.insert(s.label("kernel").to_owned(), s.value);
    }
    let calls = |api: &'static str| read(&samples, "cudatrace_calls_total", &[("api", api)]);
    eprintln!(
        "e2e a_graph_of_k_kernels_launched_n_times_runs_n_times_k_kernels: kernel runs {runs:?}, \
         cuLaunchKernel calls {}, cuGraphLaunch calls {}, replays unknown {}",
        calls("cuLaunchKernel"),
        calls("cuGraphLaunch"),
        read(
            &samples,
            "cudatrace_graph_replays_total",
            &[("composition", "unknown")]
        )
    );
    let want: BTreeMap<String, f64> = (0..5)
        .map(|i| (format!("graphk{i}()"), 1000.0))
        .chain([("direct()".to_owned(), 300.0)])
        .collect();
    assert_eq!(runs, want, "named kernel runs, none from the capture");
    assert_eq!(
        calls("cuLaunchKernel"),
        305.0,
        "300 runs and 5 captured calls"
    );
    assert_eq!(calls("cuGraphLaunch"), 1000.0);
    assert_eq!(
        read(
            &samples,
            "cudatrace_graph_replays_total",
            &[("composition", "unknown")]
        ),
        0.0
    );
    assert!(traced
        .stderr
        .iter()
        .any(|l| l == &format!("graphs: pid={pid} captured=1 replays=1000 unknown_composition=0")));
}

/// vLLM's loop (launches, an asynchronous copy, event record, event synchronize) and two
/// polling loops, each alone on the simulated GPU with a known device time: one batch per
/// iteration, `batch_span` within ±10% of the device time; the polls' `CUDA_ERROR_NOT_READY`
/// answers are filtered in the kernel (counted, no record) and are no host wait.
#[test]
fn event_waits_and_polls_close_one_batch_per_iteration() {
    let Some(env) = env() else { return };
    let (daemon, _listen) = Cudatrace::start_daemon_on_loopback(&env, &[], &[]);
    let dev = device_file("evented");
    // 4 launches of 5,000 blocks (2 ms) and 1 MiB copied (0.1 ms) per iteration.
    let runs: Vec<(&str, Value)> = vec![
        (
            "evented",
            Workload::new(
                &env,
                Scenario::Named("evented", vec![100, 4, 5000, 1 << 20]),
            )
            .device(&dev)
            .run(),
        ),
        (
            "polled event",
            Workload::new(&env, Scenario::Polled(100, 4, 5000, "event"))
                .device(&dev)
                .run(),
        ),
        (
            "polled stream",
            Workload::new(&env, Scenario::Polled(100, 4, 5000, "stream"))
                .device(&dev)
                .run(),
        ),
    ];
    let traced = daemon.stop();
    let _ = std::fs::remove_file(&dev);
    let summary = traced.summary();
    let mut not_ready = 0;
    for (what, report) in &runs {
        let (pid, stream) = (
            report["pid"].as_u64().unwrap(),
            report["stream"].as_u64().unwrap(),
        );
        let (batches, span, wait) = traced.device_time(pid, stream);
        let device_ns = report["device_ns"].as_u64().unwrap();
        let ratio = span as f64 / device_ns as f64;
        eprintln!(
            "e2e event_waits_and_polls_close_one_batch_per_iteration: {what}: iterations {} batches {batches}, \
             device time {device_ns} ns, batch_span {span} ns ({ratio:.3}x), host_wait {wait} ns, not_ready {}",
            report["iterations"], report["not_ready"]
        );
        assert_eq!(batches, report["iterations"].as_u64().unwrap(), "{what}");
        assert!(
            (0.9..=1.1).contains(&ratio),
            "{what}: batch_span {ratio:.3}x the device time"
        );
        if what.starts_with("polled") {
            assert_eq!(wait, 0, "{what}: a poll is no host wait");
            not_ready += report["not_ready"].as_u64().unwrap();
        } else {
            // The event synchronize blocked for the device time, less what the host spent
            // submitting.
            let w = wait as f64 / device_ns as f64;
            assert!(
                (0.8..=1.1).contains(&w),
                "{what}: host_wait {w:.3}x the device time"
            );
        }
    }
    assert!(not_ready > 0, "the polls waited");
    assert_eq!(summary["polls_not_ready"], not_ready);
}

/// Polling traced call by call: one record per successful poll, none for a NOT_READY answer.
#[test]
fn a_not_ready_poll_writes_no_record() {
    let Some(env) = env() else { return };
    let lib = env.libcuda();
    let tracer = Cudatrace::start(&env, &["--json", "--lib", lib.to_str().unwrap()]);
    let dev = device_file("polls");
    let report = Workload::new(&env, Scenario::Polled(50, 2, 5000, "event"))
        .device(&dev)
        .run();
    let traced = tracer.stop();
    let _ = std::fs::remove_file(&dev);
    let events = traced.of_pid(report["pid"].as_u64().unwrap());
    let polls: Vec<_> = events
        .iter()
        .filter(|e| e["api"] == "cuEventQuery")
        .collect();
    eprintln!(
        "e2e a_not_ready_poll_writes_no_record: iterations 50, NOT_READY answers {}, cuEventQuery records {}, polls_not_ready {}",
        report["not_ready"],
        polls.len(),
        traced.summary()["polls_not_ready"]
    );
    assert!(report["not_ready"].as_u64().unwrap() > 0);
    assert_eq!(polls.len(), 50);
    assert!(polls
        .iter()
        .all(|e| e["result"] == 0 && e["kind"] == "query"));
    assert_eq!(
        traced.summary()["polls_not_ready"],
        report["not_ready"].as_u64().unwrap()
    );
}

/// Streams joined by `cuStreamWaitEvent` and no host wait: the joins are their own kind, no
/// wait, and close nothing.
#[test]
fn stream_joins_are_no_host_wait() {
    let Some(env) = env() else { return };
    let lib = env.libcuda();
    let tracer = Cudatrace::start(&env, &["--json", "--lib", lib.to_str().unwrap()]);
    let dev = device_file("joins");
    let report = Workload::new(&env, Scenario::Named("join", vec![20, 5]))
        .device(&dev)
        .run();
    let traced = tracer.stop();
    let _ = std::fs::remove_file(&dev);
    let events = traced.of_pid(report["pid"].as_u64().unwrap());
    let joins: Vec<_> = events
        .iter()
        .filter(|e| e["api"] == "cuStreamWaitEvent")
        .collect();
    let waits = events.iter().filter(|e| e["kind"] == "sync").count();
    eprintln!(
        "e2e stream_joins_are_no_host_wait: joins {}, kinds {:?}, host waits {waits}",
        joins.len(),
        joins.first().map(|e| e["kind"].clone())
    );
    assert_eq!(joins.len(), 20);
    assert!(joins.iter().all(|e| e["kind"] == "stream_wait"));
    assert_eq!(waits, 1, "only the final cuCtxSynchronize");
}

/// PyTorch makes no synchronous copy: `.cpu()` is an asynchronous copy, then a wait on its
/// stream. For the user that is one synchronous copy, and `copy_time_per_mib` learns from it.
#[test]
fn an_async_copy_then_its_stream_sync_is_a_synchronous_copy() {
    let Some(env) = env() else { return };
    let dir = integration_tests::guards::TempDir::new("copysync");
    let config = dir.write(
        "cudatrace.toml",
        "[detect]\nwindow_s = 1\nwarmup_windows = 3\n",
    );
    let (daemon, _listen) =
        Cudatrace::start_daemon_on_loopback(&env, &["--config", config.to_str().unwrap()], &[]);
    let dev = device_file("copysync");
    // 4 MiB (0.4 ms at the stand-in's 10 GB/s), 1 ms apart.
    let job = Workload::new(&env, Scenario::Named("copysync", vec![60, 4 << 20, 1000]))
        .device(&dev)
        .spawn();
    let pid = job.pid();
    let learned = daemon.wait_event(Duration::from_secs(40), "baseline", |r| {
        r["pid"].as_u64() == Some(pid) && r["signal"] == "copy_time_per_mib"
    });
    drop(job);
    let traced = daemon.stop();
    let _ = std::fs::remove_file(&dev);
    let learned = learned.unwrap_or_else(|| panic!("no copy baseline: {:?}", traced.stderr));
    // A MiB takes 0.1 ms on the simulated copy engine; the call costs add a little.
    let level = learned["msg"]
        .as_str()
        .and_then(|m| m.split_whitespace().find_map(|f| f.strip_prefix("level=")))
        .and_then(|v| v.parse::<f64>().ok())
        .expect("level");
    eprintln!(
        "e2e an_async_copy_then_its_stream_sync_is_a_synchronous_copy: copy_time_per_mib baseline {level:.3e} s/MiB; {}",
        learned["msg"]
    );
    assert!((1.0e-4..2.0e-4).contains(&level), "{level} s per MiB");
}

/// Per-entry-point event counts of `each 10`, called directly or through `cuGetProcAddress_v2`.
fn each_counts(env: &integration_tests::Env, resolve: Option<&str>) -> BTreeMap<String, u64> {
    let lib = env.libcuda();
    let tracer = Cudatrace::start(env, &["--json", "--lib", lib.to_str().unwrap()]);
    let dev = device_file("procaddress");
    let mut w = Workload::new(env, Scenario::Each(10)).device(&dev);
    if let Some(r) = resolve {
        w = w.var("WORKLOAD_RESOLVE", r);
    }
    let report = w.run();
    let traced = tracer.stop();
    let _ = std::fs::remove_file(&dev);
    let mut got = BTreeMap::new();
    for e in traced.of_pid(report["pid"].as_u64().unwrap()) {
        *got.entry(e["api"].as_str().unwrap().to_owned())
            .or_default() += 1;
    }
    got
}

/// Calls through the addresses `cuGetProcAddress_v2` returns give the same events as calls
/// through `dlsym`'s (the lookups themselves are traced too: one per entry point looked up).
#[test]
fn calls_through_cu_get_proc_address_are_seen_alike() {
    let Some(env) = env() else { return };
    let direct = each_counts(&env, None);
    let mut resolved = each_counts(&env, Some("procaddress"));
    let lookups = resolved.remove("cuGetProcAddress_v2").unwrap_or(0);
    let mut others = direct.clone();
    let own = others.remove("cuGetProcAddress_v2").unwrap_or(0);
    eprintln!(
        "e2e calls_through_cu_get_proc_address_are_seen_alike: {} entry points, {} events direct, {} through cuGetProcAddress_v2 \
         ({lookups} lookups traced)",
        direct.len(),
        direct.values().sum::<u64>(),
        resolved.values().sum::<u64>()
    );
    assert_eq!(direct.len(), tracer_common::Api::ALL.len());
    assert_eq!(resolved, others);
    assert!(
        lookups > own,
        "every entry point the workload resolved is a traced lookup"
    );
}

/// A driver whose `cuGetProcAddress_v2` hands out private entry points into the same code
/// (`CUDA_STANDIN_PROC_ADDRESS=private`, for cuLaunchKernel and cuStreamSynchronize): the calls
/// through them reach no probe, and cudatrace says so, for exactly those two, once each.
#[test]
fn private_entry_points_from_cu_get_proc_address_are_named() {
    let Some(env) = env() else { return };
    let (daemon, listen) = Cudatrace::start_daemon_on_loopback(&env, &[], &[]);
    let dev = device_file("private");
    let report = Workload::new(
        &env,
        Scenario::Loop {
            seconds: 1.0,
            grid: 1,
            sync_every: 10,
        },
    )
    .device(&dev)
    .vars(&[
        ("WORKLOAD_RESOLVE", "procaddress"),
        ("CUDA_STANDIN_PROC_ADDRESS", "private"),
    ])
    .run();
    let pid = report["pid"].as_u64().unwrap().to_string();
    let samples = integration_tests::poll(Duration::from_secs(10), || {
        let s = exposition::parse(&http::scrape(&listen));
        (exposition::select(
            &s,
            "cudatrace_unprobed_entry_points",
            &[("pid", pid.as_str())],
        )
        .len()
            >= 2)
            .then_some(s)
    })
    .unwrap_or_default();
    let traced = daemon.stop();
    let _ = std::fs::remove_file(&dev);
    let mut named: Vec<&str> = exposition::select(
        &samples,
        "cudatrace_unprobed_entry_points",
        &[("pid", pid.as_str())],
    )
    .into_iter()
    .map(|s| s.label("api"))
    .collect();
    named.sort_unstable();
    let warnings: Vec<&String> = traced
        .stderr
        .iter()
        .filter(|l| l.contains("which is not a probed entry point"))
        .collect();
    let launches = exposition::sum(
        &samples,
        "cudatrace_calls_total",
        &[("pid", pid.as_str()), ("api", "cuLaunchKernel")],
    );
    eprintln!(
        "e2e private_entry_points_from_cu_get_proc_address_are_named: {} launches made, {} seen; named {named:?}; {:?}",
        report["launches"],
        launches as u64,
        warnings.first()
    );
    assert_eq!(named, vec!["cuLaunchKernel", "cuStreamSynchronize"]);
    assert_eq!(warnings.len(), 2);
    assert_eq!(launches, 0.0, "the private entry point reaches no probe");
}
