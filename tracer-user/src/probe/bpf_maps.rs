//! Typed handles to the maps user space reads and writes, and what it does with them: settings,
//! the filter, tracked processes, counters, and the launches counted in-kernel.
use anyhow::Result;
use aya::{
    maps::{Array, HashMap as BpfHashMap, MapData, PerCpuArray, PerCpuHashMap},
    Ebpf,
};
use tracer_common::{
    launches::{LaunchCell, LaunchKey},
    names::{
        MAP_CELLS, MAP_CONFIG, MAP_DROPS, MAP_ENTRIES, MAP_FILTER, MAP_LAUNCHES, MAP_LIMITED,
        MAP_STATS, MAP_TRACKED, MAP_UNSLOTTED,
    },
    Entry, Filter, CONFIG_AGGREGATE, CONFIG_CELL_QUOTA, CONFIG_ENABLED, CONFIG_RATE_LIMIT,
    CONFIG_SAMPLE_EVERY, CONFIG_SAMPLE_FIRST, CONFIG_SLOW_US, CONFIG_WAKEUP_BYTES, STAT_CELLS_MADE,
    STAT_COUNTED, STAT_DROPPED, STAT_OPENS_LOST, STAT_ORPHAN_RETURNS, STAT_POLLS_NOT_READY,
    STAT_RATE_LIMITED,
};

use super::loader::take;
use crate::config::Sampling;

/// Why records were not written: the ring buffer was full, or the process was over the rate
/// limit.
pub const DROP_REASONS: [&str; 2] = ["ring_full", "rate_limit"];

/// Why calls of one process were not recorded: [`DROP_REASONS`], and `no_slot` (the call
/// found no entry slot: its process or cgroup was over its share of them, or all were taken;
/// it was not timed).
pub const PROCESS_DROP_REASONS: [&str; 3] = ["ring_full", "rate_limit", "no_slot"];

/// Records the kernel did not write, by reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Drops {
    /// The ring buffer was full.
    pub ring_full: u64,
    /// The process was over `record_rate_limit`.
    pub rate_limited: u64,
}

impl Drops {
    /// Each count with its reason's name, as [`DROP_REASONS`] orders them.
    pub fn by_reason(self) -> [(&'static str, u64); 2] {
        [
            (DROP_REASONS[0], self.ring_full),
            (DROP_REASONS[1], self.rate_limited),
        ]
    }

    /// Every record not written.
    pub fn total(self) -> u64 {
        self.ring_full.saturating_add(self.rate_limited)
    }
}

/// Records of one process the kernel did not write for one reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessDrops {
    /// The process.
    pub pid: u32,
    /// Why: one of [`DROP_REASONS`].
    pub reason: &'static str,
    /// How many, the CPUs added up.
    pub count: u64,
}

/// Typed handles to the maps user space reads and writes.
pub struct Maps {
    /// Settings, by `CONFIG_*`.
    config: Array<MapData, u32>,
    /// The in-kernel filter.
    filter: Array<MapData, Filter>,
    /// Per-CPU counters, by `STAT_*`.
    stats: PerCpuArray<MapData, u64>,
    /// Per-thread entry state.
    entries: BpfHashMap<MapData, u64, Entry>,
    /// Processes whose exit the kernel reports.
    tracked: BpfHashMap<MapData, u32, u8>,
    /// Records dropped per process, per CPU.
    drops: PerCpuHashMap<MapData, u32, u64>,
    /// Records left out per process for the rate limit, per CPU.
    limited: PerCpuHashMap<MapData, u32, u64>,
    unslotted: PerCpuHashMap<MapData, u32, u64>,
    /// Entry slots held per process.
    slots: BpfHashMap<MapData, u32, u64>,
    /// Entry slots held per cgroup.
    slots_cg: BpfHashMap<MapData, u64, u64>,
    /// Launches counted in-kernel.
    launches: BpfHashMap<MapData, LaunchKey, LaunchCell>,
    /// Cells of `launches` made per process (the quota's count).
    cells: BpfHashMap<MapData, u32, u64>,
    /// The same map's descriptor (a duplicate), for batch reads.
    launches_fd: Option<std::os::fd::OwnedFd>,
    /// `entries`' descriptor (a duplicate), for batch reads.
    entries_fd: Option<std::os::fd::OwnedFd>,
}

/// A call that entered the driver and has not returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InFlight {
    /// Process id.
    pub pid: u32,
    /// `bpf_ktime_get_ns` (CLOCK_MONOTONIC) at entry.
    pub start_ns: u64,
    /// The entry point.
    pub api: tracer_common::api::Api,
}

impl Maps {
    /// Takes every map user space uses out of the loaded object.
    pub fn take(ebpf: &mut Ebpf) -> Result<Maps> {
        Ok(Maps {
            config: take(ebpf, MAP_CONFIG)?,
            filter: take(ebpf, MAP_FILTER)?,
            stats: take(ebpf, MAP_STATS)?,
            entries: take(ebpf, MAP_ENTRIES)?,
            tracked: take(ebpf, MAP_TRACKED)?,
            drops: take(ebpf, MAP_DROPS)?,
            limited: take(ebpf, MAP_LIMITED)?,
            unslotted: take(ebpf, MAP_UNSLOTTED)?,
            slots: take(ebpf, tracer_common::names::MAP_SLOTS)?,
            slots_cg: take(ebpf, tracer_common::names::MAP_SLOTS_CGROUP)?,
            launches_fd: ebpf.map(MAP_LAUNCHES).and_then(|m| match m {
                aya::maps::Map::HashMap(data) => std::os::fd::AsFd::as_fd(data.fd())
                    .try_clone_to_owned()
                    .ok(),
                _ => None,
            }),
            entries_fd: ebpf.map(MAP_ENTRIES).and_then(|m| match m {
                aya::maps::Map::LruHashMap(data) | aya::maps::Map::HashMap(data) => {
                    std::os::fd::AsFd::as_fd(data.fd())
                        .try_clone_to_owned()
                        .ok()
                }
                _ => None,
            }),
            launches: take(ebpf, MAP_LAUNCHES)?,
            cells: take(ebpf, MAP_CELLS)?,
        })
    }

    /// Starts or stops recording: the entry programs save nothing while disabled.
    pub fn set_enabled(&mut self, on: bool) -> Result<()> {
        self.set_config(CONFIG_ENABLED, u32::from(on))
    }

    /// Sets how many bytes wait in the ring buffer before the reader is woken (0: every record).
    pub fn set_wakeup_bytes(&mut self, bytes: u32) -> Result<()> {
        self.set_config(CONFIG_WAKEUP_BYTES, bytes)
    }

    /// Tells the exit program where `task_struct.exit_code` is (0: unknown).
    pub fn set_exit_code_offset(&mut self, offset: u32) -> Result<()> {
        self.set_config(tracer_common::CONFIG_EXIT_CODE_OFFSET, offset)
    }

    /// Sets the most records a process may write per second (0: no limit).
    pub fn set_rate_limit(&mut self, per_second: u32) -> Result<()> {
        self.set_config(CONFIG_RATE_LIMIT, per_second)
    }

    /// Counts launches in-kernel and writes the ones `sampling` says (`None`: every launch is
    /// written, as `trace` wants).
    pub fn set_aggregation(&mut self, sampling: Option<Sampling>) -> Result<()> {
        let s = sampling.unwrap_or(Sampling {
            first_per_second: 0,
            one_in: 0,
            slow_us: 0,
            cells_per_process: 0,
        });
        self.set_config(CONFIG_CELL_QUOTA, s.cells_per_process)?;
        self.set_config(CONFIG_SAMPLE_FIRST, s.first_per_second)?;
        self.set_config(CONFIG_SAMPLE_EVERY, s.one_in)?;
        self.set_config(CONFIG_SLOW_US, s.slow_us)?;
        self.set_config(CONFIG_AGGREGATE, u32::from(sampling.is_some()))
    }

    /// Tells the launch programs that their returns are detached (`true`: count at entry).
    pub fn set_returns_closed(&mut self, closed: bool) -> Result<()> {
        self.set_config(tracer_common::CONFIG_RETURNS_CLOSED, u32::from(closed))
    }

    fn set_config(&mut self, index: u32, value: u32) -> Result<()> {
        self.config.set(index, value, 0)?;
        Ok(())
    }

    /// Sets the in-kernel filter (before recording starts).
    pub fn set_filter(&mut self, filter: Filter) -> Result<()> {
        self.filter.set(0, filter, 0)?;
        Ok(())
    }

    /// Asks the kernel to report this process's exit (a tracked process).
    pub fn track(&mut self, pid: u32) {
        // A full map only costs the exit record; the process is then released by eviction.
        let _ = self.tracked.insert(pid, 1, 0);
    }

    /// Stops tracking a process (it was found gone).
    pub fn untrack(&mut self, pid: u32) {
        let _ = self.tracked.remove(&pid);
    }

    /// What the kernel side counted: records not written by [`DROP_REASONS`], and orphan
    /// returns.
    pub fn counters(&self) -> Result<(Drops, u64)> {
        let sum = |i: u32| -> Result<u64> { Ok(self.stats.get(&i, 0)?.iter().sum()) };
        let dropped = Drops {
            ring_full: sum(STAT_DROPPED)?,
            rate_limited: sum(STAT_RATE_LIMITED)?,
        };
        Ok((dropped, sum(STAT_ORPHAN_RETURNS)?))
    }

    /// Opens of files named like libcuda the kernel could not report (its ring was full).
    pub fn opens_lost(&self) -> u64 {
        self.stat(STAT_OPENS_LOST)
    }

    /// Launches the kernel added to their cells so far (all CPUs): while it stands still, no
    /// cell changed.
    pub fn launches_counted(&self) -> u64 {
        self.stat(STAT_COUNTED)
    }

    /// Launches of threads without a slot, counted untimed (see `STAT_COUNTED_UNSLOTTED`).
    pub fn counted_unslotted(&self) -> u64 {
        self.stat(tracer_common::STAT_COUNTED_UNSLOTTED)
    }

    /// Processes and cgroups that hold entry slots now (each map's entries: they drain as
    /// threads exit).
    pub fn slot_holders(&self) -> (usize, usize) {
        (self.slots.keys().count(), self.slots_cg.keys().count())
    }

    /// Launches counted after the fact (see `STAT_COUNTED_LATE`).
    pub fn counted_late(&self) -> u64 {
        self.stat(tracer_common::STAT_COUNTED_LATE)
    }

    /// Cells the kernel made in the launch map so far: while it stands still, the keys known
    /// are all there are.
    pub fn cells_made(&self) -> u64 {
        self.stat(STAT_CELLS_MADE)
    }

    /// One launch cell now (one system call), if it is there.
    pub fn launch_cell(&self, key: &LaunchKey) -> Option<LaunchCell> {
        self.launches.get(key, 0).ok()
    }

    /// `CUDA_ERROR_NOT_READY` answers to polls, filtered in the kernel (no record each).
    pub fn polls_not_ready(&self) -> u64 {
        self.stat(STAT_POLLS_NOT_READY)
    }

    fn stat(&self, i: u32) -> u64 {
        self.stats
            .get(&i, 0)
            .map(|per_cpu| per_cpu.iter().sum())
            .unwrap_or(0)
    }

    /// Records not written per process and reason (index into [`PROCESS_DROP_REASONS`]), the
    /// CPUs added up; at most `MAX_DROPPING` processes per reason, the least recent forgotten
    /// first.
    pub fn drops_by_process(&self) -> Vec<ProcessDrops> {
        [&self.drops, &self.limited, &self.unslotted]
            .into_iter()
            .enumerate()
            .flat_map(|(reason, map)| {
                map.iter()
                    .filter_map(Result::ok)
                    .map(move |(pid, per_cpu)| ProcessDrops {
                        pid,
                        reason: PROCESS_DROP_REASONS[reason],
                        count: per_cpu.iter().sum(),
                    })
            })
            .collect()
    }

    /// Threads inside a driver call now (their slot is busy), and processes tracked for their
    /// exit.
    pub fn inflight_and_tracked(&self) -> (usize, usize) {
        let busy = self
            .entries
            .iter()
            .filter_map(Result::ok)
            .filter(|(_, e)| e.start_ns != 0)
            .count();
        (busy, self.tracked.keys().count())
    }

    /// Calls in the driver now that entered before `entered_before_ns` (CLOCK_MONOTONIC), read
    /// from the per-thread entry state (at most `MAX_INFLIGHT` slots, in batches where the
    /// kernel has them).
    pub fn in_flight(&self, entered_before_ns: u64) -> Vec<InFlight> {
        use std::os::fd::AsFd as _;
        let all: Vec<(u64, Entry)> = match self
            .entries_fd
            .as_ref()
            .map(|fd| super::batch::lookup_all(fd.as_fd()))
        {
            Some(Ok(Some(all))) => all,
            _ => self.entries.iter().filter_map(Result::ok).collect(),
        };
        all.into_iter()
            .filter(|(_, e)| e.start_ns != 0 && e.start_ns < entered_before_ns)
            .filter_map(|(pid_tgid, e)| {
                let id = (e.cookie & tracer_common::api::COOKIE_API_MASK) as u32;
                Some(InFlight {
                    pid: (pid_tgid >> 32) as u32,
                    start_ns: e.start_ns,
                    api: tracer_common::api::Api::from_id(id)?,
                })
            })
            .collect()
    }

    /// Every launch cell now (cumulative counts).
    pub fn launch_cells(&self) -> Vec<(LaunchKey, LaunchCell)> {
        use std::os::fd::AsFd as _;
        // In batches where the kernel has them; else two system calls per cell.
        if let Some(Ok(Some(cells))) = self
            .launches_fd
            .as_ref()
            .map(|fd| super::batch::lookup_all(fd.as_fd()))
        {
            return cells;
        }
        self.launches.iter().filter_map(Result::ok).collect()
    }

    /// Deletes launch cells of exited processes `pids`, and their counts of cells made.
    pub fn delete_launch_cells(&mut self, keys: &[LaunchKey], pids: &[u32]) {
        for k in keys {
            let _ = self.launches.remove(k);
        }
        for pid in pids {
            let _ = self.cells.remove(pid);
        }
    }
}
