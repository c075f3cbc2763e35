//! The detector's tests: whole runs of windows through the registry, as the daemon drives it.
use std::time::Duration;

use tracer_common::Api;

use super::*;
use crate::{
    alert::{AlertState as State, Severity},
    event::Detail,
    nvml::GpuSample,
    registry::{Registry, RegistryLimits},
    text::rfc3339,
};

type Record = AlertChange;

/// The detector with the registry its process state lives in, as the daemon holds them.
struct Det {
    d: Detector,
    r: Registry,
    /// Advances with every window of calls, as their timestamps would.
    clock: u64,
}

impl Det {
    fn new(cfg: DetectConfig, max_processes: usize, now: f64) -> Det {
        let limits = RegistryLimits {
            max_processes,
            retain_exited: Duration::from_secs(600),
        };
        Det {
            d: Detector::new(cfg, now),
            r: Registry::new(limits),
            clock: 0,
        }
    }
    fn observe(&mut self, ev: &Event, id: &Arc<Identity>, closed: Option<&BatchEstimate>) {
        if self.r.live_mut(ev.pid).is_none() {
            self.r.insert(ev.pid, ev.comm, (**id).clone());
        }
        let p = self.r.live_mut(ev.pid).expect("inserted");
        p.last_seen_ns = self.clock;
        self.d.observe(&mut p.signals, ev, closed);
    }
    fn evaluate(&mut self, now: f64, now_wall: SystemTime, gpus: &[GpuSample]) {
        self.d.evaluate(&mut self.r, now, now_wall, gpus);
    }
    fn take_changes(&mut self) -> Vec<Record> {
        self.d.take_changes()
    }
    fn active(&self) -> impl Iterator<Item = &Record> {
        self.d.active(&self.r)
    }
    fn signals(&self) -> impl Iterator<Item = SignalValue<'_>> {
        self.d.signals(&self.r)
    }
    fn forget(&mut self, pid: u32, now_wall: SystemTime) {
        let d = &mut self.d;
        self.r.exit(pid, |p| {
            let (who, at_exit, slot) = p.at_exit();
            d.exited(who, at_exit, slot, now_wall)
        });
    }
    fn pids(&self) -> Vec<u32> {
        let mut pids: Vec<u32> = self.r.iter().map(|p| p.pid).collect();
        pids.sort();
        pids
    }
}

const T0: u64 = 1_800_000_000;

fn wall(s: f64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs_f64(T0 as f64 + s)
}

/// A `cuStreamSynchronize` of `pid` on stream 7.
fn stream_sync(pid: u32) -> Event {
    Event::of(
        Api::StreamSynchronize,
        pid,
        Detail::Sync {
            stream: Some(7),
            event: None,
        },
    )
}

/// One window of a process: `n` launches of 4 µs, each followed by a wait of `wait_ns`.
fn window(d: &mut Det, pid: u32, id: &Arc<Identity>, n: u64, wait_ns: u64) {
    d.clock += 1;
    for _ in 0..n {
        let l = Event::launch(Api::LaunchKernel, pid, 1, 7).timed(0, 4_000);
        d.observe(&l, id, None);
        let s = stream_sync(pid).timed(0, wait_ns);
        d.observe(
            &s,
            id,
            Some(&BatchEstimate {
                launches: 1,
                span_ns: wait_ns,
                batches: 1,
                copies: None,
            }),
        );
    }
}

fn states(changes: &[Record]) -> Vec<(u32, &'static str, &'static str, &'static str)> {
    changes
        .iter()
        .map(|r| (r.victim.pid, r.evidence.signal, r.state.as_str(), r.alert))
        .collect()
}

/// Runs windows 5 s apart; `f(k)` gives (victim wait, neighbour launches) of window k.
/// Returns each window's changes, by the window's end time.
fn run(
    d: &mut Det,
    windows: std::ops::Range<u32>,
    f: impl Fn(u32) -> (u64, u64),
) -> Vec<(u32, Vec<Record>)> {
    let (v, n) = (
        Arc::new(Identity {
            cuda_visible_devices: Some("0".into()),
            ..Default::default()
        }),
        Arc::new(Identity {
            cuda_visible_devices: Some("0".into()),
            ..Default::default()
        }),
    );
    let mut out = Vec::new();
    for k in windows {
        let (wait, neighbour) = f(k);
        window(d, 1, &v, 1000, wait);
        if neighbour > 0 {
            window(d, 2, &n, neighbour, 1_000_000);
        }
        let end = f64::from(k + 1) * 5.0;
        d.evaluate(end, wall(end), &[]);
        let changes = d.take_changes();
        if !changes.is_empty() {
            out.push((k + 1, changes));
        }
    }
    out
}

#[test]
fn contention_goes_pending_fires_names_the_aggressor_and_resolves() {
    let mut d = Det::new(DetectConfig::default(), 100, 0.0);
    // 10 quiet windows, 12 contended (wait 1 ms -> 4 ms while pid 2 launches), then quiet.
    let out = run(&mut d, 0..40, |k| {
        if (10..22).contains(&k) {
            (4_000_000, 500)
        } else {
            (1_000_000, 0)
        }
    });
    let got: Vec<(u32, Vec<_>)> = out.iter().map(|(k, c)| (*k, states(c))).collect();
    let name = "CudatraceComputeContention";
    assert_eq!(
        got,
        vec![
            // Breach from window 11 (t=50..55 s): pending after 3 windows, firing once 30 s old.
            (13, vec![(1, "wait_per_launch", "pending", name)]),
            (16, vec![(1, "wait_per_launch", "firing", name)]),
            // Last breach ends at t=110; resolved 60 s later.
            (34, vec![(1, "wait_per_launch", "resolved", name)]),
        ]
    );
    let firing = &out[1].1[0];
    assert_eq!(
        (firing.severity, firing.gpu.as_str()),
        (Severity::Page, "0")
    );
    assert_eq!(
        firing
            .aggressors
            .iter()
            .map(|a| (a.pid, a.comm.as_str()))
            .collect::<Vec<_>>(),
        vec![(2, "job2")]
    );
    // The only other process on GPU 0 accounts for all of the others' work.
    assert_eq!(firing.aggressors[0].share, Some(1.0));
    assert_eq!(
        (firing.evidence.now, firing.evidence.samples),
        (0.004, 1000)
    );
    assert!(
        (firing.evidence.baseline - 0.001).abs() < 1e-9,
        "{}",
        firing.evidence.baseline
    );
    assert_eq!(firing.started_at, rfc3339(wall(50.0)));
    assert_eq!(out[2].1[0].reason, Some("back_to_baseline"));
    assert_eq!(d.active().count(), 0);
}

#[test]
fn single_outlier_windows_fire_nothing() {
    let mut d = Det::new(DetectConfig::default(), 100, 0.0);
    // Every 4th window 10x: never 3 in a row.
    let out = run(&mut d, 0..60, |k| {
        (
            if k > 8 && k % 4 == 0 {
                10_000_000
            } else {
                1_000_000
            },
            0,
        )
    });
    assert_eq!(
        out.iter().map(|(k, c)| (*k, states(c))).collect::<Vec<_>>(),
        vec![]
    );
}

#[test]
fn a_short_breach_goes_pending_and_back() {
    let mut d = Det::new(DetectConfig::default(), 100, 0.0);
    let out = run(&mut d, 0..20, |k| {
        (
            if (10..14).contains(&k) {
                2_000_000
            } else {
                1_000_000
            },
            0,
        )
    });
    let got: Vec<(u32, Vec<_>)> = out.iter().map(|(k, c)| (*k, states(c))).collect();
    // No neighbour, no NVML: unexplained slowdown, pending at window 13, over at window 15.
    assert_eq!(
        got,
        vec![
            (
                13,
                vec![(1, "wait_per_launch", "pending", "CudatraceSlowdown")]
            ),
            (
                15,
                vec![(1, "wait_per_launch", "resolved", "CudatraceSlowdown")]
            )
        ]
    );
}

#[test]
fn unexplained_slowdowns_can_be_kept_quiet() {
    let mut d = Det::new(
        DetectConfig {
            report_unexplained: false,
            ..DetectConfig::default()
        },
        100,
        0.0,
    );
    let out = run(&mut d, 0..30, |k| {
        (if k >= 10 { 2_000_000 } else { 1_000_000 }, 0)
    });
    assert!(out.is_empty());
    // A neighbour appears while the breach goes on: now there is a cause, and it goes pending
    // at once (the breach is already many windows old) and fires (it is older than 30 s).
    let out = run(&mut d, 30..31, |_| (2_000_000, 500));
    assert_eq!(
        states(&out[0].1),
        vec![
            (
                1,
                "wait_per_launch",
                "pending",
                "CudatraceComputeContention"
            ),
            (1, "wait_per_launch", "firing", "CudatraceComputeContention")
        ]
    );
}

#[test]
fn a_lasting_change_becomes_the_new_normal() {
    let mut d = Det::new(
        DetectConfig {
            rebaseline_after_s: 60,
            ..DetectConfig::default()
        },
        100,
        0.0,
    );
    // From window 11 on, waits double for good, with a neighbour.
    let out = run(&mut d, 0..80, |k| {
        if k >= 10 {
            (2_000_000, 500)
        } else {
            (1_000_000, 0)
        }
    });
    let got: Vec<(u32, Vec<_>)> = out.iter().map(|(k, c)| (*k, states(c))).collect();
    let name = "CudatraceComputeContention";
    assert_eq!(got[0], (13, vec![(1, "wait_per_launch", "pending", name)]));
    assert_eq!(got[1], (16, vec![(1, "wait_per_launch", "firing", name)]));
    // Learned from window 28 (60 s after firing); resolved once 60 s pass without a breach.
    assert_eq!(got.len(), 3, "{got:?}");
    let (k, resolved) = &got[2];
    assert_eq!(resolved, &vec![(1, "wait_per_launch", "resolved", name)]);
    assert!((40..80).contains(k), "resolved at window {k}");
    // The forecast lies under the p99 the thresholds are over.
    assert!(d.signals().any(|v| v.process.pid == 1
        && v.signal == Signal::WaitPerLaunch
        && v.value < v.p99
        && v.p99 > 0.002
        && v.forecast > 0.0
        && v.forecast < v.p99));
}

#[test]
fn past_max_processes_the_longest_idle_goes() {
    let mut d = Det::new(DetectConfig::default(), 2, 0.0);
    let id = Arc::new(Identity::default());
    window(&mut d, 1, &id, 20, 1000);
    window(&mut d, 2, &id, 20, 1000);
    d.evaluate(5.0, wall(5.0), &[]);
    window(&mut d, 2, &id, 20, 1000);
    window(&mut d, 3, &id, 20, 1000);
    d.evaluate(10.0, wall(10.0), &[]);
    // Pid 1 was idle in the second window: it goes.
    let pids = d.pids();
    assert_eq!(pids, vec![2, 3]);
}

#[test]
fn an_exited_victim_resolves_and_small_rises_do_not_breach() {
    let mut d = Det::new(
        DetectConfig {
            firing_after_s: 0,
            ..DetectConfig::default()
        },
        100,
        0.0,
    );
    // 1 µs waits tripled: far over p99 in ratio, but under min_increase_us (10 µs).
    let out = run(&mut d, 0..20, |k| (if k >= 10 { 3_000 } else { 1_000 }, 0));
    assert!(out.is_empty());
    let out = run(&mut d, 20..23, |_| (1_000_000, 0));
    // With firing_after_s = 0 the third breaching window goes pending and fires at once.
    assert_eq!(
        states(&out[0].1),
        vec![
            (1, "wait_per_launch", "pending", "CudatraceSlowdown"),
            (1, "wait_per_launch", "firing", "CudatraceSlowdown")
        ]
    );
    d.forget(1, wall(200.0));
    let gone = d.take_changes();
    assert_eq!(
        (gone[0].state, gone[0].reason),
        (State::Resolved, Some("victim_exited"))
    );
}

#[test]
fn a_schedule_switches_the_tiers_at_its_minute() {
    // T0 is 08:00:00 UTC. From 08:01 a strict schedule holds: any rise of 1 µs breaches.
    let strict = crate::config::schedule::ScheduleEntry {
        name: "strict".into(),
        hours: Some("08:01-09:00".into()),
        min_increase_us: Some(1.0),
        ..Default::default()
    };
    let mut d = Det::new(
        DetectConfig {
            schedule: vec![strict],
            ..DetectConfig::default()
        },
        100,
        0.0,
    );
    // 1 µs waits tripled from the window ending at 08:00:55: under [detect]'s 10 µs, not a breach.
    let out = run(&mut d, 0..11, |k| (if k >= 10 { 3_000 } else { 1_000 }, 0));
    assert!(out.is_empty());
    assert_eq!(d.d.schedule_in_force(), None);
    // The window ending at 08:01:00 is judged by the strict schedule: three such windows, pending.
    let out = run(&mut d, 11..14, |_| (3_000, 0));
    assert_eq!(d.d.schedule_in_force(), Some("strict"));
    assert_eq!(
        out.iter().map(|(k, c)| (*k, states(c))).collect::<Vec<_>>(),
        vec![(
            14,
            vec![(1, "wait_per_launch", "pending", "CudatraceSlowdown")]
        )]
    );
    assert_eq!(out[0].1[0].started_at, rfc3339(wall(55.0)));
}

#[test]
fn quiet_periods_mark_the_changes() {
    let quiet = crate::config::Config::parse(
        "[[alerts.quiet]]\nname = \"morning\"\ncomm = \"job*\"\nhours = \"08:00-08:02\"\n",
    )
    .unwrap()
    .alerts
    .quiet;
    let mut d = Det::new(DetectConfig::default(), 100, 0.0);
    d.d = Detector::new(DetectConfig::default(), 0.0)
        .with_quiet(crate::policy::quiet::Quiet::new(&quiet));
    // Contended from window 11: pending at 08:01:05 and firing at 08:01:20, both in the quiet
    // period; the last breach (08:01:50) too, so the resolution at 08:02:50 stays quiet (the
    // sinks, never told of it, are not told it ended).
    let out = run(&mut d, 0..40, |k| {
        if (10..22).contains(&k) {
            (4_000_000, 500)
        } else {
            (1_000_000, 0)
        }
    });
    let got: Vec<(u32, &str, Option<&str>)> = out
        .iter()
        .flat_map(|(k, c)| {
            c.iter()
                .map(move |r| (*k, r.state.as_str(), r.quiet.as_deref()))
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (13, "pending", Some("morning")),
            (16, "firing", Some("morning")),
            (34, "resolved", Some("morning"))
        ]
    );
}

/// Closes window `k` (ending at (k + 1) x 5 s) and keeps its changes, by the window's number.
fn close(d: &mut Det, k: u32, gpus: &[GpuSample], out: &mut Vec<(u32, Vec<Record>)>) {
    let end = f64::from(k + 1) * 5.0;
    d.evaluate(end, wall(end), gpus);
    let changes = d.take_changes();
    if !changes.is_empty() {
        out.push((k + 1, changes));
    }
}

/// pid's allocation of `bytes`, refused with `CUDA_ERROR_OUT_OF_MEMORY`.
fn refused(pid: u32, bytes: u64) -> Event {
    let mut alloc = Event::of(
        Api::MemAlloc,
        pid,
        Detail::Alloc {
            dptr: 0,
            bytes,
            stream: None,
            device: None,
        },
    );
    alloc.result = tracer_common::results::CUDA_ERROR_OUT_OF_MEMORY;
    alloc
}

mod blame;
mod serving;
mod two_gpus;
mod worst;
