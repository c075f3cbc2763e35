//! Contention detection. Every window (default 5 s), each process's signals get one value: p99
//! of its launch latencies, its wait time per launch, its synchronous-copy time per MiB. Each is
//! compared with its workload's baseline ([`memory`]: [`baseline`] with [`season`]); a value over the baseline p99 by a
//! tier (warning +10%, critical +30%, page +50%) and by at least `min_increase_us` breaches. A
//! debounce state machine per (process, signal) ([`debounce`]) turns breaches into alerts, and
//! [`classify`] says why. Breaching windows are not learned, so contention does not become the
//! baseline (until `rebaseline_after_s` of firing). The per-process state lives in the
//! process's registry entry, which the detector reaches through [`Processes`] (the registry
//! implements it, from above this stage).
pub mod baseline;
mod causes;
pub mod change;
pub mod classify;
pub mod debounce;
mod drift;
mod fact;
mod fair;
mod harm;
pub mod history;
mod host;
pub mod leak;
pub mod memory;
pub mod oom;
pub mod restarts;
pub mod season;
pub mod signals;
mod starved;
pub mod verdict;
mod workload;

use std::{collections::BTreeMap, sync::Arc, time::SystemTime};

use baseline::Params;
use debounce::Track;
pub use signals::Signal;
use signals::Window;

use crate::{
    alert::AlertChange,
    config::DetectConfig,
    enrich::{devices::ProcessDevices, gputime::BatchEstimate},
    event::{Event, LaunchDelta},
    identity::{Comm, Identity, ProcessRef},
    policy::{quiet::Quiet, schedule::Schedule},
};

/// The detector's state of one process: its current window and a track per signal.
pub struct ProcessSignals {
    window: Window,
    tracks: [Track; 3],
    /// Its failed allocations (out of device memory).
    oom: oom::Oom,
    /// Its device memory over the last windows (leaks).
    leak: leak::Leak,
    /// What it submitted, window by window (the causal verdicts' evidence).
    pub work: change::WorkHistory,
    /// Per kernel handle: its usual threads per launch and grid, learned in windows where the
    /// process breached nothing (at most `signals::MAX_KERNELS`).
    pub usual: std::collections::HashMap<u64, verdict::Usual>,
    /// Per kernel handle: the grid and block of its latest launch seen.
    pub grids: std::collections::HashMap<u64, ([u32; 3], [u32; 3])>,
    /// Its threads' run-queue delay ever (ns) at the last read, and what it grew by since the
    /// window began.
    run_delay: (Option<u64>, Option<u64>),
    /// When (monotonic ns) a wait of its last closed a batch: its open work is known unfinished
    /// only while it closes batches.
    pub last_close_ns: Option<u64>,
}

impl ProcessSignals {
    fn new() -> ProcessSignals {
        ProcessSignals {
            window: Window::new(),
            tracks: std::array::from_fn(|_| Track::new()),
            oom: oom::Oom::default(),
            leak: leak::Leak::default(),
            work: change::WorkHistory::default(),
            usual: std::collections::HashMap::new(),
            grids: std::collections::HashMap::new(),
            run_delay: (None, None),
            last_close_ns: None,
        }
    }

    /// Whether one of its alerts is pending or firing.
    pub fn alerting(&self) -> bool {
        self.tracks.iter().any(|t| t.record.is_some())
    }

    /// Its alerts now pending or firing.
    fn records(&self) -> impl Iterator<Item = &AlertChange> {
        self.tracks
            .iter()
            .filter_map(|t| t.record.as_ref())
            .chain(self.oom.record.as_ref())
            .chain(self.leak.record.as_ref())
    }
}

/// The detector's slot in a process's entry: made on first use, released at exit.
pub type Slot = Option<Box<ProcessSignals>>;

/// One process as the detector reads it from the table that holds it.
pub struct Tracked<'a> {
    /// Process id.
    pub pid: u32,
    /// Its comm.
    pub comm: &'a Comm,
    /// Who it is.
    pub identity: &'a Arc<Identity>,
    /// Its workload.
    pub workload: &'a str,
    /// Device memory it holds, bytes.
    pub memory_bytes: u64,
    /// Its devices and the memory it holds on each (`enrich::devices`, `ProcessMemory::by_device`),
    /// where the table holds them.
    pub devices: Option<(&'a ProcessDevices, &'a BTreeMap<Option<i32>, u64>)>,
    /// Whether it exited (kept for its retention time).
    pub exited: bool,
    /// When its oldest work not yet known finished was launched (CLOCK_MONOTONIC ns): the
    /// first launch of its oldest batch no wait has closed.
    pub open_since: Option<u64>,
    /// The detector's state of it, once it has some.
    pub signals: Option<&'a ProcessSignals>,
}

impl<'a> Tracked<'a> {
    /// The process as views name it.
    pub fn view(&self) -> ProcessRef<'a> {
        ProcessRef {
            pid: self.pid,
            comm: self.comm,
            identity: self.identity,
            workload: self.workload,
        }
    }
}

/// The table the detector's per-process state lives in: the registry, which sits above this
/// stage and implements it, so that the detector never imports it.
pub trait Processes {
    /// Every process, exited ones within their retention included, in no order.
    fn tracked(&self) -> impl Iterator<Item = Tracked<'_>>;
    /// Every process's slot, with its pid, comm and workload, in no order.
    fn slots_mut(&mut self) -> impl Iterator<Item = (u32, Comm, Arc<str>, &mut Slot)>;
    /// A running process's slot.
    fn slot_mut(&mut self, pid: u32) -> Option<&mut Slot>;
    /// The demangled name of kernel `function` of `pid`, once its lookup was seen.
    fn kernel_name(&self, _pid: u32, _function: u64) -> Option<String> {
        None
    }
}

/// One signal of one process in the last window, in seconds (per MiB for copy time).
#[derive(Clone, Copy, Debug)]
pub struct SignalValue<'a> {
    /// The process.
    pub process: ProcessRef<'a>,
    /// The signal.
    pub signal: Signal,
    /// The window's value.
    pub value: f64,
    /// The baseline's p99: what the tiers are over.
    pub p99: f64,
    /// The baseline's forecast for the window.
    pub forecast: f64,
}

/// The detector: settings, the current window's start, and the changes not yet handed out.
pub struct Detector {
    /// The `[detect]` settings and the schedule's periods over them.
    schedule: Schedule,
    /// The schedule entry in force at the last window (None: `[detect]`'s own values).
    in_force: Option<String>,
    /// Quiet periods: which alerts are recorded but not sent.
    quiet: Quiet,
    /// Baselines, seasons and history per workload.
    memory: memory::Memory,
    /// Monotonic seconds at the start of the current window.
    window_start: f64,
    /// State changes not yet handed out.
    outbox: Vec<AlertChange>,
    /// Exited processes whose out-of-memory alert is still kept.
    gone_oom: Vec<oom::Gone>,
    /// Restart loops per workload.
    restarts: restarts::Restarts,
    /// The host's cgroups' CPU use, NVML's per-process and per-GPU utilization, over time.
    host: verdict::HostHistory,
    /// Per (workload, signal), when (monotonic seconds) its last window within its baseline
    /// ended: a process of it that starts anew next to an aggressor is compared with the world
    /// then.
    last_normal: std::collections::HashMap<(Arc<str>, usize), f64>,
}

impl Detector {
    /// A detector whose first window starts at `now` (monotonic seconds).
    pub fn new(cfg: DetectConfig, now: f64) -> Detector {
        Detector {
            schedule: Schedule::new(&cfg),
            in_force: None,
            quiet: Quiet::default(),
            memory: Detector::memory_for(&cfg, 256),
            window_start: now,
            outbox: Vec::new(),
            gone_oom: Vec::new(),
            restarts: restarts::Restarts::default(),
            host: verdict::HostHistory::default(),
            last_normal: std::collections::HashMap::new(),
        }
    }

    /// An empty per-workload memory for these settings, holding at most `max` workloads.
    pub fn memory_for(cfg: &DetectConfig, max: usize) -> memory::Memory {
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
        let season = season::SeasonParams {
            len_s: cfg.season_s,
            bucket_s: cfg.season_bucket_s,
            history: cfg.season_history,
        };
        memory::Memory::new(params, season, cfg.history_days as usize * 24, max)
    }

    /// Remembers `memory` (loaded from the state file) from now on.
    pub fn set_memory(&mut self, memory: memory::Memory) {
        self.memory = memory;
    }

    /// What it remembers per workload (for saving).
    pub fn memory(&self) -> &memory::Memory {
        &self.memory
    }

    /// The same detector, marking alerts `quiet` in the periods of `quiet`.
    pub fn with_quiet(mut self, quiet: Quiet) -> Detector {
        self.quiet = quiet;
        self
    }

    /// The `[[detect.schedule]]` entry in force at the last window (None: `[detect]`'s values).
    pub fn schedule_in_force(&self) -> Option<&str> {
        self.in_force.as_deref()
    }

    /// Counts one call into its process's window; `closed` is what a wait closed (GPU time).
    pub fn observe(&self, slot: &mut Slot, ev: &Event, closed: Option<&BatchEstimate>) {
        let s = slot.get_or_insert_with(|| Box::new(ProcessSignals::new()));
        s.window.observe(ev, closed);
        if closed.is_some() {
            s.last_close_ns = Some(ev.start_ns.saturating_add(ev.duration_ns));
        }
        if let crate::event::Detail::Launch {
            function,
            grid,
            block,
            ..
        } = ev.detail
        {
            if s.grids.len() < signals::MAX_KERNELS || s.grids.contains_key(&function) {
                s.grids.insert(function, (grid, block));
            }
        }
        oom::observe(s, ev);
    }

    /// Counts the kernels a graph launch of known composition ran.
    pub fn observe_graph(&self, slot: &mut Slot, nodes: &[crate::enrich::graphs::Node]) {
        let s = slot.get_or_insert_with(|| Box::new(ProcessSignals::new()));
        s.window.add_graph(nodes);
    }

    /// Its threads' run-queue delay ever, ns, as read now (`None`: unreadable).
    pub fn observe_run_delay(&self, slot: &mut Slot, total_ns: Option<u64>) {
        let s = slot.get_or_insert_with(|| Box::new(ProcessSignals::new()));
        let (last, _) = s.run_delay;
        s.run_delay = (
            total_ns,
            total_ns
                .zip(last)
                .map(|(now, then)| now.saturating_sub(then)),
        );
    }

    /// The host's cgroups' CPU counters, read now (monotonic seconds).
    pub fn observe_cgroups(&mut self, cgroups: Vec<crate::hostcpu::CgroupCpu>, now: f64) {
        self.host.cgroups(cgroups, now);
    }

    /// Counts launches the kernel counted into their process's window.
    pub fn observe_launches(&self, slot: &mut Slot, d: &LaunchDelta) {
        let s = slot.get_or_insert_with(|| Box::new(ProcessSignals::new()));
        s.window.add_launches(d);
    }

    /// Gives `signal` the value `v` (ns, or ns per MiB) for this window, whole: a replayed
    /// series (`backtest`).
    pub fn preset(&self, slot: &mut Slot, signal: Signal, v: f64) {
        let s = slot.get_or_insert_with(|| Box::new(ProcessSignals::new()));
        let i = Signal::ALL.iter().position(|x| *x == signal).unwrap_or(0);
        s.window.preset[i] = Some(v);
    }

    /// A call of `kind` that entered at `start_ns` has been in the driver for at least a
    /// window: what a starved process shows instead of slow calls.
    pub fn observe_stuck(&self, slot: &mut Slot, kind: tracer_common::Kind, start_ns: u64) {
        let Some(signal) = Signal::held_up_by(kind) else {
            return;
        };
        let s = slot.get_or_insert_with(|| Box::new(ProcessSignals::new()));
        s.window.note_stuck(signal, start_ns);
    }

    /// A process exited (`who`, holding `memory_bytes` of device memory then, with `wait(2)`
    /// status `status`): its pending or firing alerts resolve, but for an out-of-memory one,
    /// kept its usual time; the exit counts toward its workload's restarts.
    pub fn exited(
        &mut self,
        who: ProcessRef<'_>,
        (memory_bytes, status): (u64, Option<i32>),
        slot: &mut Slot,
        now_wall: SystemTime,
    ) {
        self.restart_exited(who, status);
        self.release(who, memory_bytes, slot, now_wall);
    }

    /// A process exited: its alerts resolve (an out-of-memory one kept its usual time).
    fn release(
        &mut self,
        who: ProcessRef<'_>,
        memory_bytes: u64,
        slot: &mut Slot,
        now_wall: SystemTime,
    ) {
        let Some(s) = slot.take() else {
            return;
        };
        let ProcessSignals {
            tracks, oom, leak, ..
        } = *s;
        self.oom_exited(who, memory_bytes, oom);
        for r in tracks
            .into_iter()
            .filter_map(|t| t.record)
            .chain(leak.record)
        {
            self.outbox
                .push(fact::resolved(r, "victim_exited", now_wall));
        }
    }

    /// Alerts now pending or firing.
    pub fn active<'a>(
        &'a self,
        processes: &'a impl Processes,
    ) -> impl Iterator<Item = &'a AlertChange> {
        processes
            .tracked()
            .filter_map(|p| p.signals)
            .flat_map(ProcessSignals::records)
            .chain(self.gone_oom.iter().filter_map(|g| g.record()))
            .chain(self.restart_records())
            .chain(self.drift_records())
    }

    /// Per process and signal with a ready baseline, its last window against the baseline.
    pub fn signals<'a>(
        &self,
        processes: &'a impl Processes,
    ) -> impl Iterator<Item = SignalValue<'a>> {
        processes
            .tracked()
            .filter_map(|p| Some((p.view(), p.signals?)))
            .flat_map(|(process, s)| {
                Signal::ALL
                    .into_iter()
                    .zip(&s.tracks)
                    .filter_map(move |(signal, t)| {
                        let (v, p99, forecast) = t.last?;
                        Some(SignalValue {
                            process,
                            signal,
                            value: v / 1e9,
                            p99: p99 / 1e9,
                            forecast: forecast / 1e9,
                        })
                    })
            })
    }

    /// State changes since the last call.
    pub fn take_changes(&mut self) -> Vec<AlertChange> {
        std::mem::take(&mut self.outbox)
    }
}

mod evaluate;

#[cfg(test)]
mod tests;
