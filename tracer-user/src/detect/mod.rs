//! Contention detection. Every window (default 5 s), each process's signals get one value: p99
//! of its launch latencies, its wait time per launch, its synchronous-copy time per MiB. Each is
//! compared with the process's own baseline ([`baseline`]); a value over the baseline p99 by a
//! tier (warning +10%, critical +30%, page +50%) and by at least `min_increase_us` breaches. A
//! debounce state machine per (process, signal) ([`debounce`]) turns breaches into alerts, and
//! [`classify`] says why. Breaching windows are not learned, so contention does not become the
//! baseline (until `rebaseline_after_s` of firing). The per-process state lives in the
//! process's registry entry.
pub mod baseline;
pub mod classify;
pub mod debounce;
pub mod signals;

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use baseline::{Learned, Params};
use classify::{Activity, Seen};
use debounce::{Phase, Track};
pub use signals::Signal;
use signals::Window;

use crate::{
    alert::{AlertChange, AlertState, Cause, Evidence, Party, Severity, rfc3339},
    config::DetectConfig,
    nvml::GpuSample,
    pipeline::{
        decode::{Comm, Event},
        enrich::{
            gputime::BatchEstimate,
            identity::{Identity, ProcessRef},
        },
    },
    registry::{Process, Registry},
};

/// The detector's state of one process: its current window and a track per signal.
pub struct ProcessSignals {
    window: Window,
    tracks: [Track; 3],
}

impl ProcessSignals {
    fn new(params: Params) -> ProcessSignals {
        ProcessSignals { window: Window::new(), tracks: std::array::from_fn(|_| Track::new(params)) }
    }

    /// Whether one of its alerts is pending or firing.
    pub fn alerting(&self) -> bool {
        self.tracks.iter().any(|t| t.record.is_some())
    }
}

/// The detector: settings, the current window's start, and the changes not yet handed out.
pub struct Detector {
    cfg: DetectConfig,
    params: Params,
    /// Monotonic seconds at the start of the current window.
    window_start: f64,
    /// State changes not yet handed out.
    outbox: Vec<AlertChange>,
}

/// One breaching window of one (process, signal), as `evaluate` found it.
struct Breach {
    pid: u32,
    signal: usize,
    tier: Severity,
    value: f64,
    p99: f64,
    samples: u64,
}

/// A process's last window as classification sees it, owned so that the registry can change
/// while it is read.
struct Observed {
    pid: u32,
    comm: Comm,
    identity: Arc<Identity>,
    activity: Activity,
}

/// `x` to 4 significant digits: what the evidence can stand for.
fn significant(x: f64) -> f64 {
    if x == 0.0 || !x.is_finite() {
        return x;
    }
    let scale = 10f64.powi(3 - x.abs().log10().floor() as i32);
    (x * scale).round() / scale
}

/// Wall-clock time of a monotonic instant, given one pair of the two.
fn wall_at(mono: f64, now_mono: f64, now_wall: SystemTime) -> SystemTime {
    now_wall.checked_sub(Duration::from_secs_f64((now_mono - mono).max(0.0))).unwrap_or(now_wall)
}

impl Detector {
    /// A detector whose first window starts at `now` (monotonic seconds).
    pub fn new(cfg: DetectConfig, now: f64) -> Detector {
        let params = Params {
            warmup: cfg.warmup_windows,
            alpha: cfg.level_smoothing,
            beta: cfg.trend_smoothing,
            phi: cfg.trend_damping,
            gamma: cfg.spread_smoothing,
            min_spread_ratio: cfg.min_spread_ratio,
            hampel_windows: cfg.hampel_windows,
            hampel_k: cfg.hampel_k,
        };
        Detector { cfg, params, window_start: now, outbox: Vec::new() }
    }

    /// Counts one call into its process's window; `closed` is what a wait closed (GPU time).
    pub fn observe(&self, process: &mut Process, ev: &Event, closed: Option<&BatchEstimate>) {
        let params = self.params;
        let s = process.signals.get_or_insert_with(|| Box::new(ProcessSignals::new(params)));
        s.window.observe(ev, closed);
    }

    /// A process exited: its pending or firing alerts resolve.
    pub fn exited(&mut self, process: &mut Process, now_wall: SystemTime) {
        let Some(s) = process.signals.take() else { return };
        for t in s.tracks {
            if let Some(mut r) = t.record {
                r.state = AlertState::Resolved;
                r.at = rfc3339(now_wall);
                r.reason = Some("victim_exited");
                self.outbox.push(r);
            }
        }
    }

    /// Alerts now pending or firing.
    pub fn active<'a>(&self, registry: &'a Registry) -> impl Iterator<Item = &'a AlertChange> {
        registry.iter().filter_map(|p| p.signals.as_deref()).flat_map(|s| s.tracks.iter().filter_map(|t| t.record.as_ref()))
    }

    /// Per process and signal with a ready baseline: the process, the signal, the last window's
    /// value and the baseline p99, in seconds (per MiB for copy time).
    pub fn signals<'a>(&self, registry: &'a Registry) -> impl Iterator<Item = (ProcessRef<'a>, Signal, f64, f64)> {
        registry.iter().filter_map(|p| Some((p.view(), p.signals.as_deref()?))).flat_map(|(process, s)| {
            Signal::ALL.into_iter().zip(&s.tracks).filter_map(move |(signal, t)| {
                let (v, p99) = t.last?;
                Some((process, signal, v / 1e9, p99 / 1e9))
            })
        })
    }

    /// State changes since the last call.
    pub fn take_changes(&mut self) -> Vec<AlertChange> {
        std::mem::take(&mut self.outbox)
    }

    /// Closes the window that ends now: values, baselines, breaches, state changes (collected for
    /// [`Detector::take_changes`]). `gpus` is the latest NVML sample (empty without NVML).
    pub fn evaluate(&mut self, registry: &mut Registry, now: f64, now_wall: SystemTime, gpus: &[GpuSample]) {
        let start = std::mem::replace(&mut self.window_start, now);
        let cfg = self.cfg.clone();
        let observed: Vec<Observed> = registry
            .iter()
            .filter_map(|p| {
                let w = &p.signals.as_ref()?.window;
                let activity = Activity {
                    launches: w.launches,
                    gpu_ns: w.gpu_ns,
                    copy_bytes: w.copy_bytes,
                    memory_bytes: p.memory.current_bytes,
                };
                Some(Observed { pid: p.pid, comm: p.comm, identity: p.identity.clone(), activity })
            })
            .collect();
        let mut breached: Vec<Breach> = Vec::new();
        for p in registry.iter_mut() {
            let (pid, comm) = (p.pid, p.comm);
            let Some(s) = p.signals.as_deref_mut() else { continue };
            for (i, signal) in Signal::ALL.into_iter().enumerate() {
                let t = &mut s.tracks[i];
                let Some((v, samples)) = s.window.value(signal, cfg.min_samples) else {
                    t.settle(None, now, &cfg);
                    continue;
                };
                let Some(p99) = t.baseline.p99() else {
                    if t.baseline.learn(v) == Learned::Ready {
                        eprintln!(
                            "baseline: pid={pid} comm={comm} signal={} level={:.3e} p99={:.3e}",
                            signal.as_str(),
                            t.baseline.forecast() / 1e9,
                            t.baseline.p99().unwrap_or(0.0) / 1e9
                        );
                    }
                    continue;
                };
                t.last = Some((v, p99));
                let rise = s.window.per_call(signal, v - p99);
                let over = v / p99 - 1.0;
                let tier = if rise < cfg.min_increase_us * 1e3 {
                    None
                } else if over > cfg.page {
                    Some(Severity::Page)
                } else if over > cfg.critical {
                    Some(Severity::Critical)
                } else if over > cfg.warning {
                    Some(Severity::Warning)
                } else {
                    None
                };
                match tier {
                    Some(tier) => {
                        // A change that has fired (or breached silently) this long is the new
                        // normal: learn it.
                        let long = match t.phase {
                            Phase::Firing => now - t.fired_at >= cfg.rebaseline_after_s as f64,
                            Phase::Normal => t.breaches > 0 && now - t.since >= cfg.rebaseline_after_s as f64,
                            Phase::Pending => false,
                        };
                        if long {
                            t.baseline.learn(v);
                        }
                        breached.push(Breach { pid, signal: i, tier, value: v, p99, samples });
                    }
                    None => {
                        t.baseline.learn(v);
                        t.settle(Some(false), now, &cfg);
                    }
                }
            }
        }
        let seen: Vec<Seen<'_>> = observed
            .iter()
            .map(|o| Seen { process: ProcessRef { pid: o.pid, comm: &o.comm, identity: &o.identity }, activity: o.activity })
            .collect();
        for b in breached {
            self.breach(registry, &b, start, now, now_wall, gpus, &seen);
        }
        // Records still refer to the window's moments; stamp the changes with the wall clock.
        for s in registry.iter_mut().filter_map(|p| p.signals.as_deref_mut()) {
            for t in &mut s.tracks {
                if let Some(r) = t.record.as_mut().filter(|r| r.state == AlertState::Resolved) {
                    r.at = rfc3339(now_wall);
                    self.outbox.push(t.record.take().expect("checked"));
                }
            }
            s.window.reset();
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn breach(
        &mut self,
        registry: &mut Registry,
        b: &Breach,
        start: f64,
        now: f64,
        now_wall: SystemTime,
        gpus: &[GpuSample],
        seen: &[Seen<'_>],
    ) {
        let Breach { pid, signal: i, tier, value: v, p99, samples } = *b;
        let signal = Signal::ALL[i];
        let Some(s) = registry.live_mut(pid).and_then(|p| p.signals.as_deref_mut()) else { return };
        let t = &mut s.tracks[i];
        t.breaches += 1;
        if t.breaches == 1 {
            t.since = start;
            t.tier = tier;
        }
        t.tier = t.tier.min(tier);
        t.last_breach = now;
        if t.phase == Phase::Normal && t.breaches < self.cfg.pending_windows {
            // Not an alert yet: nothing to classify.
            return;
        }
        let cfg = &self.cfg;
        let Some(victim) = seen.iter().find(|s| s.process.pid == pid) else { return };
        let limits = classify::Limits { memory_pressure_ratio: cfg.memory_pressure_ratio, idle_gpu_percent: cfg.idle_gpu_percent };
        let baseline = t.baseline.forecast();
        let verdict = classify::classify(signal, victim, seen, gpus, limits);
        let victim_party = Party::of(victim.process, None);
        let evidence = Evidence {
            signal: signal.as_str(),
            unit: signal.unit(),
            baseline: significant(baseline / 1e9),
            baseline_p99: significant(p99 / 1e9),
            now: significant(v / 1e9),
            ratio: significant(v / p99),
            window_s: cfg.window_s,
            samples,
            gpu_memory_used_ratio: verdict.memory_ratio,
            gpu_utilization: verdict.utilization,
            clock_event_reasons: verdict.reasons.clone(),
        };
        let started_at = rfc3339(wall_at(t.since, now, now_wall));
        let at = rfc3339(now_wall);
        // Without a cause and not asked to report those, the breach stays silent (and unlearned);
        // a later window may find a neighbour.
        let silent = verdict.cause == Cause::Unexplained && !cfg.report_unexplained;
        match t.phase {
            Phase::Normal if !silent => {
                t.phase = Phase::Pending;
                let record = AlertChange {
                    alert: verdict.cause.alert_name(),
                    state: AlertState::Pending,
                    severity: t.tier,
                    cause: verdict.cause,
                    gpu: verdict.gpu,
                    victim: victim_party,
                    aggressors: verdict.aggressors,
                    evidence,
                    started_at,
                    at,
                    reason: None,
                };
                self.outbox.push(record.clone());
                t.record = Some(record);
            }
            Phase::Normal => return,
            Phase::Pending | Phase::Firing => {
                // The cause (and with it the alert's name) stays; who and how much are refreshed.
                let r = t.record.as_mut().expect("an alert past normal has a record");
                if r.cause == verdict.cause {
                    r.aggressors = verdict.aggressors;
                    r.gpu = verdict.gpu;
                }
                r.evidence = evidence;
                if t.phase == Phase::Pending {
                    r.severity = t.tier;
                }
            }
        }
        if t.phase == Phase::Pending && now - t.since >= cfg.firing_after_s as f64 {
            t.phase = Phase::Firing;
            t.fired_at = now;
            let r = t.record.as_mut().expect("pending has a record");
            r.state = AlertState::Firing;
            r.at = rfc3339(now_wall);
            self.outbox.push(r.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use tracer_common::Api;

    use super::*;
    use crate::{
        alert::AlertState as State,
        pipeline::decode::Detail,
        registry::RegistryLimits,
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
            let limits = RegistryLimits { max_processes, retain_exited: Duration::from_secs(600) };
            Det { d: Detector::new(cfg, now), r: Registry::new(limits), clock: 0 }
        }
        fn observe(&mut self, ev: &Event, id: &Arc<Identity>, closed: Option<&BatchEstimate>) {
            if self.r.live_mut(ev.pid).is_none() {
                self.r.insert(ev.pid, ev.comm, (**id).clone());
            }
            let p = self.r.live_mut(ev.pid).expect("inserted");
            p.last_seen_ns = self.clock;
            self.d.observe(p, ev, closed);
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
        fn signals(&self) -> impl Iterator<Item = (ProcessRef<'_>, Signal, f64, f64)> {
            self.d.signals(&self.r)
        }
        fn forget(&mut self, pid: u32, now_wall: SystemTime) {
            let d = &mut self.d;
            self.r.exit(pid, |p| d.exited(p, now_wall));
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

    fn ev(pid: u32, api: Api, ns: u64, detail: Detail) -> Event {
        Event { api, pid, tid: pid, comm: format!("job{pid}").into(), start_ns: 0, duration_ns: ns, result: 0, detail }
    }

    /// One window of a process: `n` launches of 4 µs, each followed by a wait of `wait_ns`.
    fn window(d: &mut Det, pid: u32, id: &Arc<Identity>, n: u64, wait_ns: u64) {
        d.clock += 1;
        for _ in 0..n {
            let l = ev(pid, Api::LaunchKernel, 4_000, Detail::Launch { function: 1, grid: [1; 3], block: [1; 3], shared_mem_bytes: 0, stream: 7 });
            d.observe(&l, id, None);
            let s = ev(pid, Api::StreamSynchronize, wait_ns, Detail::Sync { stream: Some(7), event: None });
            d.observe(&s, id, Some(&BatchEstimate { launches: 1, gpu_ns_estimate: wait_ns }));
        }
    }

    fn states(changes: &[Record]) -> Vec<(u32, &'static str, &'static str, &'static str)> {
        changes.iter().map(|r| (r.victim.pid, r.evidence.signal, r.state.as_str(), r.alert)).collect()
    }

    /// Runs windows 5 s apart; `f(k)` gives (victim wait, neighbour launches) of window k.
    /// Returns each window's changes, by the window's end time.
    fn run(d: &mut Det, windows: std::ops::Range<u32>, f: impl Fn(u32) -> (u64, u64)) -> Vec<(u32, Vec<Record>)> {
        let (v, n) = (Arc::new(Identity { cuda_visible_devices: Some("0".into()), ..Default::default() }), Arc::new(Identity { cuda_visible_devices: Some("0".into()), ..Default::default() }));
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
        let out = run(&mut d, 0..40, |k| if (10..22).contains(&k) { (4_000_000, 500) } else { (1_000_000, 0) });
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
        assert_eq!((firing.severity, firing.gpu.as_str()), (Severity::Page, "0"));
        assert_eq!(firing.aggressors.iter().map(|a| (a.pid, a.comm.as_str())).collect::<Vec<_>>(), vec![(2, "job2")]);
        // The only other process on GPU 0 accounts for all of the others' work.
        assert_eq!(firing.aggressors[0].share, Some(1.0));
        assert_eq!((firing.evidence.now, firing.evidence.samples), (0.004, 1000));
        assert!((firing.evidence.baseline - 0.001).abs() < 1e-9, "{}", firing.evidence.baseline);
        assert_eq!(firing.started_at, rfc3339(wall(50.0)));
        assert_eq!(out[2].1[0].reason, Some("back_to_baseline"));
        assert_eq!(d.active().count(), 0);
    }

    #[test]
    fn single_outlier_windows_fire_nothing() {
        let mut d = Det::new(DetectConfig::default(), 100, 0.0);
        // Every 4th window 10x: never 3 in a row.
        let out = run(&mut d, 0..60, |k| (if k > 8 && k % 4 == 0 { 10_000_000 } else { 1_000_000 }, 0));
        assert_eq!(out.iter().map(|(k, c)| (*k, states(c))).collect::<Vec<_>>(), vec![]);
    }

    #[test]
    fn a_short_breach_goes_pending_and_back() {
        let mut d = Det::new(DetectConfig::default(), 100, 0.0);
        let out = run(&mut d, 0..20, |k| (if (10..14).contains(&k) { 2_000_000 } else { 1_000_000 }, 0));
        let got: Vec<(u32, Vec<_>)> = out.iter().map(|(k, c)| (*k, states(c))).collect();
        // No neighbour, no NVML: unexplained slowdown, pending at window 13, over at window 15.
        assert_eq!(
            got,
            vec![(13, vec![(1, "wait_per_launch", "pending", "CudatraceSlowdown")]), (15, vec![(1, "wait_per_launch", "resolved", "CudatraceSlowdown")])]
        );
    }

    #[test]
    fn unexplained_slowdowns_can_be_kept_quiet() {
        let mut d = Det::new(DetectConfig { report_unexplained: false, ..DetectConfig::default() }, 100, 0.0);
        let out = run(&mut d, 0..30, |k| (if k >= 10 { 2_000_000 } else { 1_000_000 }, 0));
        assert!(out.is_empty());
        // A neighbour appears while the breach goes on: now there is a cause, and it goes pending
        // at once (the breach is already many windows old) and fires (it is older than 30 s).
        let out = run(&mut d, 30..31, |_| (2_000_000, 100));
        assert_eq!(
            states(&out[0].1),
            vec![(1, "wait_per_launch", "pending", "CudatraceComputeContention"), (1, "wait_per_launch", "firing", "CudatraceComputeContention")]
        );
    }

    #[test]
    fn a_lasting_change_becomes_the_new_normal() {
        let mut d = Det::new(DetectConfig { rebaseline_after_s: 60, ..DetectConfig::default() }, 100, 0.0);
        // From window 11 on, waits double for good, with a neighbour.
        let out = run(&mut d, 0..80, |k| if k >= 10 { (2_000_000, 100) } else { (1_000_000, 0) });
        let got: Vec<(u32, Vec<_>)> = out.iter().map(|(k, c)| (*k, states(c))).collect();
        let name = "CudatraceComputeContention";
        assert_eq!(got[0], (13, vec![(1, "wait_per_launch", "pending", name)]));
        assert_eq!(got[1], (16, vec![(1, "wait_per_launch", "firing", name)]));
        // Learned from window 28 (60 s after firing); resolved once 60 s pass without a breach.
        assert_eq!(got.len(), 3, "{got:?}");
        let (k, resolved) = &got[2];
        assert_eq!(resolved, &vec![(1, "wait_per_launch", "resolved", name)]);
        assert!((40..80).contains(k), "resolved at window {k}");
        assert!(d.signals().any(|(p, s, v, p99)| p.pid == 1 && s == Signal::WaitPerLaunch && v < p99 && p99 > 0.002));
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
        let mut d = Det::new(DetectConfig { firing_after_s: 0, ..DetectConfig::default() }, 100, 0.0);
        // 1 µs waits tripled: far over p99 in ratio, but under min_increase_us (10 µs).
        let out = run(&mut d, 0..20, |k| (if k >= 10 { 3_000 } else { 1_000 }, 0));
        assert!(out.is_empty());
        let out = run(&mut d, 20..23, |_| (1_000_000, 0));
        // With firing_after_s = 0 the third breaching window goes pending and fires at once.
        assert_eq!(states(&out[0].1), vec![(1, "wait_per_launch", "pending", "CudatraceSlowdown"), (1, "wait_per_launch", "firing", "CudatraceSlowdown")]);
        d.forget(1, wall(200.0));
        let gone = d.take_changes();
        assert_eq!((gone[0].state, gone[0].reason), (State::Resolved, Some("victim_exited")));
    }
}
