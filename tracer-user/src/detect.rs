//! Contention detection. Every window (default 5 s), each process's signals get one value: p99
//! of its launch latencies, its wait time per launch, its synchronous-copy time per MiB. Each is
//! compared with the process's own baseline ([`crate::baseline`]); a value over the baseline p99
//! by a tier (warning +10%, critical +30%, page +50%) and by at least `min_increase_us` breaches.
//! A debounce state machine per (process, signal) turns breaches into alerts: pending after
//! `pending_windows` consecutive breaching windows, firing once the breach has lasted
//! `firing_after_s`, resolved after `resolve_after_s` without one. Breaching windows are not
//! learned, so contention does not become the baseline (until `rebaseline_after_s` of firing).
use foldhash::{HashMap, HashMapExt as _};
use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use hdrhistogram::Histogram;
use tracer_common::Kind;

use crate::{
    alert::{Evidence, Party, Record, Severity, State, rfc3339},
    baseline::{Baseline, Learned, Params},
    classify::{self, Activity, Seen, Signal},
    config::DetectConfig,
    events::{Detail, Event},
    gputime::BatchEstimate,
    identity::{Identity, ProcessRef},
    nvml::GpuSample,
};

/// Unit of the launch-latency sketch: 10 ns.
const UNIT_NS: u64 = 10;
/// Longest launch the sketch holds (10 s); longer ones count as this.
const MAX_UNITS: u64 = 1_000_000_000;
const MIB: f64 = 1_048_576.0;

/// One process's calls in the current window.
struct Window {
    launches: u64,
    /// Launch durations; created on the first launch.
    launch_ns: Option<Histogram<u32>>,
    wait_ns: u64,
    waits: u64,
    sync_copy_ns: u64,
    sync_copy_bytes: u64,
    sync_copies: u64,
    copy_bytes: u64,
    gpu_ns: u64,
}

impl Window {
    fn new() -> Window {
        Window {
            launches: 0,
            launch_ns: None,
            wait_ns: 0,
            waits: 0,
            sync_copy_ns: 0,
            sync_copy_bytes: 0,
            sync_copies: 0,
            copy_bytes: 0,
            gpu_ns: 0,
        }
    }

    fn reset(&mut self) {
        let hist = self.launch_ns.take().map(|mut h| {
            h.reset();
            h
        });
        *self = Window { launch_ns: hist, ..Window::new() };
    }

    /// The signal's value (ns, or ns per MiB) and the calls behind it; `None` with too few calls.
    fn value(&self, signal: Signal, min_samples: u64) -> Option<(f64, u64)> {
        match signal {
            Signal::LaunchLatency => {
                let h = self.launch_ns.as_ref().filter(|_| self.launches >= min_samples)?;
                Some(((h.value_at_quantile(0.99) * UNIT_NS) as f64, self.launches))
            }
            Signal::WaitPerLaunch => (self.launches >= min_samples && self.waits > 0)
                .then(|| (self.wait_ns as f64 / self.launches as f64, self.launches)),
            Signal::CopyTime => (self.sync_copies >= min_samples && self.sync_copy_bytes > 0)
                .then(|| (self.sync_copy_ns as f64 * MIB / self.sync_copy_bytes as f64, self.sync_copies)),
        }
    }

    /// Nanoseconds a rise in `signal` of `delta` means per call, for the `min_increase_us` floor.
    fn per_call(&self, signal: Signal, delta: f64) -> f64 {
        match signal {
            Signal::CopyTime => delta * (self.sync_copy_bytes as f64 / self.sync_copies.max(1) as f64) / MIB,
            _ => delta,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Normal,
    Pending,
    Firing,
}

/// One (process, signal): its baseline and its alert's debounce state.
struct Track {
    baseline: Baseline,
    phase: Phase,
    /// Consecutive breaching windows.
    breaches: u32,
    /// Monotonic seconds when the current run of breaching windows began.
    since: f64,
    /// Monotonic seconds at the end of the last breaching window.
    last_breach: f64,
    /// When the alert fired.
    fired_at: f64,
    /// Lowest tier over the current run: the severity it sustains.
    tier: Severity,
    /// The alert's latest record, while pending or firing.
    record: Option<Record>,
    /// The last window's value and baseline p99 (ns, or ns per MiB), once the baseline is ready.
    last: Option<(f64, f64)>,
}

/// One traced process.
struct Proc {
    identity: Arc<Identity>,
    comm: String,
    window: Window,
    tracks: [Track; 3],
    /// Windows in a row without a call.
    idle_windows: u32,
}

/// The detector of every traced process.
pub struct Detector {
    cfg: DetectConfig,
    params: Params,
    procs: HashMap<u32, Proc>,
    /// Processes held at most; past it the longest-idle one without an alert is dropped.
    max_processes: usize,
    /// Monotonic seconds at the start of the current window.
    window_start: f64,
    /// State changes not yet handed out.
    outbox: Vec<Record>,
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
    /// A detector holding at most `max_processes`; `now` is monotonic seconds.
    pub fn new(cfg: DetectConfig, max_processes: usize, now: f64) -> Detector {
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
        Detector { cfg, params, procs: HashMap::new(), max_processes, window_start: now, outbox: Vec::new() }
    }

    /// Counts one call into its process's window; `closed` is what a wait closed (GPU time).
    pub fn observe(&mut self, ev: &Event, identity: &Arc<Identity>, closed: Option<&BatchEstimate>) {
        let params = self.params;
        let p = self.procs.entry(ev.pid).or_insert_with(|| Proc {
            identity: identity.clone(),
            comm: ev.comm.to_string(),
            window: Window::new(),
            idle_windows: 0,
            tracks: std::array::from_fn(|_| Track {
                baseline: Baseline::new(params),
                phase: Phase::Normal,
                breaches: 0,
                since: 0.0,
                last_breach: 0.0,
                fired_at: 0.0,
                tier: Severity::Warning,
                record: None,
                last: None,
            }),
        });
        let w = &mut p.window;
        if let Some(c) = closed {
            w.gpu_ns += c.gpu_ns_estimate;
        }
        if ev.result != 0 {
            return;
        }
        match ev.api.info().kind {
            Kind::Launch | Kind::GraphLaunch => {
                w.launches += 1;
                let h = w.launch_ns.get_or_insert_with(|| Histogram::new_with_bounds(1, MAX_UNITS, 2).expect("valid bounds"));
                let _ = h.record(ev.duration_ns.div_ceil(UNIT_NS).clamp(1, MAX_UNITS));
            }
            Kind::Sync => {
                w.wait_ns += ev.duration_ns;
                w.waits += 1;
            }
            Kind::Memcpy => {
                if let Detail::Copy { bytes, stream, .. } = ev.detail {
                    w.copy_bytes += bytes;
                    if stream.is_none() {
                        w.sync_copy_ns += ev.duration_ns;
                        w.sync_copy_bytes += bytes;
                        w.sync_copies += 1;
                    }
                }
            }
            _ => {}
        }
    }

    /// Forgets an exited process; its pending or firing alerts resolve.
    pub fn forget(&mut self, pid: u32, now_wall: SystemTime) {
        let Some(p) = self.procs.remove(&pid) else { return };
        for t in p.tracks {
            if let Some(mut r) = t.record {
                r.state = State::Resolved;
                r.at = rfc3339(now_wall);
                r.reason = Some("victim_exited");
                self.outbox.push(r);
            }
        }
    }

    /// Alerts now pending or firing.
    pub fn active(&self) -> impl Iterator<Item = &Record> {
        self.procs.values().flat_map(|p| p.tracks.iter().filter_map(|t| t.record.as_ref()))
    }

    /// Per process and signal with a ready baseline: the process, the signal, the last window's
    /// value and the baseline p99, in seconds (per MiB for copy time).
    pub fn signals(&self) -> impl Iterator<Item = (ProcessRef<'_>, Signal, f64, f64)> {
        self.procs.iter().flat_map(|(pid, p)| {
            let process = ProcessRef { pid: *pid, comm: &p.comm, identity: &p.identity };
            Signal::ALL.into_iter().zip(&p.tracks).filter_map(move |(signal, t)| {
                let (v, p99) = t.last?;
                Some((process, signal, v / 1e9, p99 / 1e9))
            })
        })
    }

    /// State changes since the last call.
    pub fn take_changes(&mut self) -> Vec<Record> {
        std::mem::take(&mut self.outbox)
    }

    /// Closes the window that ends now: values, baselines, breaches, state changes (collected for
    /// [`Detector::take_changes`]). `gpus` is the latest NVML sample (empty without NVML);
    /// `memory` gives a process's traced device memory (for memory-pressure shares).
    pub fn evaluate(&mut self, now: f64, now_wall: SystemTime, gpus: &[GpuSample], memory: impl Fn(u32) -> u64) {
        let start = std::mem::replace(&mut self.window_start, now);
        let cfg = self.cfg.clone();
        let snapshot: Vec<(u32, Activity)> = self
            .procs
            .iter()
            .map(|(pid, p)| {
                let w = &p.window;
                (*pid, Activity { launches: w.launches, gpu_ns: w.gpu_ns, copy_bytes: w.copy_bytes, memory_bytes: memory(*pid) })
            })
            .collect();
        let mut breached: Vec<(u32, usize, Severity, f64, f64, u64)> = Vec::new();
        for (pid, p) in self.procs.iter_mut() {
            for (i, signal) in Signal::ALL.into_iter().enumerate() {
                let t = &mut p.tracks[i];
                let Some((v, samples)) = p.window.value(signal, cfg.min_samples) else {
                    t.settle(None, now, &cfg);
                    continue;
                };
                let Some(p99) = t.baseline.p99() else {
                    if t.baseline.learn(v) == Learned::Ready {
                        eprintln!(
                            "baseline: pid={pid} comm={} signal={} level={:.3e} p99={:.3e}",
                            p.comm,
                            signal.as_str(),
                            t.baseline.forecast() / 1e9,
                            t.baseline.p99().unwrap_or(0.0) / 1e9
                        );
                    }
                    continue;
                };
                t.last = Some((v, p99));
                let rise = p.window.per_call(signal, v - p99);
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
                        breached.push((*pid, i, tier, v, p99, samples));
                    }
                    None => {
                        t.baseline.learn(v);
                        t.settle(Some(false), now, &cfg);
                    }
                }
            }
        }
        for (pid, i, tier, v, p99, samples) in breached {
            self.breach(pid, i, tier, v, p99, samples, start, now, now_wall, gpus, &snapshot);
        }
        // Records still refer to the window's moments; stamp the changes with the wall clock.
        for p in self.procs.values_mut() {
            for t in &mut p.tracks {
                if let Some(r) = t.record.as_mut().filter(|r| r.state == State::Resolved) {
                    r.at = rfc3339(now_wall);
                    self.outbox.push(t.record.take().expect("checked"));
                }
            }
            let w = &p.window;
            let called = w.launches + w.waits + w.sync_copies + u64::from(w.copy_bytes > 0) > 0;
            p.idle_windows = if called { 0 } else { p.idle_windows.saturating_add(1) };
            p.window.reset();
        }
        // Exits release processes; this bounds what lost exits (or many idle ones) could hold.
        while self.procs.len() > self.max_processes {
            let quiet = self.procs.iter().filter(|(_, p)| p.tracks.iter().all(|t| t.record.is_none()));
            let Some(pid) = quiet.max_by_key(|(_, p)| p.idle_windows).map(|(pid, _)| *pid) else { break };
            self.procs.remove(&pid);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn breach(
        &mut self,
        pid: u32,
        i: usize,
        tier: Severity,
        v: f64,
        p99: f64,
        samples: u64,
        start: f64,
        now: f64,
        now_wall: SystemTime,
        gpus: &[GpuSample],
        snapshot: &[(u32, Activity)],
    ) {
        let signal = Signal::ALL[i];
        let Some(p) = self.procs.get_mut(&pid) else { return };
        let t = &mut p.tracks[i];
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
        let seen: Vec<Seen<'_>> = snapshot
            .iter()
            .filter_map(|(pid, a)| {
                let p = self.procs.get(pid)?;
                Some(Seen { process: ProcessRef { pid: *pid, comm: &p.comm, identity: &p.identity }, activity: *a })
            })
            .collect();
        let Some(victim) = seen.iter().find(|s| s.process.pid == pid) else { return };
        let limits = classify::Limits { memory_pressure_ratio: cfg.memory_pressure_ratio, idle_gpu_percent: cfg.idle_gpu_percent };
        let baseline = self.procs[&pid].tracks[i].baseline.forecast();
        let verdict = classify::classify(signal, victim, &seen, gpus, limits);
        let victim_party = Party {
            pid,
            comm: victim.process.comm.to_owned(),
            container: victim.process.identity.container_id.clone(),
            pod: victim.process.identity.pod_uid.clone(),
            share: None,
        };
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
        let t = &mut self.procs.get_mut(&pid).expect("seen").tracks[i];
        let started_at = rfc3339(wall_at(t.since, now, now_wall));
        let at = rfc3339(now_wall);
        // Without a cause and not asked to report those, the breach stays silent (and unlearned);
        // a later window may find a neighbour.
        let silent = verdict.cause == crate::alert::Cause::Unexplained && !cfg.report_unexplained;
        match t.phase {
            Phase::Normal if !silent => {
                t.phase = Phase::Pending;
                let record = Record {
                    alert: verdict.cause.alert_name(),
                    state: State::Pending,
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
            r.state = State::Firing;
            r.at = rfc3339(now_wall);
            self.outbox.push(r.clone());
        }
    }
}

impl Track {
    /// A window that did not breach (`Some(false)`) or had too few calls (`None`).
    fn settle(&mut self, known: Option<bool>, now: f64, cfg: &DetectConfig) {
        match (self.phase, known) {
            (Phase::Normal, Some(_)) => self.breaches = 0,
            (Phase::Normal, None) | (Phase::Pending, None) => {}
            (Phase::Pending, Some(_)) => self.end(),
            (Phase::Firing, _) => {
                if now - self.last_breach >= cfg.resolve_after_s as f64 {
                    self.end();
                }
            }
        }
    }

    /// Back to normal; the record, marked resolved, is handed out by `evaluate`.
    fn end(&mut self) {
        self.phase = Phase::Normal;
        self.breaches = 0;
        if let Some(r) = self.record.as_mut() {
            r.state = State::Resolved;
            r.reason = Some("back_to_baseline");
        }
    }
}

#[cfg(test)]
mod tests {
    use tracer_common::Api;

    use super::*;

    const T0: u64 = 1_800_000_000;

    fn wall(s: f64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs_f64(T0 as f64 + s)
    }

    fn ev(pid: u32, api: Api, ns: u64, detail: Detail) -> Event {
        Event { api, pid, tid: pid, comm: format!("job{pid}").into(), start_ns: 0, duration_ns: ns, result: 0, detail }
    }

    /// One window of a process: `n` launches of 4 µs, each followed by a wait of `wait_ns`.
    fn window(d: &mut Detector, pid: u32, id: &Arc<Identity>, n: u64, wait_ns: u64) {
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
    fn run(d: &mut Detector, windows: std::ops::Range<u32>, f: impl Fn(u32) -> (u64, u64)) -> Vec<(u32, Vec<Record>)> {
        let (v, n) = (Arc::new(Identity { cuda_visible_devices: Some("0".into()), ..Default::default() }), Arc::new(Identity { cuda_visible_devices: Some("0".into()), ..Default::default() }));
        let mut out = Vec::new();
        for k in windows {
            let (wait, neighbour) = f(k);
            window(d, 1, &v, 1000, wait);
            if neighbour > 0 {
                window(d, 2, &n, neighbour, 1_000_000);
            }
            let end = f64::from(k + 1) * 5.0;
            d.evaluate(end, wall(end), &[], |_| 0);
            let changes = d.take_changes();
            if !changes.is_empty() {
                out.push((k + 1, changes));
            }
        }
        out
    }

    #[test]
    fn contention_goes_pending_fires_names_the_aggressor_and_resolves() {
        let mut d = Detector::new(DetectConfig::default(), 100, 0.0);
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
        let mut d = Detector::new(DetectConfig::default(), 100, 0.0);
        // Every 4th window 10x: never 3 in a row.
        let out = run(&mut d, 0..60, |k| (if k > 8 && k % 4 == 0 { 10_000_000 } else { 1_000_000 }, 0));
        assert_eq!(out.iter().map(|(k, c)| (*k, states(c))).collect::<Vec<_>>(), vec![]);
    }

    #[test]
    fn a_short_breach_goes_pending_and_back() {
        let mut d = Detector::new(DetectConfig::default(), 100, 0.0);
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
        let mut d = Detector::new(DetectConfig { report_unexplained: false, ..DetectConfig::default() }, 100, 0.0);
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
        let mut d = Detector::new(DetectConfig { rebaseline_after_s: 60, ..DetectConfig::default() }, 100, 0.0);
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
        let mut d = Detector::new(DetectConfig::default(), 2, 0.0);
        let id = Arc::new(Identity::default());
        window(&mut d, 1, &id, 20, 1000);
        window(&mut d, 2, &id, 20, 1000);
        d.evaluate(5.0, wall(5.0), &[], |_| 0);
        window(&mut d, 2, &id, 20, 1000);
        window(&mut d, 3, &id, 20, 1000);
        d.evaluate(10.0, wall(10.0), &[], |_| 0);
        // Pid 1 was idle in the second window: it goes.
        let mut pids: Vec<u32> = d.procs.keys().copied().collect();
        pids.sort();
        assert_eq!(pids, vec![2, 3]);
    }

    #[test]
    fn an_exited_victim_resolves_and_small_rises_do_not_breach() {
        let mut d = Detector::new(DetectConfig { firing_after_s: 0, ..DetectConfig::default() }, 100, 0.0);
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
