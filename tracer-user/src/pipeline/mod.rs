//! The flow every command shares: probes attached (`probe`), records drained from the ring
//! buffer and decoded ([`decode`]), each call enriched against its process's registry entry
//! ([`enrich`]), then handed to the command's [`Consumer`] (aggregation and detection for `run`,
//! the printer for `trace`). [`Session`] owns the probes, the ring buffer, the registry and the
//! timers of that flow; each command owns the rest of its loop.
mod consumer;
mod drive;
mod harm;
mod headless;
pub mod launches;
mod open;
mod options;
mod pace;
mod rescan;
pub mod resolve;

pub use drive::{Ending, Pipeline, Stages};
pub use options::{SessionOptions, Tuning, TRACER_MAX_LIBRARIES, TRACER_MAX_PROCESSES};
#[cfg(test)]
mod property_tests;

use std::{
    io,
    pin::Pin,
    time::{Duration, Instant},
};

use anyhow::Result;
use aya::maps::{MapData, RingBuf};
use tokio::{
    io::unix::AsyncFd,
    signal::unix::Signal,
    time::{Interval, Sleep},
};

use crate::{
    event::{self, DecodeError, Detail, RingRecord},
    identity::{self, Comm},
    probe::{
        discovery::{self, Discovery},
        loader::{Drops, ProbeRow, Probes, ProcessDrops},
    },
    registry::{Process, Registry},
};
pub use consumer::{Consumer, Flow, Wake};
use launches::Harvest;

/// How often running processes are looked at in /proc (a leader that exited, a start time
/// that changed): by the clock, since drains come faster under load.
const PROCESS_CHECK_PERIOD: Duration = Duration::from_secs(1);
/// How often the launches counted in-kernel are read, besides before a scrape, a detection
/// window, a process's release and the end.
const HARVEST_PERIOD: Duration = Duration::from_millis(500);

/// Counts of what the session consumed.
#[derive(Clone, Copy, Debug, Default)]
pub struct Counts {
    /// Call records.
    pub events: u64,
    /// Records that could not be decoded.
    pub decode_errors: u64,
    /// Exit records.
    pub exits: u64,
    /// Processes found gone (or their pid reused) without an exit record.
    pub stale: u64,
    /// Launches counted in-kernel.
    pub launches_counted: u64,
    /// Records of those (samples, batch openers, slow or failed ones).
    pub launch_samples: u64,
    /// Synchronous faults of probed threads that were not a probe's harm (the workload's own).
    pub own_faults: u64,
}

/// Lost opens (a tenant flooding them) ask for a pass over every process at most this often.
const LOST_OPENS_PASS_GAP: std::time::Duration = std::time::Duration::from_secs(10);

/// A tracing session: probes, ring buffer, registry, timers.
pub struct Session {
    probes: Probes,
    ring: AsyncFd<RingBuf<MapData>>,
    /// Every traced process.
    pub registry: Registry,
    /// What was consumed so far.
    pub counts: Counts,
    /// Processes found already gone when first seen: released once the ring buffer is drained,
    /// since all their records are in it by then.
    gone: Vec<u32>,
    /// Processes that exited during this drain: released at its end, after a last read of
    /// their launches.
    leaving: Vec<u32>,
    /// What was read of the launches counted in-kernel.
    harvest: Harvest,
    harvested_at: Instant,
    /// Processes whose leader exited while other threads run on (`pthread_exit` in `main`),
    /// looked at about once a second (the kernel reports no later exit); with each, the
    /// leader's exit status and when it came (an exit_group's threads can outlive its record).
    headless: Vec<(u32, Option<i32>, Instant)>,
    /// When running processes were last looked at in /proc.
    checked_at: Instant,
    cmdline: bool,
    /// The discovery thread, while watching.
    discovery: Option<Discovery>,
    /// Libraries a discovery pass prepared, attached by [`Session::rescan`].
    found: discovery::Pass,
    /// Processes whose maps discovery read.
    discovery_stats: std::sync::Arc<discovery::Stats>,
    /// Libraries refused and opens the kernel lost when a full pass was last asked for.
    asked_full: (u64, u64),
    /// Opens were lost and their full pass waits out `LOST_OPENS_PASS_GAP`.
    full_deferred: bool,
    /// When a full pass was last asked for because the kernel lost opens.
    full_at: Instant,
    /// When the ring buffer is drained (see `pace`).
    pace: pace::Pace,
    /// How long one read of the ring buffer may go on while recording (`None` once stopped: the
    /// last drain reads all); else a flood would keep a slow consumer (and a signal) waiting.
    read_budget: Option<std::time::Duration>,
    /// The harm check's counts, suspicions and kernel log.
    harm: harm::HarmState,
    rescan: Interval,
    deadline: Pin<Box<Sleep>>,
    sigint: Signal,
    sigterm: Signal,
}

impl Session {
    /// Sets the per-process record rate limit (0: none).
    pub fn set_rate_limit(&mut self, per_second: u32) -> Result<()> {
        self.probes.maps.set_rate_limit(per_second)
    }

    /// Switches recording on; returns how many probes are attached.
    pub fn start_recording(&mut self) -> Result<usize> {
        self.probes.maps.set_enabled(true)?;
        Ok(self.probes.probe_count())
    }

    /// Every entry point of every attached library.
    pub fn probe_rows(&self) -> Vec<ProbeRow> {
        self.probes.rows()
    }

    /// The probe sites of every attached library, by how the kernel runs them.
    pub fn site_counts(&self) -> crate::probe::sites::SiteCounts {
        self.probes.site_counts()
    }

    /// Records not written per process and reason.
    pub fn drops_by_process(&self) -> Vec<ProcessDrops> {
        self.probes.maps.drops_by_process()
    }

    /// Libraries refused because `max_libraries` were attached.
    pub fn libraries_refused(&self) -> u64 {
        self.probes.refused()
    }

    /// What discovery did since start.
    pub fn discovery_counted(&self) -> discovery::Counted {
        self.discovery_stats.counted()
    }

    /// Calls in the driver now that entered at least `age` ago.
    pub fn in_flight_for(&self, age: Duration) -> Vec<crate::probe::bpf_maps::InFlight> {
        let before = event::monotonic_ns().saturating_sub(age.as_nanos() as u64);
        self.probes.maps.in_flight(before)
    }

    /// Records the kernel did not write, by reason.
    pub fn dropped(&self) -> Drops {
        self.probes
            .maps
            .counters()
            .map_or(Drops::default(), |(dropped, _)| dropped)
    }

    /// Whether no process is traced now: none in the registry (running or kept after its
    /// exit), none leaving, none waiting for its identity. Timers with nothing to do then stop.
    pub fn quiet(&self) -> bool {
        self.registry.is_empty()
            && self.leaving.is_empty()
            && self.gone.is_empty()
            && self.headless.is_empty()
    }

    /// Waits for the next thing to do.
    pub async fn wake(&mut self) -> io::Result<Wake> {
        /// What woke the loop below.
        enum Step {
            Tick,
            Found(Option<discovery::Pass>),
            Wake(Wake),
        }
        async fn found(d: &mut Option<Discovery>) -> Option<discovery::Pass> {
            match d {
                Some(d) => d.next().await,
                None => std::future::pending().await,
            }
        }
        loop {
            let watching = self.discovery.is_some();
            let clock = self.discovery_clock();
            let quiet = self.quiet();
            let step = tokio::select! {
                _ = self.sigint.recv() => Step::Wake(Wake::Stop),
                _ = self.sigterm.recv() => Step::Wake(Wake::Stop),
                _ = &mut self.deadline => Step::Wake(Wake::Stop),
                _ = self.rescan.tick(), if clock => Step::Tick,
                f = found(&mut self.discovery), if watching => Step::Found(f),
                _ = self.pace.tick(quiet) => Step::Wake(Wake::Drain),
                guard = self.ring.readable_mut() => {
                    // Everything is drained right after: readiness that arrives meanwhile wakes again.
                    guard?.clear_ready();
                    Step::Wake(Wake::Drain)
                }
            };
            match step {
                Step::Wake(w) => return Ok(w),
                Step::Tick => self.tick_discovery(),
                Step::Found(Some(found)) => {
                    self.found = found;
                    return Ok(Wake::Rescan);
                }
                Step::Found(None) => {
                    log::error!("cudatrace: the discovery thread ended; libraries mapped from now on are not traced");
                    self.discovery = None;
                }
            }
        }
    }

    /// Does what woke the session: drains into `consumer`, or attaches what discovery found.
    pub fn act(&mut self, wake: Wake, consumer: &mut impl Consumer) -> Flow {
        match wake {
            Wake::Stop => Flow::Stop,
            Wake::Rescan if self.rescan() => Flow::Attached,
            Wake::Rescan => Flow::Continue,
            Wake::Drain => match self.drain(consumer) {
                Ok(()) => Flow::Continue,
                Err(_) => Flow::OutputClosed,
            },
        }
    }

    /// Reads every record now in the ring buffer into `consumer`, then (every
    /// `HARVEST_PERIOD`, or when a process leaves) the launches counted in-kernel, then
    /// releases the processes that left. An error is the consumer's output closing.
    pub fn drain(&mut self, consumer: &mut impl Consumer) -> io::Result<()> {
        let records = self.read_ring(consumer)?;
        let awake = records + u64::from(self.probes.windows_closed_now());
        if self.pace.after_drain(awake, &mut self.probes.maps) {
            let late = self.read_ring(consumer)?;
            self.pace.after_drain(late, &mut self.probes.maps);
        }
        for pid in std::mem::take(&mut self.gone) {
            self.probes.maps.untrack(pid);
            self.leaving.push(pid);
        }
        if self.checked_at.elapsed() >= PROCESS_CHECK_PERIOD {
            self.checked_at = Instant::now();
            self.kernel_log(consumer);
            self.settle_headless();
            // A process whose exit record was lost (or whose pid was reused meanwhile) goes
            // now: its pid shows another start time, or none.
            for pid in self.registry.stale(identity::start_time) {
                if !self.headless.iter().any(|h| h.0 == pid) && !self.leaving.contains(&pid) {
                    self.probes.maps.untrack(pid);
                    self.counts.stale += 1;
                    self.leaving.push(pid);
                }
            }
        }
        if !self.leaving.is_empty() || self.harvested_at.elapsed() >= HARVEST_PERIOD {
            self.harvest(consumer);
        }
        self.release_leaving(consumer);
        self.probes.tick_windows();
        self.probes.flush_log();
        consumer.flush()
    }

    /// Hands every record now in the ring buffer to `consumer`; returns how many there were.
    fn read_ring(&mut self, consumer: &mut impl Consumer) -> io::Result<u64> {
        let mut records = 0;
        let began = Instant::now();
        loop {
            // The clock is read once every 1,024 records: a few µs of them.
            if records % 1024 == 1023 && self.read_budget.is_some_and(|b| began.elapsed() >= b) {
                return Ok(records);
            }
            let record = match self.ring.get_mut().next() {
                Some(item) => event::decode_record(&item),
                None => return Ok(records),
            };
            records += 1;
            self.handle(record, consumer)?;
        }
    }

    fn handle(
        &mut self,
        record: Result<RingRecord, DecodeError>,
        consumer: &mut impl Consumer,
    ) -> io::Result<()> {
        let mut ev = match record {
            Ok(RingRecord::Call(ev)) => ev,
            Ok(RingRecord::Exit(pid, status)) => {
                // The leader's exit, reported by the kernel; the process lives on while another
                // of its threads does (a tenant's pthread_exit in main must not hide its calls).
                if self.registry.live_mut(pid).is_some() && identity::process_alive(pid) {
                    if !self.headless.iter().any(|h| h.0 == pid) {
                        self.headless.push((pid, status, Instant::now()));
                    }
                    return Ok(());
                }
                self.counts.exits += 1;
                if let Some(p) = self.registry.live_mut(pid) {
                    p.exit_status = status;
                }
                if !self.leaving.contains(&pid) {
                    self.leaving.push(pid);
                }
                return Ok(());
            }
            Ok(RingRecord::Fault(f)) => {
                self.fault(f, consumer);
                return Ok(());
            }
            Ok(RingRecord::Name(pid, _tid, renamed, comm)) => {
                let cmdline = self.cmdline;
                match self.registry.live_mut(pid) {
                    Some(p) if renamed => p.comm = comm,
                    Some(_) => {}
                    None => {
                        let _ = Self::admit(
                            &mut self.probes,
                            &mut self.registry,
                            &mut self.gone,
                            pid,
                            Some(comm),
                            cmdline,
                        );
                    }
                }
                return Ok(());
            }
            Err(e) => {
                self.counts.decode_errors += 1;
                if self.counts.decode_errors == 1 {
                    log::warn!("cudatrace: skipping undecodable record: {e}");
                }
                return Ok(());
            }
        };
        self.counts.events += 1;
        self.counts.launch_samples += u64::from(ev.counted);
        let cmdline = self.cmdline;
        let process = match self.registry.live_mut(ev.pid) {
            // A process seen before: one lookup.
            Some(p) => p,
            None => Self::admit(
                &mut self.probes,
                &mut self.registry,
                &mut self.gone,
                ev.pid,
                None,
                cmdline,
            ),
        };
        ev.comm = process.comm;
        if matches!(ev.detail, Detail::Resolve { .. }) {
            resolve::check(&self.probes.libraries, process, &ev);
        }
        let consumed = consumer::consume(process, &mut ev, consumer);
        if matches!(ev.detail, Detail::Lookup { .. }) {
            self.registry.bound_kernel_names();
        }
        consumed
    }

    /// Makes the registry entry of a process seen for the first time, named `comm` (its first
    /// thread's name) or its name in /proc.
    fn admit<'r>(
        probes: &mut Probes,
        registry: &'r mut Registry,
        gone: &mut Vec<u32>,
        pid: u32,
        comm: Option<Comm>,
        cmdline: bool,
    ) -> &'r mut Process {
        // From now on the kernel reports this process's exit. Tracked before /proc is read: a
        // process that had begun exiting by then is read as gone and released after this drain
        // instead (all its records are in the ring buffer by then).
        probes.maps.track(pid);
        let identity = identity::read(pid, cmdline);
        if !identity.alive {
            gone.push(pid);
        }
        let comm = comm.unwrap_or_else(|| identity::comm(pid));
        registry.insert(pid, comm, identity)
    }

    /// A process exited: its final lines, the consumer's last word, then its tables go.
    /// `false` when it was not a running process.
    fn exit(&mut self, pid: u32, consumer: &mut impl Consumer) -> bool {
        self.registry.exit(pid, |p| {
            consumer::final_lines(p);
            consumer.exited(p);
        })
    }

    /// Stops recording, drains what the programs had already written (unless the output is
    /// closed) and prints the summary. Then [`Session::detach`].
    pub fn finish(&mut self, consumer: &mut impl Consumer, ending: Ending) -> Result<()> {
        // Stop recording first so that nothing new arrives, then read what was written: all of
        // it, however long that takes (nothing new comes in now).
        self.probes.maps.set_enabled(false)?;
        self.read_budget = None;
        if ending != Ending::OutputClosed {
            let _ = self.drain(consumer);
        }
        self.harvest.reread();
        self.harvest(consumer);
        self.settle_headless();
        self.release_leaving(consumer);
        let (dropped, orphans) = self.probes.maps.counters()?;
        let (inflight, tracked) = self.probes.maps.inflight_and_tracked();
        let live = self.registry.live_sorted();
        for p in &live {
            if p.memory.touched() {
                log::info!(target: "cudatrace::memory", pid = p.pid; "{}", p.memory.line(p.pid));
            }
        }
        for p in &live {
            for line in p.streams.lines(p.pid) {
                log::info!(target: "cudatrace::device_time", pid = p.pid; "{line}");
            }
            if let Some(line) = p.graphs.line(p.pid) {
                log::info!(target: "cudatrace::graphs", pid = p.pid; "{line}");
            }
        }
        let polls = self.probes.maps.polls_not_ready();
        let c = self.counts;
        let (events, counted, samples) = (c.events, c.launches_counted, c.launch_samples);
        let (ring_full, rate_limited, undecodable) =
            (dropped.ring_full, dropped.rate_limited, c.decode_errors);
        let (probes, exits, live) = (self.probes.probe_count(), c.exits, live.len());
        let launch_probes = self.probes.launch_probes().name();
        let (windows, late, unslotted) = (
            self.probes.windows_closed(),
            self.probes.maps.counted_late(),
            self.probes.maps.counted_unslotted(),
        );
        let (slot_pids, slot_cgroups) = self.probes.maps.slot_holders();
        log::info!(
            target: "cudatrace::summary",
            events = events,
            launches_counted = counted,
            launch_samples = samples,
            dropped = ring_full,
            rate_limited = rate_limited,
            orphan_returns = orphans,
            polls_not_ready = polls,
            undecodable = undecodable,
            probes = probes,
            launch_probes = launch_probes,
            windows_closed = windows,
            counted_late = late,
            counted_unslotted = unslotted,
            slot_processes = slot_pids,
            slot_cgroups = slot_cgroups,
            exits = exits,
            live_processes = live,
            inflight_entries = inflight,
            tracked_processes = tracked;
            "summary: events={events} launches_counted={counted} launch_samples={samples} \
             dropped={ring_full} rate_limited={rate_limited} orphan_returns={orphans} \
             polls_not_ready={polls} undecodable={undecodable} probes={probes} \
             launch_probes={launch_probes} windows_closed={windows} counted_late={late} \
             counted_unslotted={unslotted} slot_processes={slot_pids} slot_cgroups={slot_cgroups} \
             exits={exits} live_processes={live} inflight_entries={inflight} tracked_processes={tracked}"
        );
        Ok(())
    }

    /// Detaches every probe without making the caller wait (see `Probes::detach_in_background`).
    pub fn detach(self) {
        self.probes.detach_in_background();
    }
}
