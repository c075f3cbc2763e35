//! The one registry of traced processes. Each entry, keyed by pid and checked against the start
//! time read from /proc, owns every per-process table: identity, kernel names, device memory,
//! streams (device time), CUDA graphs, metric series and the detector's signals. Exit, pid reuse,
//! retention after exit and the `max_processes` bound therefore happen here, once, for all of
//! them.
use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use foldhash::HashMap;

use crate::{
    aggregate::ProcessSeries,
    detect::{self, Slot, Tracked},
    enrich::{
        devices::ProcessDevices,
        gputime::Streams,
        graphs::Graphs,
        kernels::{KernelNames, NameBytes},
        memory::ProcessMemory,
        pods::PodIndex,
        Enrichment,
    },
    event::Event,
    identity::{Comm, Identity, ProcessRef},
};

/// What the registry keeps, and for how long.
#[derive(Clone, Copy, Debug)]
pub struct RegistryLimits {
    /// Processes held at most; past it the longest-exited, else the longest-idle process
    /// without an active alert, is dropped.
    pub max_processes: usize,
    /// How long an exited process's entry (its final counts) is kept.
    pub retain_exited: Duration,
}

/// One traced process and everything known about it.
pub struct Process {
    /// Process id.
    pub pid: u32,
    /// Who it is, read from /proc when its first event arrived.
    pub identity: Arc<Identity>,
    /// Its comm, as the first event carried it.
    pub comm: Comm,
    /// Kernel handle to name.
    pub kernels: KernelNames,
    /// Device memory from allocations and frees.
    pub memory: ProcessMemory,
    /// Its contexts, and the work it submitted to each device.
    pub devices: ProcessDevices,
    /// Streams and their device time.
    pub streams: Streams,
    /// Stream captures and what each executable graph runs.
    pub graphs: Graphs,
    /// Metric series (`cudatrace run`).
    pub series: ProcessSeries,
    /// The contention detector's window and baselines (`cudatrace run`), made on first use.
    pub signals: Slot,
    /// CLOCK_MONOTONIC ns at the end of its latest call.
    pub last_seen_ns: u64,
    /// Launches the kernel counted in its overflow cells (past its quota of launch cells).
    pub launches_overflowed: u64,
    /// When it exited; the entry stays for [`RegistryLimits::retain_exited`].
    pub exited_at: Option<Instant>,
    /// Its `wait(2)` status, as the kernel's exit record gave it.
    pub exit_status: Option<i32>,
    /// Its workload (`identity::workload`), named when it is admitted and when its pod is.
    pub workload: Arc<str>,
    /// Probed entry points `cuGetProcAddress_v2` handed it elsewhere than their probes
    /// (`pipeline::resolve`): its calls through them are not traced.
    pub unprobed: Vec<String>,
    /// Probed entry points whose `cuGetProcAddress_v2` answer was checked: each once, so that
    /// a process asking in a loop costs one read of its maps per name, not one per call.
    pub resolves_checked: Vec<String>,
    /// A probe harmed it (`probe::harm`): its death is not its own crash or restart.
    pub probe_harmed: bool,
}

impl Process {
    /// The process as views name it.
    pub fn view(&self) -> ProcessRef<'_> {
        ProcessRef {
            pid: self.pid,
            comm: &self.comm,
            identity: &self.identity,
            workload: &self.workload,
        }
    }

    /// What the detector reads of it at its exit, with its detector slot to release: who it
    /// is, (device memory held, exit status), the slot.
    pub fn at_exit(&mut self) -> (ProcessRef<'_>, (u64, Option<i32>), &mut crate::detect::Slot) {
        (
            ProcessRef {
                pid: self.pid,
                comm: &self.comm,
                identity: &self.identity,
                workload: &self.workload,
            },
            (self.memory.current_bytes, self.exit_status),
            &mut self.signals,
        )
    }

    /// Runs every enrichment of one call against this process's tables.
    pub fn enrich(&mut self, ev: &Event) -> Enrichment {
        // Only an allocation needs its device: no lookup for the other calls.
        let device = match ev.detail {
            crate::event::Detail::Alloc { .. } => self.devices.device_of_context(ev.context),
            _ => None,
        };
        self.memory.observe_on(ev, device);
        let graph = self.graphs.observe(ev);
        Enrichment {
            kernel: self.kernels.observe(ev),
            batch: self.streams.observe(ev, graph.captured),
            captured: graph.captured,
            graph_runs: graph.runs,
        }
    }

    /// Whether the detector holds a pending or firing alert for it.
    fn alerting(&self) -> bool {
        self.signals.as_ref().is_some_and(|s| s.alerting())
    }
}

/// Every traced process, by pid.
pub struct Registry {
    by_pid: HashMap<u32, Process>,
    limits: RegistryLimits,
    /// Processes dropped to stay within `max_processes`.
    pub evicted: u64,
    /// Overflows of the per-process tables of processes released so far: kernel handles,
    /// allocations, streams.
    released_overflows: [u64; TABLES],
    /// Bytes of kernel names all entries hold.
    names: NameBytes,
    /// How processes' workloads are named.
    workloads: crate::identity::workload::Rules,
}

/// How many bounded per-process tables there are.
const TABLES: usize = 6;

/// Names of the per-process tables that are bounded, as [`Registry::overflows`] orders them.
pub const BOUNDED_TABLES: [&str; TABLES] = [
    "kernel_handles",
    "allocations",
    "streams",
    "visible_devices",
    "launch_cells",
    "contexts",
];

impl Process {
    fn overflows(&self) -> [u64; TABLES] {
        [
            self.kernels.overflowed,
            self.memory.overflowed,
            self.streams.overflowed,
            u64::from(self.identity.devices_dropped),
            self.launches_overflowed,
            self.devices.overflowed,
        ]
    }
}

impl Registry {
    /// An empty registry.
    pub fn new(limits: RegistryLimits) -> Registry {
        Registry {
            by_pid: HashMap::default(),
            limits,
            evicted: 0,
            released_overflows: [0; TABLES],
            names: NameBytes::default(),
            workloads: crate::identity::workload::Rules::default(),
        }
    }

    /// Names workloads by `rules` (`[[workloads]]`) from now on.
    pub fn set_workloads(&mut self, rules: crate::identity::workload::Rules) {
        self.workloads = rules;
    }

    /// The entry of a running process (none for an exited one, whose pid may come back).
    pub fn live_mut(&mut self, pid: u32) -> Option<&mut Process> {
        self.by_pid.get_mut(&pid).filter(|p| p.exited_at.is_none())
    }

    /// Any entry, exited or not.
    pub fn get(&self, pid: u32) -> Option<&Process> {
        self.by_pid.get(&pid)
    }

    /// Adds a process seen for the first time (replacing an exited one with the same pid), then
    /// keeps the registry within `max_processes`.
    pub fn insert(&mut self, pid: u32, comm: Comm, identity: Identity) -> &mut Process {
        let workload = self.workloads.name(&identity, &comm);
        let process = Process {
            workload,
            pid,
            identity: Arc::new(identity),
            comm,
            kernels: KernelNames::new(self.names.clone()),
            memory: ProcessMemory::default(),
            devices: ProcessDevices::default(),
            streams: Streams::default(),
            graphs: Graphs::default(),
            series: ProcessSeries::default(),
            signals: None,
            last_seen_ns: 0,
            launches_overflowed: 0,
            exited_at: None,
            exit_status: None,
            unprobed: Vec::new(),
            resolves_checked: Vec::new(),
            probe_harmed: false,
        };
        self.by_pid.insert(pid, process);
        if self.by_pid.len() > self.limits.max_processes {
            self.evict(pid);
        }
        self.by_pid
            .get_mut(&pid)
            .expect("just inserted, never the one evicted")
    }

    /// Drops one process other than `keep`: the one exited longest ago, else the one idle
    /// longest among those without an alert, else the one idle longest.
    fn evict(&mut self, keep: u32) {
        let victim = self
            .by_pid
            .values()
            .filter(|p| p.pid != keep)
            .min_by_key(|p| {
                let exited_for = p.exited_at.map(|t| std::cmp::Reverse(t.elapsed()));
                (
                    p.exited_at.is_none(),
                    exited_for,
                    p.alerting(),
                    p.last_seen_ns,
                )
            })
            .map(|p| p.pid);
        if let Some(pid) = victim {
            self.by_pid.remove(&pid);
            self.evicted += 1;
        }
    }

    /// Keeps the kernel names of all entries within `kernels::MAX_TOTAL_BYTES`: past it, the
    /// entry holding the most forgets its oldest handles, until the total is 10% under it.
    pub fn bound_kernel_names(&mut self) {
        if !self.names.over() {
            return;
        }
        while self.names.excess() > 0 {
            let excess = self.names.excess();
            match self.by_pid.values_mut().max_by_key(|p| p.kernels.bytes()) {
                Some(p) if p.kernels.bytes() > 0 => p.kernels.forget_oldest(excess),
                _ => break,
            }
        }
    }

    /// Bytes of kernel names all entries hold.
    pub fn kernel_name_bytes(&self) -> usize {
        self.names.held()
    }

    /// Marks a process exited and hands it to `f` (final lines, alerts), then releases its
    /// per-call tables; its totals stay for the retention time. `false` when it was not known.
    pub fn exit(&mut self, pid: u32, f: impl FnOnce(&mut Process)) -> bool {
        let names = self.names.clone();
        let Some(p) = self.live_mut(pid) else {
            return false;
        };
        p.exited_at = Some(Instant::now());
        f(p);
        let overflows = p.overflows();
        p.kernels = KernelNames::new(names);
        p.memory.release();
        p.devices.release();
        p.streams.release();
        p.graphs.release();
        p.signals = None;
        // The released tables' counts are zero now: keep them here.
        p.memory.overflowed = 0;
        p.streams.overflowed = 0;
        p.launches_overflowed = 0;
        if p.identity.devices_dropped != 0 {
            Arc::make_mut(&mut p.identity).devices_dropped = 0;
        }
        for (total, n) in self.released_overflows.iter_mut().zip(overflows) {
            *total += n;
        }
        if self.limits.retain_exited.is_zero() {
            self.by_pid.remove(&pid);
        }
        true
    }

    /// Drops exited processes kept longer than the retention time.
    pub fn sweep(&mut self) {
        let keep = self.limits.retain_exited;
        self.by_pid
            .retain(|_, p| p.exited_at.is_none_or(|t| t.elapsed() < keep));
    }

    /// Every entry, in no order.
    pub fn iter(&self) -> impl Iterator<Item = &Process> {
        self.by_pid.values()
    }

    /// Every process's metric series, with the process, in no order.
    pub fn series(&self) -> impl Iterator<Item = (ProcessRef<'_>, &ProcessSeries)> {
        self.by_pid.values().map(|p| (p.view(), &p.series))
    }

    /// Every entry, in no order, to change.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut Process> {
        self.by_pid.values_mut()
    }

    /// Overflows of each bounded per-process table ([`BOUNDED_TABLES`]) since start.
    pub fn overflows(&self) -> [u64; TABLES] {
        let mut all = self.released_overflows;
        for p in self.by_pid.values() {
            for (total, n) in all.iter_mut().zip(p.overflows()) {
                *total += n;
            }
        }
        all
    }

    /// Running processes whose pid now belongs to another process, or to none (their exit
    /// record was lost), given each pid's current start time (`None`: no such process).
    pub fn stale(&self, start_time_of: impl Fn(u32) -> Option<u64>) -> Vec<u32> {
        self.by_pid
            .values()
            .filter(|p| p.exited_at.is_none() && p.identity.start_time != 0)
            .filter(|p| start_time_of(p.pid) != Some(p.identity.start_time))
            .map(|p| p.pid)
            .collect()
    }

    /// Running processes, by pid.
    pub fn live_sorted(&self) -> Vec<&Process> {
        let mut v: Vec<&Process> = self
            .by_pid
            .values()
            .filter(|p| p.exited_at.is_none())
            .collect();
        v.sort_by_key(|p| p.pid);
        v
    }

    /// Gives every process in a pod the names `index` has for it; returns whether some process's
    /// pod is not in the index (a pod newer than the list).
    pub fn label_pods(&mut self, index: &PodIndex) -> bool {
        let mut unknown = false;
        let rules = &self.workloads;
        for p in self.by_pid.values_mut() {
            let Some(uid) = p.identity.pod_uid.as_deref() else {
                continue;
            };
            let names = index.names(uid, p.identity.container_id.as_deref());
            unknown |= names.is_none() && p.exited_at.is_none();
            if names.is_some() && p.identity.kube != names {
                Arc::make_mut(&mut p.identity).kube = names;
                p.workload = rules.name(&p.identity, &p.comm);
            }
        }
        unknown
    }

    /// Entries held (exited ones within their retention included).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.by_pid.len()
    }

    /// Whether it holds nothing (no process running, none kept after its exit).
    pub fn is_empty(&self) -> bool {
        self.by_pid.is_empty()
    }
}

/// The detector reaches its per-process state through this (it sits below the registry).
impl detect::Processes for Registry {
    fn tracked(&self) -> impl Iterator<Item = Tracked<'_>> {
        self.by_pid.values().map(|p| Tracked {
            pid: p.pid,
            comm: &p.comm,
            identity: &p.identity,
            memory_bytes: p.memory.current_bytes,
            devices: Some((&p.devices, &p.memory.by_device)),
            workload: &p.workload,
            exited: p.exited_at.is_some(),
            open_since: p.streams.open_since(),
            signals: p.signals.as_deref(),
        })
    }

    fn slots_mut(&mut self) -> impl Iterator<Item = (u32, Comm, Arc<str>, &mut Slot)> {
        self.by_pid
            .values_mut()
            .map(|p| (p.pid, p.comm, p.workload.clone(), &mut p.signals))
    }

    fn slot_mut(&mut self, pid: u32) -> Option<&mut Slot> {
        self.live_mut(pid).map(|p| &mut p.signals)
    }

    fn kernel_name(&self, pid: u32, function: u64) -> Option<String> {
        let k = self.by_pid.get(&pid)?.kernels.name(function)?;
        Some(k.demangled.to_string())
    }
}

#[cfg(test)]
mod tests;
