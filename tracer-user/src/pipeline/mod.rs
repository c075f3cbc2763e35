//! The flow every command shares: probes attached (`probe`), records drained from the ring
//! buffer and decoded ([`decode`]), each call enriched against its process's registry entry
//! ([`enrich`]), then handed to the command's [`Consumer`] (aggregation and detection for `run`,
//! the printer for `trace`). [`Session`] owns the probes, the ring buffer, the registry and the
//! timers of that flow; each command owns the rest of its loop.
pub mod decode;
mod discovery;
pub mod enrich;
#[cfg(test)]
mod property_tests;

use std::{
    io,
    path::PathBuf,
    pin::Pin,
    time::Duration,
};

use anyhow::{Context as _, Result, bail};
use aya::maps::{MapData, RingBuf};
use tokio::{
    io::{Interest, unix::AsyncFd},
    signal::unix::{Signal, SignalKind, signal},
    time::{Interval, MissedTickBehavior, Sleep},
};

use crate::{
    probe::{
        allow::AllowList,
        caps, discover,
        ebpf_log::LogLevel,
        filter::{self, FilterOptions},
        loader::{self, Probes},
    },
    registry::{Process, Registry, RegistryLimits},
};
use discovery::Discovery;
use decode::{DecodeError, Event, RingRecord};
use enrich::{Enrichment, identity};

/// How often the ring buffer is drained when the kernel has not woken the reader: the most an
/// event waits before it is printed or counted.
const POLL_PERIOD: Duration = Duration::from_millis(20);
/// How often running processes are looked at in /proc (a leader that exited, a start time
/// that changed): by the clock, since drains come faster under load.
const PROCESS_CHECK_PERIOD: Duration = Duration::from_secs(1);

/// What to trace and how, for every command.
pub struct SessionOptions {
    /// Libraries to attach; discovered (and watched for) when empty.
    pub libs: Vec<PathBuf>,
    /// Only this process, and threads and cgroups as the filter says.
    pub filter: FilterOptions,
    /// Stop after this long.
    pub duration: Option<Duration>,
    /// Ring-buffer size in bytes.
    pub ringbuf_bytes: u32,
    /// What the eBPF programs report on stderr.
    pub log_level: LogLevel,
    /// How often to look for newly mapped libcuda files, without `--lib`.
    pub rescan: Duration,
    /// What the process registry keeps.
    pub limits: RegistryLimits,
    /// Whether identities keep the command line (`trace --cmdline`; it may hold secrets).
    pub cmdline: bool,
    /// Distinct library files attached at most.
    pub max_libraries: usize,
    /// `--lib-allow` globs: only the host's files they name are attached (none: any).
    pub lib_allow: Vec<String>,
}

/// Where a session's calls go; each command implements it.
pub trait Consumer {
    /// One decoded call, with what enrichment learned and its process's entry.
    fn call(&mut self, ev: &Event, enrichment: &Enrichment, process: &mut Process) -> io::Result<()>;
    /// A process exited; its per-call tables are released after this.
    fn exited(&mut self, _process: &mut Process) {}
    /// After each drained batch.
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// What woke the session.
pub enum Wake {
    /// A signal or the deadline: stop.
    Stop,
    /// Records wait (or the poll period passed): drain.
    Drain,
    /// Time to look for libraries mapped since the last look.
    Rescan,
}

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
}

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
    /// Processes whose leader exited while other threads run on (`pthread_exit` in `main`):
    /// the kernel reports no later exit, so they are looked at about once a second.
    headless: Vec<u32>,
    /// When running processes were last looked at in /proc.
    checked_at: std::time::Instant,
    cmdline: bool,
    /// The discovery thread, while watching.
    discovery: Option<Discovery>,
    /// Libraries a discovery pass prepared, attached by [`Session::rescan`].
    found: Vec<discover::Prepared>,
    poll: Interval,
    rescan: Interval,
    deadline: Pin<Box<Sleep>>,
    sigint: Signal,
    sigterm: Signal,
}

/// Attaches each library not attached yet; returns the failures.
fn attach_all(probes: &mut Probes, libs: &[PathBuf], quiet_errors: bool) -> Vec<anyhow::Error> {
    let mut failures = Vec::new();
    for lib in libs {
        match probes.attach_library(lib) {
            Ok(Some(attached)) => eprintln!("{}", crate::sinks::stdout::printable(&loader::report(attached))),
            Ok(None) => {}
            Err(e) => {
                if !quiet_errors {
                    eprintln!("cudatrace: {}", crate::sinks::stdout::printable(&format!("{e:#}")));
                }
                failures.push(e);
            }
        }
    }
    failures
}

/// Attaches one library discovery prepared; says what was attached, or why not.
fn attach_one(probes: &mut Probes, p: discover::Prepared) {
    match probes.attach_prepared(p) {
        Ok(Some(attached)) => eprintln!("{}", crate::sinks::stdout::printable(&loader::report(attached))),
        Ok(None) => {}
        Err(e) => eprintln!("cudatrace: {}", crate::sinks::stdout::printable(&format!("{e:#}"))),
    }
}

impl Session {
    /// Checks privileges, attaches (or starts watching for) the libraries and arms the timers.
    /// Recording starts with [`Session::start_recording`].
    pub fn open(opts: SessionOptions) -> Result<Session> {
        let watch = opts.libs.is_empty();
        if let Some(why) = caps::missing_privilege(watch) {
            bail!(why);
        }
        let filter = filter::build(&opts.filter)?;
        let allow = AllowList::new(opts.lib_allow.clone())?;
        let libs = if watch { discover::loader_libraries() } else { opts.libs.clone() };
        let mut probes = loader::load(opts.ringbuf_bytes, opts.filter.pid, opts.log_level, opts.max_libraries)?;
        probes.set_filter(filter)?;
        probes.set_allow(allow);
        let mut discovery = if watch { Some(Discovery::start().context("cannot start the discovery thread")?) } else { None };
        if let Some(d) = discovery.as_mut() {
            for p in d.first_pass(probes.settled()) {
                attach_one(&mut probes, p);
            }
        }
        // With one library its error is the run's error, printed once below.
        let failures = attach_all(&mut probes, &libs, !watch && libs.len() == 1);
        if watch && probes.probe_count() == 0 {
            eprintln!("no libcuda in use or installed yet; watching for processes that map one");
        }
        if probes.probe_count() == 0 && !watch {
            match failures.into_iter().next() {
                Some(e) if libs.len() == 1 => return Err(e),
                _ => bail!("no probe attached in any of {} libraries; pass a libcuda.so.1 with --lib", libs.len()),
            }
        }
        let ring = probes.take_ring().context("the ring buffer was taken already")?;
        // SAFETY: the ring buffer owns its fd, and AsyncFd owns the ring buffer until into_inner.
        let ring = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
            .map_err(|e| anyhow::anyhow!("cannot poll the ring buffer: {}", e.into_parts().1))?;
        let mut poll = tokio::time::interval(POLL_PERIOD);
        poll.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut rescan = tokio::time::interval(opts.rescan);
        rescan.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let forever = Duration::from_secs(u64::MAX / 4);
        // Wake the reader when an eighth of the ring buffer is used; drain on a timer otherwise.
        probes.set_wakeup_bytes(opts.ringbuf_bytes / 8)?;
        // Loaded and attached: from here on only discovery and identity need privileges (and
        // attaching, while watching). Threads started later inherit the reduced set.
        if let Err(e) = caps::reduce(watch, !probes.multi()) {
            eprintln!("cudatrace: cannot drop the capabilities it no longer needs ({e}); tracing goes on");
        }
        Ok(Session {
            probes,
            ring,
            registry: Registry::new(opts.limits),
            counts: Counts::default(),
            gone: Vec::new(),
            headless: Vec::new(),
            checked_at: std::time::Instant::now(),
            cmdline: opts.cmdline,
            discovery,
            found: Vec::new(),
            poll,
            rescan,
            deadline: Box::pin(tokio::time::sleep(opts.duration.unwrap_or(forever))),
            sigint: signal(SignalKind::interrupt())?,
            sigterm: signal(SignalKind::terminate())?,
        })
    }

    /// Sets the per-process record rate limit (0: none).
    pub fn set_rate_limit(&mut self, per_second: u32) -> Result<()> {
        self.probes.set_rate_limit(per_second)
    }

    /// Switches recording on; returns how many probes are attached.
    pub fn start_recording(&mut self) -> Result<usize> {
        self.probes.set_enabled(true)?;
        Ok(self.probes.probe_count())
    }

    /// (symbol, library, attached) of every entry point of every attached library.
    pub fn probe_rows(&self) -> Vec<(&'static str, String, bool)> {
        self.probes.rows()
    }

    /// Records not written per process: (pid, reason index into `loader::DROP_REASONS`, count).
    pub fn drops_by_process(&self) -> Vec<(u32, usize, u64)> {
        self.probes.drops_by_process()
    }

    /// Libraries refused because `max_libraries` were attached.
    pub fn libraries_refused(&self) -> u64 {
        self.probes.refused()
    }

    /// Records the kernel did not write, by `loader::DROP_REASONS` (ring buffer full, rate limit).
    pub fn dropped(&self) -> [u64; 2] {
        self.probes.counters().map_or([0; 2], |(dropped, _)| dropped)
    }

    /// Waits for the next thing to do.
    pub async fn wake(&mut self) -> io::Result<Wake> {
        /// What woke the loop below.
        enum Step {
            Tick,
            Found(Option<Vec<discover::Prepared>>),
            Wake(Wake),
        }
        async fn found(d: &mut Option<Discovery>) -> Option<Vec<discover::Prepared>> {
            match d {
                Some(d) => d.next().await,
                None => std::future::pending().await,
            }
        }
        loop {
            let watching = self.discovery.is_some();
            let step = tokio::select! {
                _ = self.sigint.recv() => Step::Wake(Wake::Stop),
                _ = self.sigterm.recv() => Step::Wake(Wake::Stop),
                _ = &mut self.deadline => Step::Wake(Wake::Stop),
                _ = self.rescan.tick(), if watching => Step::Tick,
                f = found(&mut self.discovery), if watching => Step::Found(f),
                _ = self.poll.tick() => Step::Wake(Wake::Drain),
                guard = self.ring.readable_mut() => {
                    // Everything is drained right after: readiness that arrives meanwhile wakes again.
                    guard?.clear_ready();
                    Step::Wake(Wake::Drain)
                }
            };
            match step {
                Step::Wake(w) => return Ok(w),
                Step::Tick => {
                    let settled = self.probes.settled();
                    if let Some(d) = self.discovery.as_mut() {
                        d.request(settled);
                    }
                }
                Step::Found(Some(found)) => {
                    self.found = found;
                    return Ok(Wake::Rescan);
                }
                Step::Found(None) => {
                    eprintln!("cudatrace: the discovery thread ended; libraries mapped from now on are not traced");
                    self.discovery = None;
                }
            }
        }
    }

    /// Attaches the libcuda files the last discovery pass found; returns whether any was
    /// attached.
    pub fn rescan(&mut self) -> bool {
        let found = std::mem::take(&mut self.found);
        let before = self.probes.libraries.len();
        if !found.is_empty() {
            self.probes.refresh_allow();
        }
        for p in found {
            attach_one(&mut self.probes, p);
        }
        for lib in &self.probes.libraries[before..] {
            let path = lib.path.display().to_string();
            eprintln!("discovered: {} at_ns={}", crate::sinks::stdout::printable(&path), decode::monotonic_ns());
        }
        self.probes.libraries.len() > before
    }

    /// Reads every record now in the ring buffer into `consumer`. An error is the consumer's
    /// output closing.
    pub fn drain(&mut self, consumer: &mut impl Consumer) -> io::Result<()> {
        loop {
            let record = match self.ring.get_mut().next() {
                Some(item) => decode::decode_record(&item),
                None => break,
            };
            self.handle(record, consumer)?;
        }
        for pid in std::mem::take(&mut self.gone) {
            self.probes.untrack(pid);
            self.exit(pid, consumer);
        }
        if self.checked_at.elapsed() >= PROCESS_CHECK_PERIOD {
            self.checked_at = std::time::Instant::now();
            self.settle_headless(consumer);
            // A process whose exit record was lost (or whose pid was reused meanwhile) goes
            // now: its pid shows another start time, or none.
            for pid in self.registry.stale(identity::start_time) {
                if !self.headless.contains(&pid) && self.exit(pid, consumer) {
                    self.probes.untrack(pid);
                    self.counts.stale += 1;
                }
            }
        }
        self.probes.flush_log();
        consumer.flush()
    }

    fn handle(&mut self, record: Result<RingRecord, DecodeError>, consumer: &mut impl Consumer) -> io::Result<()> {
        let ev = match record {
            Ok(RingRecord::Call(ev)) => ev,
            Ok(RingRecord::Exit(pid)) => {
                // The leader's exit, reported by the kernel; the process lives on while another
                // of its threads does (a tenant's pthread_exit in main must not hide its calls).
                if self.registry.live_mut(pid).is_some() && identity::process_alive(pid) {
                    if !self.headless.contains(&pid) {
                        self.headless.push(pid);
                    }
                    return Ok(());
                }
                self.counts.exits += 1;
                self.exit(pid, consumer);
                return Ok(());
            }
            Err(e) => {
                self.counts.decode_errors += 1;
                if self.counts.decode_errors == 1 {
                    eprintln!("cudatrace: skipping undecodable record: {e}");
                }
                return Ok(());
            }
        };
        self.counts.events += 1;
        // A process seen before: one lookup.
        if let Some(process) = self.registry.live_mut(ev.pid) {
            return consume(process, &ev, consumer);
        }
        // From now on the kernel reports this process's exit. Tracked before /proc is read: a
        // process that had begun exiting by then is read as gone and released after this drain
        // instead (all its records are in the ring buffer by then).
        self.probes.track(ev.pid);
        let identity = identity::read(ev.pid, self.cmdline);
        if !identity.alive {
            self.gone.push(ev.pid);
        }
        let process = self.registry.insert(ev.pid, ev.comm, identity);
        consume(process, &ev, consumer)
    }

    /// Releases the processes whose leader exited and whose last thread has now gone too.
    fn settle_headless(&mut self, consumer: &mut impl Consumer) {
        if self.headless.is_empty() {
            return;
        }
        let (gone, running): (Vec<u32>, Vec<u32>) = self.headless.iter().partition(|pid| !identity::process_alive(**pid));
        self.headless = running;
        for pid in gone {
            self.counts.exits += 1;
            self.exit(pid, consumer);
        }
    }

    /// A process exited: its final lines, the consumer's last word, then its tables go.
    /// `false` when it was not a running process.
    fn exit(&mut self, pid: u32, consumer: &mut impl Consumer) -> bool {
        self.registry.exit(pid, |p| {
            final_lines(p);
            consumer.exited(p);
        })
    }

    /// Stops recording, drains what the programs had already written (unless the output is
    /// closed) and prints the summary. Then [`Session::detach`].
    pub fn finish(&mut self, consumer: &mut impl Consumer, output_closed: bool) -> Result<()> {
        // Stop recording first so that nothing new arrives, then read what was written.
        self.probes.set_enabled(false)?;
        if !output_closed {
            let _ = self.drain(consumer);
        }
        self.settle_headless(consumer);
        let (dropped, orphans) = self.probes.counters()?;
        let (inflight, tracked) = self.probes.inflight_and_tracked();
        let live = self.registry.live_sorted();
        for p in &live {
            if p.memory.touched() {
                eprintln!("{}", p.memory.line(p.pid));
            }
        }
        for p in &live {
            for line in p.streams.lines(p.pid) {
                eprintln!("{line}");
            }
        }
        let c = self.counts;
        eprintln!(
            "summary: events={} dropped={} rate_limited={} orphan_returns={orphans} undecodable={} probes={} \
             exits={} live_processes={} inflight_entries={inflight} tracked_processes={tracked}",
            c.events,
            dropped[0],
            dropped[1],
            c.decode_errors,
            self.probes.probe_count(),
            c.exits,
            live.len()
        );
        Ok(())
    }

    /// Detaches every probe without making the caller wait (see `Probes::detach_in_background`).
    pub fn detach(self) {
        self.probes.detach_in_background();
    }
}

/// One call of a known process: enriched against its tables, then handed to the consumer.
fn consume(process: &mut Process, ev: &Event, consumer: &mut impl Consumer) -> io::Result<()> {
    process.last_seen_ns = ev.start_ns.saturating_add(ev.duration_ns);
    let enrichment = enrich::enrich(process, ev);
    consumer.call(ev, &enrichment, process)
}

/// Prints a process's final memory and GPU-time lines.
fn final_lines(p: &Process) {
    if p.memory.touched() {
        eprintln!("{}", p.memory.line(p.pid));
    }
    for line in p.streams.lines(p.pid) {
        eprintln!("{line}");
    }
}
