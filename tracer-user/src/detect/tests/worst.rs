//! The worst cases: a victim starved by a neighbour holding its GPU, and a breach that grows
//! while firing (escalation).
use super::*;

/// A process that says it is on GPU 0.
fn gpu0() -> Arc<Identity> {
    Arc::new(Identity {
        cuda_visible_devices: Some("0".into()),
        ..Default::default()
    })
}

/// pid 1 learns a 1 ms wait for 10 windows alone, then waits `before` ns in the window just
/// before the hold. Then pid 2 queues work on GPU 0 and holds it: pid 1's next wait does not
/// return for windows `stuck` (its calls complete nowhere), and pid 2's own wait is stuck too.
/// Then pid 1's waits are back to 1 ms. The changes, by window.
fn starved(before: u64) -> Vec<(u32, Vec<Record>)> {
    let mut d = Det::new(DetectConfig::default(), 100, 0.0);
    let gpu0 = gpu0();
    let (mut out, stuck) = (Vec::new(), 10..22u32);
    let now = crate::event::monotonic_ns();
    // The holder's launch, 40 s before the clock's now; the victim's, queued 1 s after it.
    let (held_at, queued_at) = (now - 40_000_000_000, now - 39_000_000_000);
    for k in 0..40u32 {
        if stuck.contains(&k) {
            for (pid, at) in [(2, held_at), (1, queued_at)] {
                if d.r.live_mut(pid).is_none() {
                    d.r.insert(
                        pid,
                        Comm::from(format!("job{pid}").as_str()),
                        (*gpu0).clone(),
                    );
                }
                let p = d.r.live_mut(pid).unwrap();
                if k == stuck.start && pid == 2 {
                    // The holder closes its batches (a wait of its returned before it held
                    // the GPU): its open work is known unfinished.
                    let wait = stream_sync(pid).timed(at - 2_000_000, 1_000_000);
                    let closed = BatchEstimate {
                        launches: 1,
                        span_ns: 1_000_000,
                        batches: 1,
                        copies: None,
                    };
                    d.d.observe(&mut p.signals, &wait, Some(&closed));
                }
                let launch = Event::launch(Api::LaunchKernel, pid, 1, 7).timed(at, 4_000);
                p.streams.observe(&launch, false);
                // Its wait entered right after its launch, and has not returned.
                d.d.observe_stuck(&mut p.signals, tracer_common::Kind::Sync, at + 5_000);
            }
            // An event-synced neighbour: its one launch 100 s old was never closed by a
            // wait of the kind that closes batches. It holds nobody's GPU.
            if d.r.live_mut(3).is_none() {
                d.r.insert(3, Comm::from("evented"), (*gpu0).clone());
                let p = d.r.live_mut(3).unwrap();
                let launch =
                    Event::launch(Api::LaunchKernel, 3, 1, 9).timed(now - 100_000_000_000, 4_000);
                p.streams.observe(&launch, false);
                d.d.observe(&mut p.signals, &launch, None);
            }
        } else {
            let wait_ns = if k + 1 == stuck.start {
                before
            } else {
                1_000_000
            };
            window(&mut d, 1, &gpu0, 1000, wait_ns);
            if k == stuck.end {
                // The holder's long kernel ends: its wait returns, closing both batches.
                for pid in [1, 2] {
                    let p = d.r.live_mut(pid).unwrap();
                    let wait = stream_sync(pid).timed(queued_at, 1_000);
                    p.streams.observe(&wait, false);
                }
            }
        }
        close(&mut d, k, &[], &mut out);
    }
    out
}

#[test]
fn a_starved_victim_fires_names_the_holder_and_resolves_after_its_calls_return() {
    let out = starved(1_000_000);
    let got: Vec<(u32, Vec<_>)> = out.iter().map(|(k, c)| (*k, states(c))).collect();
    let name = "CudatraceGpuStarved";
    assert_eq!(
        got,
        vec![
            // Stuck from window 11 (t=50..55 s): pending after 3 windows, firing at 30 s.
            (13, vec![(1, "wait_per_launch", "pending", name)]),
            (16, vec![(1, "wait_per_launch", "firing", name)]),
            // Stuck until t=110; its waits back to 1 ms from then; resolved 60 s later.
            (34, vec![(1, "wait_per_launch", "resolved", name)]),
        ]
    );
    let firing = &out[1].1[0];
    assert_eq!(firing.cause, crate::alert::Cause::Starvation);
    assert_eq!(
        (firing.severity, firing.gpu.as_str()),
        (Severity::Page, "0")
    );
    let holders: Vec<(u32, Option<f64>)> =
        firing.aggressors.iter().map(|a| (a.pid, a.share)).collect();
    assert_eq!(holders, vec![(2, Some(1.0))]);
    // Its wait entered 39 s before the test's clock reading: stuck at least that long.
    let stuck_s = firing.evidence.stuck_s.expect("stuck_s");
    assert!((39.0..45.0).contains(&stuck_s), "{stuck_s}");
    assert_eq!(firing.evidence.samples, 0);
    assert!(firing
        .summary()
        .contains("job1 (pid 1) starved by job2 (pid 2) 100% on GPU 0"));
    assert_eq!(out[2].1[0].reason, Some("back_to_baseline"));
}

/// The window before the hold was 40% slow (critical, on its own): the starvation that follows
/// pages all the same, as its stuck windows do, and fires one window sooner (the run began then).
/// A change's victim, signal, state, alert and severity.
type Seen = (u32, &'static str, &'static str, &'static str, Severity);

#[test]
fn a_starvation_after_a_milder_slow_window_pages() {
    let got: Vec<(u32, Vec<Seen>)> = starved(1_400_000)
        .iter()
        .map(|(k, c)| {
            let s = states(c)
                .into_iter()
                .zip(c)
                .map(|((p, g, st, a), r)| (p, g, st, a, r.severity));
            (*k, s.collect())
        })
        .collect();
    let (name, page) = ("CudatraceGpuStarved", Severity::Page);
    assert_eq!(
        got,
        vec![
            (12, vec![(1, "wait_per_launch", "pending", name, page)]),
            (15, vec![(1, "wait_per_launch", "firing", name, page)]),
            (34, vec![(1, "wait_per_launch", "resolved", name, page)]),
        ]
    );
}

/// A slowdown that starts at the warning tier and grows to the page tier while firing: the
/// same alert's severity rises once the page tier has held for `firing_after_s`, never falls.
#[test]
fn a_growing_breach_escalates_while_firing_and_never_falls() {
    let mut d = Det::new(DetectConfig::default(), 100, 0.0);
    // Quiet 10 windows; +25% from window 10; +200% from window 20; +25% from 30; quiet from 36.
    let out = run(&mut d, 0..60, |k| match k {
        10..20 | 30..36 => (1_250_000, 200),
        20..30 => (3_000_000, 200),
        _ => (1_000_000, 0),
    });
    type Change = (&'static str, Severity, Option<Severity>);
    let got: Vec<(u32, Vec<Change>)> = out
        .iter()
        .map(|(k, c)| {
            (
                *k,
                c.iter()
                    .map(|r| (r.state.as_str(), r.severity, r.escalated_from))
                    .collect(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (13, vec![("pending", Severity::Warning, None)]),
            (16, vec![("firing", Severity::Warning, None)]),
            // Page from t=100; 30 s later, at the end of window 26, the alert pages.
            (
                26,
                vec![("firing", Severity::Page, Some(Severity::Warning))]
            ),
            // Back to +25% at window 31: still paging; resolved 60 s after the last breach.
            (48, vec![("resolved", Severity::Page, None)]),
        ]
    );
    assert!(out.iter().flat_map(|(_, c)| c).all(|r| r.victim.pid == 1));
}

/// pid 1's allocation fails with `CUDA_ERROR_OUT_OF_MEMORY` while pid 2 holds 6 GiB and pid 1
/// 2 GiB on GPU 0: the alert fires at that window, names both by what they hold, and resolves
/// once 60 s pass without another failure.
#[test]
fn out_of_memory_fires_at_once_names_the_holders_and_resolves() {
    let mut d = Det::new(DetectConfig::default(), 100, 0.0);
    let gpu0 = gpu0();
    let mut out = Vec::new();
    for k in 0..20u32 {
        window(&mut d, 1, &gpu0, 20, 1_000_000);
        window(&mut d, 2, &gpu0, 20, 1_000_000);
        d.r.live_mut(1).unwrap().memory.current_bytes = 2 << 30;
        d.r.live_mut(2).unwrap().memory.current_bytes = 6 << 30;
        if k == 3 || k == 4 {
            let alloc = refused(1, 1 << 30);
            d.observe(&alloc, &gpu0, None);
        }
        close(&mut d, k, &[], &mut out);
    }
    let name = "CudatraceGpuOutOfMemory";
    let got: Vec<(u32, Vec<_>)> = out.iter().map(|(k, c)| (*k, states(c))).collect();
    assert_eq!(
        got,
        vec![
            (4, vec![(1, "out_of_memory", "firing", name)]),
            // The last failure was in the window ending at 25 s: resolved at 85 s.
            (17, vec![(1, "out_of_memory", "resolved", name)]),
        ]
    );
    let firing = &out[0].1[0];
    assert_eq!(
        (firing.severity, firing.gpu.as_str()),
        (Severity::Critical, "0")
    );
    let held: Vec<(u32, Option<f64>)> =
        firing.aggressors.iter().map(|a| (a.pid, a.share)).collect();
    assert_eq!(held, vec![(2, Some(0.75)), (1, Some(0.25))]);
    assert_eq!(
        (firing.evidence.now, firing.evidence.samples),
        ((1u64 << 30) as f64, 1)
    );
    assert_eq!(
        firing.summary(),
        "job1 (pid 1) could not allocate 1073741824 bytes on GPU 0: out of device memory (1 failed in 5 s); held by job2 (pid 2) 75%, job1 (pid 1) 25%"
    );
    assert_eq!(out[1].1[0].reason, Some("no_more_failures"));
}

/// An out-of-memory failure, then the process exits in the same window (a crash): the alert
/// still fires, and resolves 60 s later like a live one's.
#[test]
fn out_of_memory_then_exit_still_fires() {
    let mut d = Det::new(DetectConfig::default(), 100, 0.0);
    let gpu0 = gpu0();
    let mut out = Vec::new();
    for k in 0..20u32 {
        if k == 2 {
            window(&mut d, 3, &gpu0, 20, 1_000_000);
            d.r.live_mut(3).unwrap().memory.current_bytes = 1 << 30;
            let alloc = refused(3, 4096);
            d.observe(&alloc, &gpu0, None);
            d.forget(3, wall(12.0));
        }
        close(&mut d, k, &[], &mut out);
    }
    let name = "CudatraceGpuOutOfMemory";
    let got: Vec<(u32, Vec<_>)> = out.iter().map(|(k, c)| (*k, states(c))).collect();
    assert_eq!(
        got,
        vec![
            (3, vec![(3, "out_of_memory", "firing", name)]),
            (15, vec![(3, "out_of_memory", "resolved", name)]),
        ]
    );
    // It held 1 GiB when it exited: the only holder named.
    let held: Vec<(u32, Option<f64>)> = out[0].1[0]
        .aggressors
        .iter()
        .map(|a| (a.pid, a.share))
        .collect();
    assert_eq!(held, vec![(3, Some(1.0))]);
}

/// One server's process exits (status 3, then SIGKILL, then 3) and starts again each window:
/// the third restart within `restart_loop_s` fires the loop, naming the latest process and the
/// exits; a minute without a restart resolves it.
#[test]
fn a_restart_loop_fires_with_its_exit_statuses_and_resolves() {
    let cfg = DetectConfig {
        restart_loop_s: 60,
        ..DetectConfig::default()
    };
    let mut d = Det::new(cfg, 100, 0.0);
    let id = Identity {
        exe: Some("/usr/bin/server".into()),
        ..Default::default()
    };
    // A bystander with another name: not part of the loop.
    d.r.insert(99, Comm::from("other"), id.clone());
    let statuses = [3 << 8, 9, 3 << 8];
    let mut out = Vec::new();
    for k in 0..20u32 {
        if (1..5).contains(&k) {
            let pid = 10 + k;
            if k > 1 {
                d.r.live_mut(pid - 1).unwrap().exit_status = Some(statuses[(k - 2) as usize]);
                d.forget(pid - 1, wall(f64::from(k) * 5.0));
            }
            d.r.insert(pid, Comm::from("server"), id.clone());
        }
        close(&mut d, k, &[], &mut out);
    }
    let name = "CudatraceRestartLoop";
    let got: Vec<(u32, Vec<_>)> = out.iter().map(|(k, c)| (*k, states(c))).collect();
    assert_eq!(
        got,
        vec![
            (5, vec![(14, "restarts", "firing", name)]),
            // The last restart at 25 s; 60 s later and one window more, none within the span.
            (18, vec![(14, "restarts", "resolved", name)]),
        ]
    );
    let firing = &out[0].1[0];
    assert_eq!(
        (firing.severity, firing.evidence.samples),
        (Severity::Critical, 3)
    );
    assert_eq!(
        firing.evidence.exit_statuses,
        ["exit 3", "killed by SIGKILL", "exit 3"]
    );
    assert_eq!(
        firing.summary(),
        "server (pid 14) restarted 3 times in 60 s (exits: exit 3, killed by SIGKILL, exit 3)"
    );
    assert_eq!(out[1].1[0].reason, Some("no_more_restarts"));
}

/// Forty jobs of one executable, each finishing (exit 0), or stopped by SIGTERM, or whose status
/// was not read, one after another: no restart loop. A crash is a non-zero exit or another signal.
#[test]
fn finished_jobs_are_no_restart_loop() {
    use crate::detect::restarts::crashed;
    assert!(!crashed(Some(0)) && !crashed(Some(15)) && !crashed(Some(2)) && !crashed(None));
    assert!(crashed(Some(1 << 8)) && crashed(Some(9)) && crashed(Some(11 | 0x80)));
    let mut d = Det::new(DetectConfig::default(), 1000, 0.0);
    let id = Identity {
        exe: Some("/usr/bin/job".into()),
        ..Default::default()
    };
    let mut out = Vec::new();
    let ends = [Some(0), Some(15), None];
    for k in 0..40u32 {
        let pid = 100 + k;
        d.r.insert(pid, Comm::from("job"), id.clone());
        close(&mut d, k, &[], &mut out);
        d.r.live_mut(pid).unwrap().exit_status = ends[k as usize % 3];
        d.forget(pid, wall(f64::from(k) * 5.0 + 1.0));
    }
    close(&mut d, 40, &[], &mut out);
    assert!(out.is_empty(), "{out:?}");
}

/// In Kubernetes the container's restart count is the evidence: each new process of the
/// container with a higher count is a restart (its statuses from `lastState`), whatever exit
/// cudatrace saw; more processes of one instance (the same count) are none.
#[test]
fn kubernetes_restart_counts_are_the_evidence() {
    let mut d = Det::new(DetectConfig::default(), 1000, 0.0);
    let id = |restarts: u32| Identity {
        pod_uid: Some("0b1c".into()),
        exe: Some("/usr/bin/python3".into()),
        kube: Some(crate::identity::PodNames {
            namespace: "serving".into(),
            pod: "llm-0".into(),
            container: "server".into(),
            owner: "llm".into(),
            restarts: Some(restarts),
            last_exit: (restarts > 0).then(|| "OOMKilled (exit 137)".into()),
        }),
        ..Default::default()
    };
    let mut out = Vec::new();
    // Two processes of the first instance (a worker beside the server): no restart.
    d.r.insert(200, Comm::from("server"), id(0));
    d.r.insert(201, Comm::from("worker"), id(0));
    close(&mut d, 0, &[], &mut out);
    assert!(out.is_empty(), "{out:?}");
    for (k, pid) in (1..4u32).zip(202..) {
        // Its exit status was never read (unknown): the count still says it restarted.
        d.forget(pid - 1, wall(f64::from(k) * 5.0));
        d.r.insert(pid, Comm::from("server"), id(k));
        close(&mut d, k, &[], &mut out);
    }
    let fired: Vec<&Record> = out.iter().flat_map(|(_, c)| c).collect();
    assert_eq!(fired.len(), 1, "{fired:?}");
    assert_eq!(
        (
            fired[0].alert,
            fired[0].evidence.samples,
            fired[0].victim.pid
        ),
        ("CudatraceRestartLoop", 3, 204)
    );
    assert_eq!(
        fired[0].evidence.exit_statuses,
        vec!["Kubernetes: OOMKilled (exit 137)"; 3]
    );
}

#[test]
fn exit_statuses_in_words() {
    use crate::detect::restarts::status_text;
    assert_eq!(status_text(Some(0)), "exit 0");
    assert_eq!(status_text(Some(1 << 8)), "exit 1");
    assert_eq!(status_text(Some(9)), "killed by SIGKILL");
    assert_eq!(
        status_text(Some(11 | 0x80)),
        "killed by SIGSEGV (core dumped)"
    );
    assert_eq!(status_text(Some(40)), "killed by signal 40");
    assert_eq!(status_text(None), "unknown");
}

/// GPU 0 (NVML: 80 GiB, 40 GiB used). pid 1 allocates 64 MiB more every window (13.4 MB/s: the
/// GPU full in 3,200 s, within the hour): a leak, once six windows show the trend. pid 2 takes
/// 30 GiB in one step and holds it: no leak. pid 1 stops growing at window 20: resolved a
/// minute after the trend no longer shows.
#[test]
fn steady_device_memory_growth_is_a_leak_and_one_step_is_not() {
    let mut d = Det::new(DetectConfig::default(), 100, 0.0);
    let gpu0 = gpu0();
    let gpus = [GpuSample {
        index: 0,
        memory_total: Some(80 << 30),
        memory_used: Some(40 << 30),
        ..Default::default()
    }];
    let mut out = Vec::new();
    for k in 0..50u32 {
        window(&mut d, 1, &gpu0, 20, 1_000_000);
        window(&mut d, 2, &gpu0, 20, 1_000_000);
        d.r.live_mut(1).unwrap().memory.current_bytes = u64::from(k.min(20)) * (64 << 20);
        d.r.live_mut(2).unwrap().memory.current_bytes = if k >= 10 { 30 << 30 } else { 1 << 30 };
        close(&mut d, k, &gpus, &mut out);
    }
    let name = "CudatraceDeviceMemoryLeak";
    let got: Vec<(u32, Vec<_>)> = out.iter().map(|(k, c)| (*k, states(c))).collect();
    assert_eq!(
        got,
        vec![
            // Six windows of growth (0 to 5 x 64 MiB).
            (6, vec![(1, "device_memory_growth", "firing", name)]),
            // Growth stops after window 21; as flat windows enter the kept minute the fitted rate
            // falls, past the hour to full after window 23; resolved 60 s after that window.
            (35, vec![(1, "device_memory_growth", "resolved", name)]),
        ]
    );
    let firing = &out[0].1[0];
    assert_eq!(
        (firing.severity, firing.gpu.as_str()),
        (Severity::Warning, "0")
    );
    // 64 MiB per 5 s.
    assert_eq!(firing.evidence.now, 13_421_773.0);
    assert_eq!(firing.evidence.time_to_full_s, Some(3200.0));
    assert_eq!(
        firing.summary(),
        "job1 (pid 1) device memory grows 13421773 bytes/s: GPU 0 full in 3200 s at this rate"
    );
    assert_eq!(out[1].1[0].reason, Some("growth_stopped"));
}

/// A tenant starting processes of ever new names (a fork loop with a fresh comm each): the
/// restart bookkeeping stays within its bounds.
#[test]
fn restart_bookkeeping_is_bounded() {
    let mut d = Det::new(DetectConfig::default(), 100_000, 0.0);
    let id = Identity::default();
    for pid in 1..=6000u32 {
        d.r.insert(pid, Comm::from(format!("t{pid}").as_str()), id.clone());
    }
    d.evaluate(5.0, wall(5.0), &[]);
    assert!(
        d.d.restart_workloads() <= 4096,
        "{}",
        d.d.restart_workloads()
    );
    assert!(d.take_changes().is_empty());
}
