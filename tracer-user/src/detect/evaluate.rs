//! One detection window: each process's signal values against their baselines, breaches,
//! the debounce, and for each alert its cause (`classify`), its incident and its quiet flag.
use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use std::collections::{HashMap, HashSet};

use super::{
    baseline::Learned,
    change::WorkHistory,
    classify::{self, Activity, Seen},
    debounce::Phase,
    fact::significant,
    Detector, ProcessSignals, Processes, Signal,
};
use crate::{
    alert::{AlertChange, AlertState, Cause, Evidence, Incident, Party, Severity},
    config::DetectConfig,
    identity::{Comm, Identity, ProcessRef},
    nvml::GpuSample,
    text::rfc3339,
};

/// A process's open work counts as unfinished only if it closed a batch this recently (ns).
const CLOSES_WITHIN_NS: f64 = 60e9;

/// One breaching window of one (process, signal), as `evaluate` found it.
struct Breach {
    pid: u32,
    signal: usize,
    tier: Severity,
    value: f64,
    p99: f64,
    /// The baseline's forecast for the window, the season in.
    forecast: f64,
    samples: u64,
    /// How long the process's oldest stuck call of this signal's kind has been in the driver
    /// (ns), when it is starved.
    stuck_ns: Option<f64>,
}

/// A process's last window as classification sees it, owned so that the registry can change
/// while it is read.
struct Observed {
    pid: u32,
    comm: Comm,
    identity: Arc<Identity>,
    workload: Arc<str>,
    activity: Activity,
}

/// Seconds since the epoch.
pub(super) fn wall_s(t: SystemTime) -> f64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Wall-clock time of a monotonic instant, given one pair of the two.
fn wall_at(mono: f64, now_mono: f64, now_wall: SystemTime) -> SystemTime {
    now_wall
        .checked_sub(Duration::from_secs_f64((now_mono - mono).max(0.0)))
        .unwrap_or(now_wall)
}

impl Detector {
    /// Closes the window that ends now: values, baselines, breaches, state changes (collected for
    /// [`Detector::take_changes`]). `gpus` is the latest NVML sample (empty without NVML).
    pub fn evaluate(
        &mut self,
        processes: &mut impl Processes,
        now: f64,
        now_wall: SystemTime,
        gpus: &[GpuSample],
    ) {
        let start = std::mem::replace(&mut self.window_start, now);
        let (name, cfg) = self.schedule.at(now_wall);
        let cfg = cfg.clone();
        if name != self.in_force.as_deref() {
            log::info!(
                target: "cudatrace::schedule",
                schedule = name.unwrap_or("[detect]");
                "detect: {} in force: warning={} critical={} page={} min_increase_us={} pending_windows={} firing_after_s={} resolve_after_s={}",
                name.map_or("[detect]".to_owned(), |n| format!("schedule {n:?}")),
                cfg.warning,
                cfg.critical,
                cfg.page,
                cfg.min_increase_us,
                cfg.pending_windows,
                cfg.firing_after_s,
                cfg.resolve_after_s
            );
            self.in_force = name.map(str::to_owned);
        }
        self.host.nvml(gpus, start);
        let now_ns = crate::event::monotonic_ns() as f64;
        let observed: Vec<Observed> = processes
            .tracked()
            .filter_map(|p| {
                let s = p.signals?;
                let w = &s.window;
                // Open work is known unfinished only for a process that closes its batches:
                // one that waits by events or polling never closes one here, and its oldest
                // launch is no holder of anyone's GPU. One that closes none but is stuck in a
                // wait now is waiting for work queued before that wait began.
                let closes = s
                    .last_close_ns
                    .is_some_and(|t| now_ns - (t as f64) < CLOSES_WITHIN_NS);
                let waiting = w.stuck[1];
                let activity = Activity {
                    launches: w.launches,
                    gpu_ns: w.gpu_ns,
                    copy_bytes: w.copy_bytes,
                    memory_bytes: p.memory_bytes,
                    open_since: if closes { p.open_since } else { waiting },
                    stuck_since: w.stuck_since(),
                };
                Some(Observed {
                    pid: p.pid,
                    comm: *p.comm,
                    identity: p.identity.clone(),
                    workload: Arc::from(p.workload),
                    activity,
                })
            })
            .collect();
        let seen: Vec<Seen<'_>> = observed
            .iter()
            .map(|o| Seen {
                process: ProcessRef {
                    pid: o.pid,
                    comm: &o.comm,
                    identity: &o.identity,
                    workload: &o.workload,
                },
                activity: o.activity,
            })
            .collect();
        // Starved: a call stuck in the driver behind work another process queued earlier on
        // the same GPU. Its stuck time stands in for the calls that do not complete.
        let starved: Vec<u32> = seen
            .iter()
            .filter(|v| !super::starved::holders(v, &seen, gpus).0.is_empty())
            .map(|v| v.process.pid)
            .collect();
        let wall = wall_s(now_wall);
        let (season, keep) = (*self.memory.season(), self.memory.keep_hours());
        let mut breached: Vec<Breach> = Vec::new();
        for (pid, comm, workload, slot) in processes.slots_mut() {
            let Some(s) = slot.as_deref_mut() else {
                continue;
            };
            for (i, signal) in Signal::ALL.into_iter().enumerate() {
                let t = &mut s.tracks[i];
                let series = self.memory.series(&workload, i, wall);
                let stuck_ns = s.window.stuck[i]
                    .filter(|_| starved.contains(&pid))
                    .map(|since| (now_ns - since as f64).max(0.0));
                let (v, samples) = match (s.window.value(signal, cfg.min_samples), stuck_ns) {
                    (Some((v, n)), Some(stuck)) => (v.max(stuck), n),
                    (Some(measured), None) => measured,
                    (None, Some(stuck)) => (stuck, 0),
                    (None, None) => {
                        t.settle(None, now, &cfg);
                        continue;
                    }
                };
                let Some(p99) = series.p99(wall, &season) else {
                    if stuck_ns.is_some() {
                        // No normal known yet: a stuck call is not one to learn.
                        continue;
                    }
                    // A window learned into the baseline is a normal one too.
                    self.last_normal.insert((workload.clone(), i), now);
                    if series.learn(v, wall, &season, keep) == Learned::Ready {
                        log::info!(
                            target: "cudatrace::baseline",
                            pid = pid,
                            comm = &*comm,
                            workload = &*workload,
                            signal = signal.as_str();
                            "baseline: pid={pid} comm={comm} workload={} signal={} level={:.3e} p99={:.3e}",
                            crate::text::printable(&workload),
                            signal.as_str(),
                            series.forecast(wall, &season) / 1e9,
                            series.p99(wall, &season).unwrap_or(0.0) / 1e9
                        );
                    }
                    continue;
                };
                let forecast = series.forecast(wall, &season);
                t.last = Some((v, p99, forecast));
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
                            Phase::Normal => {
                                t.breaches > 0 && now - t.since >= cfg.rebaseline_after_s as f64
                            }
                            Phase::Pending => false,
                        };
                        if stuck_ns.is_none() {
                            if long {
                                series.learn(v, wall, &season, keep);
                            } else {
                                series.season_only(v, wall, &season);
                            }
                        }
                        breached.push(Breach {
                            pid,
                            signal: i,
                            tier,
                            value: v,
                            p99,
                            forecast,
                            samples,
                            stuck_ns,
                        });
                    }
                    None => {
                        series.learn(v, wall, &season, keep);
                        t.settle(Some(false), now, &cfg);
                        if stuck_ns.is_none() {
                            self.last_normal.insert((workload.clone(), i), now);
                        }
                    }
                }
            }
        }
        // What each process submitted this window joins its history before any verdict.
        let breaching: HashSet<u32> = breached.iter().map(|b| b.pid).collect();
        let histories = super::workload::close_window(processes, &breaching, (start, now));
        // Processes slowed themselves (breaching now, or alerting) are not an incident's cause:
        // two victims of one trainer see each other as small aggressors.
        let mut slowed: Vec<u32> = breached.iter().map(|b| b.pid).collect();
        slowed.extend(
            processes
                .tracked()
                .filter(|p| p.signals.is_some_and(ProcessSignals::alerting))
                .map(|p| p.pid),
        );
        for b in breached {
            self.breach(
                processes,
                &b,
                (start, now, now_wall),
                &cfg,
                gpus,
                (&seen, &slowed, &histories),
            );
        }
        self.out_of_memory(processes, (now, now_wall), &cfg, gpus);
        self.restart_loops(processes, (now, now_wall), &cfg);
        self.leaks(processes, (now, now_wall), &cfg, gpus);
        for p in processes.tracked().filter(|p| !p.exited) {
            self.memory.note(p.workload, Party::of(p.view(), None));
        }
        self.drifts(now_wall, &cfg);
        self.memory.bound();
        super::change::bound_times(&mut self.last_normal);
        // Records still refer to the window's moments; stamp the changes with the wall clock.
        for s in processes
            .slots_mut()
            .filter_map(|(_, _, _, s)| s.as_deref_mut())
        {
            for t in &mut s.tracks {
                if let Some(r) = t
                    .record
                    .as_mut()
                    .filter(|r| r.state == AlertState::Resolved)
                {
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
        processes: &mut impl Processes,
        b: &Breach,
        (start, now, now_wall): (f64, f64, SystemTime),
        cfg: &DetectConfig,
        gpus: &[GpuSample],
        (seen, slowed, histories): (&[Seen<'_>], &[u32], &HashMap<u32, WorkHistory>),
    ) {
        let Breach {
            pid,
            signal: i,
            tier,
            value: v,
            p99,
            forecast: baseline,
            samples,
            stuck_ns,
        } = *b;
        if !classify::vouched(pid, gpus) {
            // NVML sees GPU processes but not this one: no alert of its own.
            return;
        }
        let signal = Signal::ALL[i];
        let kernel = super::workload::grown_kernel(processes, pid);
        let Some(s) = processes.slot_mut(pid).and_then(|s| s.as_deref_mut()) else {
            return;
        };
        let t = &mut s.tracks[i];
        t.breaches += 1;
        if t.breaches == 1 {
            t.since = start;
            t.tier = tier;
        }
        // A call stuck behind others is a condition of its own: not as mild as the slow windows
        // that led up to it.
        if stuck_ns.is_some() && !std::mem::replace(&mut t.stuck, true) {
            t.tier = tier;
        }
        t.tier = t.tier.min(tier);
        t.last_breach = now;
        if t.phase == Phase::Normal && t.breaches < cfg.pending_windows {
            // Not an alert yet: nothing to classify.
            return;
        }
        let Some(victim) = seen.iter().find(|s| s.process.pid == pid) else {
            return;
        };
        let limits = classify::Thresholds {
            memory_pressure_ratio: cfg.memory_pressure_ratio,
            idle_gpu_percent: cfg.idle_gpu_percent,
            rise: super::change::Rise {
                ratio: cfg.aggressor_rise_ratio,
                min_share: cfg.aggressor_min_share,
            },
            run_delay_min: cfg.run_delay_min_s_per_s,
            cpu_preemptor_min: cfg.cpu_preemptor_min_cpus,
            untraced_min_sm: cfg.untraced_min_sm_pct,
        };
        let since = t.since;
        let victim_cgroup = victim.process.identity.cgroup.as_deref();
        if t.reference.as_ref().is_some_and(|r| r.since != since) {
            t.reference = None;
        }
        // The world before: before the breach, or before the workload's last normal window
        // when that is earlier (a process of it started anew next to its aggressor).
        let at = self
            .last_normal
            .get(&(Arc::from(victim.process.workload), i))
            .map_or(since, |t| t.min(since));
        let reference = t.reference.get_or_insert_with(|| {
            let mut r = self.host.reference(at, (pid, victim_cgroup), histories);
            r.since = since;
            Box::new(r)
        });
        let nows = self.host.nows(since, (pid, victim_cgroup), histories);
        let causal = super::causes::Causal {
            reference,
            nows: &nows,
            victim_cgroup,
        };
        let verdict = classify::classify(signal, victim, seen, gpus, limits, &causal);
        let victim_work = super::workload::victim_change(reference, &nows, kernel);
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
            stuck_s: stuck_ns.map(|ns| significant(ns / 1e9)),
            exit_statuses: Vec::new(),
            time_to_full_s: None,
            drift_pct_per_week: None,
            victim_work,
            run_delay_s_per_s: verdict
                .run_delay
                .map(|(b, n)| (significant(b), significant(n))),
            cpu_throttled_periods: verdict.throttled,
            chain: verdict.chain.clone(),
        };
        let started_at = rfc3339(wall_at(t.since, now, now_wall));
        let at = rfc3339(now_wall);
        // Without a cause and not asked to report those, the breach stays silent (and unlearned);
        // a later window may find a neighbour.
        let silent = verdict.cause == Cause::Unexplained && !cfg.report_unexplained;
        let opened = t.phase == Phase::Normal;
        match t.phase {
            Phase::Normal if !silent => {
                t.phase = Phase::Pending;
                let causes: Vec<Party> = verdict
                    .aggressors
                    .iter()
                    .filter(|a| !slowed.contains(&a.pid))
                    .cloned()
                    .collect();
                let incident = Incident::of(
                    verdict.cause,
                    &verdict.gpu,
                    if causes.is_empty() {
                        &verdict.aggressors
                    } else {
                        &causes
                    },
                );
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
                    incident,
                    quiet: None,
                    escalated_from: None,
                };
                t.record = Some(record);
            }
            Phase::Normal => return,
            Phase::Pending | Phase::Firing => {
                // The cause (and with it the alert's name) stays; who and how much are refreshed.
                let r = t
                    .record
                    .as_mut()
                    .expect("an alert past normal has a record");
                if r.cause == verdict.cause {
                    r.aggressors = verdict.aggressors;
                    r.gpu = verdict.gpu;
                }
                r.evidence = evidence;
                r.escalated_from = None;
                match t.phase {
                    Phase::Pending => r.severity = t.tier,
                    // Escalation: every window above the severity for `firing_after_s`.
                    _ if tier > r.severity => {
                        let (since, low) = t.higher.get_or_insert((start, tier));
                        *low = (*low).min(tier);
                        if now - *since >= cfg.firing_after_s as f64 {
                            r.escalated_from = Some(r.severity);
                            r.severity = *low;
                            r.at = rfc3339(now_wall);
                            t.higher = None;
                        }
                    }
                    _ => t.higher = None,
                }
            }
        }
        // Quiet or not, by the names and the period of this change.
        let cgroup = |pid: u32| {
            seen.iter()
                .find(|s| s.process.pid == pid)
                .and_then(|s| s.process.identity.cgroup.clone())
        };
        let r = t
            .record
            .as_mut()
            .expect("an alert past normal has a record");
        r.quiet = self.quiet.find(&r.victim, &r.aggressors, &cgroup, now_wall);
        if opened || r.escalated_from.is_some() {
            self.outbox.push(r.clone());
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
