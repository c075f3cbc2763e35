//! End-to-end: kernel names as long as CUTLASS, FlashAttention and FlashInfer make them. A name
//! past 255 bytes is read whole (up to 4 KiB) and labels its launches; two names that begin
//! alike never share a label, also past the length a label keeps (a hash of the whole then ends
//! it); and a tracer started after a process looked its kernels up says what share of its
//! launches it cannot name.
use std::time::Duration;

use integration_tests::{device_file, env, exposition, http, poll, Cudatrace, Scenario, Workload};

/// `len` bytes: `k` up to the last, which is `tail` (names alike but for their end).
fn name(len: usize, tail: char) -> String {
    std::iter::repeat_n('k', len - 1).chain([tail]).collect()
}

/// The kernel labels of `pid`'s `cuLaunchKernel` series and their calls, sorted.
fn kernels(listen: &str, pid: &str) -> Vec<(String, f64)> {
    let samples = exposition::parse(&http::scrape(listen));
    let mut out: Vec<(String, f64)> = exposition::select(
        &samples,
        "cudatrace_calls_total",
        &[("pid", pid), ("api", "cuLaunchKernel")],
    )
    .into_iter()
    .map(|s| (s.label("kernel").to_owned(), s.value))
    .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[test]
fn long_names_label_their_launches_and_never_collide() {
    let Some(env) = env() else { return };
    let (daemon, listen) = Cudatrace::start_daemon_on_loopback(&env, &[], &[]);
    let dev = device_file("names");
    // Two of 600 bytes differing at the last (past byte 300), two of 2,000 (past what a label
    // keeps, 1,024 bytes).
    let names = [
        name(600, 'a'),
        name(600, 'b'),
        name(2000, 'c'),
        name(2000, 'd'),
    ];
    let report = Workload::new(&env, Scenario::LookupEach(names.to_vec()))
        .device(&dev)
        .var("WORKLOAD_LAUNCHES", "3")
        .run();
    let pid = report["pid"].as_u64().unwrap().to_string();
    let seen = poll(Duration::from_secs(10), || {
        let k = kernels(&listen, &pid);
        (k.iter().map(|(_, n)| n).sum::<f64>() == 12.0).then_some(k)
    });
    let traced = daemon.stop();
    let _ = std::fs::remove_file(&dev);
    let seen = seen.unwrap_or_else(|| panic!("12 launches not seen: {:?}", traced.stderr));
    eprintln!(
        "e2e long_names: labels (length, calls) = {:?}",
        seen.iter().map(|(l, n)| (l.len(), *n)).collect::<Vec<_>>()
    );
    assert_eq!(seen.len(), 4, "four kernels, four labels");
    assert!(seen.iter().all(|(_, n)| *n == 3.0));
    // The 600-byte names whole (sorted first: `a` and `b` come before `k`); the 2,000-byte
    // ones cut to 1,024 bytes, then ` #` and the hash of the whole name (16 hex digits).
    assert_eq!(seen[0].0, names[0]);
    assert_eq!(seen[1].0, names[1]);
    for (label, _) in &seen[2..] {
        assert_eq!(label.len(), 1024 + 2 + 16, "{label:.40}...");
        assert!(label.starts_with(&names[2][..1024]));
    }
    assert_ne!(seen[2].0, seen[3].0);
}

#[test]
fn a_late_attach_says_the_share_it_cannot_name() {
    let Some(env) = env() else { return };
    let dev = device_file("unnamed");
    // Looked up before cudatrace starts; 500 launches 3 s later.
    let job = Workload::new(&env, Scenario::LookupEach(vec!["late_kernel".into()]))
        .device(&dev)
        .var("WORKLOAD_LAUNCHES", "500")
        .var("WORKLOAD_LAUNCH_AFTER_MS", "3000")
        .spawn();
    std::thread::sleep(Duration::from_millis(500));
    let (daemon, listen) = Cudatrace::start_daemon_on_loopback(&env, &[], &[]);
    let late = job.pid().to_string();
    // A process traced from its start, beside it.
    let early = Workload::new(&env, Scenario::LookupEach(vec!["early_kernel".into()]))
        .device(&dev)
        .var("WORKLOAD_LAUNCHES", "500")
        .run();
    let early = early["pid"].as_u64().unwrap().to_string();
    let report = job.finish();
    let ratio = |samples: &[exposition::Sample], pid: &str| {
        exposition::select(samples, "cudatrace_launches_unnamed_ratio", &[("pid", pid)])
            .first()
            .map(|s| s.value)
    };
    let seen = poll(Duration::from_secs(10), || {
        let samples = exposition::parse(&http::scrape(&listen));
        let launches = |pid: &str| {
            exposition::sum(
                &samples,
                "cudatrace_calls_total",
                &[("pid", pid), ("api", "cuLaunchKernel")],
            )
        };
        (launches(&late) == 500.0 && launches(&early) == 500.0)
            .then(|| (ratio(&samples, &late), ratio(&samples, &early)))
    });
    let traced = daemon.stop();
    let _ = std::fs::remove_file(&dev);
    eprintln!(
        "e2e late_attach: launches={} (late, early) unnamed ratio = {seen:?}",
        report["launches"]
    );
    assert_eq!(
        seen.unwrap_or_else(|| panic!("launches not all seen: {:?}", traced.stderr)),
        (Some(1.0), Some(0.0))
    );
}
