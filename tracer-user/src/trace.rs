//! `cudatrace trace`: attach, stream events until a signal or `--duration`, then stop recording,
//! drain what is left in the ring buffer, print a summary and detach.
use std::{
    collections::HashSet,
    io::Write as _,
    path::PathBuf,
    time::{Duration, Instant, SystemTime},
};

use anyhow::{Context as _, Result, bail};
use aya::maps::{HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf};
use tokio::{
    io::{Interest, unix::AsyncFd},
    signal::unix::{SignalKind, signal},
};
use tracer_common::{FILTER_CGROUP, FILTER_COMM, Filter, STAT_DROPPED, STAT_ORPHAN_RETURNS};

use std::sync::{Arc, Mutex};

use tracer_common::Kind;

use crate::{
    aggregate::{Aggregator, Limits},
    alert::Sinks,
    attach::{self, Tracer},
    caps,
    config::Config,
    detect::Detector,
    discover,
    export::{self, Exported, Shared},
    nvml::Sampler,
    events::{self, Record},
    gputime::{GpuTime, StreamTime},
    identity::Identities,
    kernels::KernelTable,
    memory::{MemoryTable, ProcessMemory},
    output::Printer,
};

/// Options of `cudatrace trace`.
pub struct TraceOptions {
    /// Libraries to attach; discovered (and watched for) when empty.
    pub libs: Vec<PathBuf>,
    /// Only this process.
    pub pid: Option<u32>,
    /// Only threads with this comm.
    pub comm: Option<String>,
    /// Only processes in this cgroup (v2 directory).
    pub cgroup: Option<PathBuf>,
    /// Print events, or aggregate them and serve metrics.
    pub mode: Mode,
    /// Stop after this long.
    pub duration: Option<Duration>,
    /// Ring-buffer size in bytes.
    pub ringbuf_bytes: u32,
    /// How often to look for newly mapped libcuda files, without `--lib`.
    pub rescan: Duration,
}

/// What becomes of the events.
pub enum Mode {
    /// `cudatrace trace`: print every event (JSON lines or a table).
    Print {
        /// JSON lines instead of a table.
        json: bool,
    },
    /// `cudatrace run`: aggregate, sample NVML, serve Prometheus metrics.
    Serve(Box<Config>),
}

/// Everything learned from the events of one run.
struct State {
    events: u64,
    decode_errors: u64,
    exits: u64,
    kernels: KernelTable,
    memory: MemoryTable,
    gpu: GpuTime,
    identities: Identities,
    /// Kernel-side set of processes whose exit is to be reported.
    tracked: BpfHashMap<MapData, u32, u8>,
    /// Processes found already gone when first seen: forgotten once the ring buffer is drained,
    /// since all their records are in it by then.
    gone: Vec<u32>,
}

impl State {
    fn handle(&mut self, record: Record, out: &mut Out<'_>) -> std::io::Result<()> {
        let ev = match record {
            Record::Call(ev) => ev,
            Record::Exit(pid) => {
                self.exits += 1;
                self.forget(pid, out);
                return Ok(());
            }
        };
        self.events += 1;
        let identity = match self.identities.get(ev.pid) {
            Some(identity) => identity,
            None => {
                // From now on the kernel reports this process's exit. Inserted before /proc is
                // read: a process that had begun exiting by then is read as gone and forgotten
                // after this drain instead (all its records are in the ring buffer by then).
                let _ = self.tracked.insert(ev.pid, 1, 0);
                let identity = self.identities.read(ev.pid);
                if !identity.alive {
                    self.gone.push(ev.pid);
                }
                identity
            }
        };
        let kernel = self.kernels.observe(&ev);
        self.memory.observe(&ev);
        let est = self.gpu.observe(&ev);
        match out {
            Out::Print(printer) => printer.print(&ev, kernel.as_deref(), est.as_ref(), Some(&identity)),
            Out::Serve(ex) => {
                ex.agg.observe(&ev, kernel.as_deref(), &identity);
                ex.detector.observe(&ev, &identity, est.as_ref());
                // The gauges change only with allocations and frees (memory) and when a wait
                // closes a batch (GPU time): other calls leave them be.
                if matches!(ev.api.info().kind, Kind::Alloc | Kind::Free) {
                    if let Some(m) = self.memory.get(ev.pid) {
                        ex.agg.set_memory(ev.pid, m.current_bytes, m.peak_bytes);
                    }
                }
                if est.is_some() {
                    ex.agg.set_gpu_estimate(ev.pid, self.gpu.process_estimate(ev.pid));
                }
                Ok(())
            }
        }
    }

    /// Prints a process's final memory and GPU-time lines, then drops its state.
    fn forget(&mut self, pid: u32, out: &mut Out<'_>) {
        if let Out::Serve(ex) = out {
            ex.agg.forget(pid);
            ex.detector.forget(pid, SystemTime::now());
        }
        if let Some(m) = self.memory.get(pid) {
            eprintln!("{}", memory_line(pid, m));
        }
        for (key, s) in self.gpu.of_process(pid) {
            eprintln!("{}", gpu_line(&key, s));
        }
        self.kernels.forget(pid);
        self.memory.forget(pid);
        self.gpu.forget(pid);
        self.identities.forget(pid);
    }
}

/// How often the ring buffer is drained when the kernel has not woken the reader: the most an
/// event waits before it is printed or counted.
const POLL_PERIOD: Duration = Duration::from_millis(20);

/// Where a drained batch of events goes.
enum Out<'a> {
    Print(&'a mut Printer),
    Serve(&'a mut Exported),
}


fn filter(opts: &TraceOptions) -> Result<Filter> {
    let mut f = Filter::default();
    if let Some(comm) = &opts.comm {
        let bytes = comm.as_bytes();
        if bytes.is_empty() || bytes.len() > 15 {
            bail!("--comm {comm:?}: a thread name has 1 to 15 bytes (as in /proc/PID/comm)");
        }
        f.comm[..bytes.len()].copy_from_slice(bytes);
        f.flags |= FILTER_COMM;
    }
    if let Some(dir) = &opts.cgroup {
        use std::os::unix::fs::MetadataExt as _;
        let meta = std::fs::metadata(dir).with_context(|| {
            format!("--cgroup {}: no such cgroup directory; give a cgroup v2 path under /sys/fs/cgroup", dir.display())
        })?;
        f.cgroup_id = meta.ino();
        f.flags |= FILTER_CGROUP;
    }
    Ok(f)
}

/// Attaches each library not attached yet; returns how many were new.
fn attach_all(tracer: &mut Tracer, libs: &[PathBuf], quiet_errors: bool) -> Vec<anyhow::Error> {
    let mut failures = Vec::new();
    for lib in libs {
        match tracer.attach_library(lib) {
            Ok(Some(probes)) => eprintln!("{}", attach::report(probes)),
            Ok(None) => {}
            Err(e) => {
                if !quiet_errors {
                    eprintln!("cudatrace: {e:#}");
                }
                failures.push(e);
            }
        }
    }
    failures
}

/// Runs `cudatrace trace`.
pub async fn run(opts: TraceOptions) -> Result<()> {
    if let Some(why) = caps::missing_privilege() {
        bail!(why);
    }
    let filter = filter(&opts)?;
    // Bind before loading anything, so that a taken port is reported at once.
    let listener = match &opts.mode {
        Mode::Serve(cfg) => Some(export::bind(cfg.listen).await?),
        Mode::Print { .. } => None,
    };
    let watch = opts.libs.is_empty();
    let libs = if watch { discover::libraries() } else { opts.libs.clone() };
    if watch && libs.is_empty() {
        eprintln!("no libcuda in use or installed yet; watching for processes that map one");
    }
    let mut tracer = attach::load(opts.ringbuf_bytes, opts.pid)?;
    tracer.set_filter(filter)?;
    // With one library its error is the run's error, printed once below.
    let failures = attach_all(&mut tracer, &libs, !watch && libs.len() == 1);
    if tracer.probe_count() == 0 && !watch {
        match failures.into_iter().next() {
            Some(e) if libs.len() == 1 => return Err(e),
            _ => bail!("no probe attached in any of {} libraries; pass a libcuda.so.1 with --lib", libs.len()),
        }
    }
    let take = |tracer: &mut Tracer, name: &str| tracer.ebpf.take_map(name).with_context(|| format!("{name} map missing"));
    let ring = RingBuf::try_from(take(&mut tracer, "EVENTS")?)?;
    let stats: PerCpuArray<MapData, u64> = PerCpuArray::try_from(take(&mut tracer, "STATS")?)?;
    let entries: BpfHashMap<MapData, u64, [u64; 8]> = BpfHashMap::try_from(take(&mut tracer, "ENTRIES")?)?;
    let tracked = BpfHashMap::try_from(take(&mut tracer, "TRACKED")?)?;
    // SAFETY: the ring buffer owns its fd, and AsyncFd owns the ring buffer until into_inner.
    let mut ring = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
        .map_err(|e| anyhow::anyhow!("cannot poll the ring buffer: {}", e.into_parts().1))?;
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let deadline = tokio::time::sleep(opts.duration.unwrap_or(Duration::from_secs(u64::MAX / 4)));
    tokio::pin!(deadline);
    let mut rescan = tokio::time::interval(opts.rescan);
    rescan.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut nvml_tick = tokio::time::interval(Duration::from_millis(match &opts.mode {
        Mode::Serve(cfg) => cfg.nvml_period_ms,
        Mode::Print { .. } => 1000,
    }));
    let (mut printer, shared, mut sampler) = match &opts.mode {
        Mode::Print { json } => (Some(Printer::new(*json)), None, None),
        Mode::Serve(cfg) => {
            let sampler = Sampler::new(cfg.nvml_library.as_ref());
            if let Sampler::Off(why) = &sampler {
                eprintln!("cudatrace: {why}");
            }
            let limits = Limits {
                top_kernels: cfg.top_kernels,
                max_kernels: cfg.max_kernels,
                retain_exited: Duration::from_secs(cfg.retain_exited_s),
                max_processes: cfg.max_processes,
            };
            let shared: Shared = Arc::new(Mutex::new(Exported {
                agg: Aggregator::new(limits),
                detector: Detector::new(cfg.detect.clone(), cfg.max_processes, 0.0),
                gpus: Vec::new(),
                nvml_up: sampler.up(),
                probes: probe_rows(&tracer),
            }));
            let server = export::serve(listener.expect("bound above"), export::registry(shared.clone()));
            tokio::spawn(async move {
                if let Err(e) = server.await {
                    eprintln!("cudatrace: {e:#}");
                }
            });
            (None, Some(shared), Some(sampler))
        }
    };
    // Alert evaluation: one tick per detection window, the first a window from now.
    let started = Instant::now();
    let window = match &opts.mode {
        Mode::Serve(cfg) => Duration::from_secs(cfg.detect.window_s),
        Mode::Print { .. } => Duration::from_secs(3600),
    };
    let mut detect_tick = tokio::time::interval_at(tokio::time::Instant::now() + window, window);
    detect_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let sinks = match &opts.mode {
        Mode::Serve(cfg) => Sinks::start(&cfg.alerts, format!("http://{}/metrics", cfg.listen)),
        Mode::Print { .. } => None,
    };
    // Wake the reader when an eighth of the ring buffer is used; drain on a timer otherwise.
    tracer.set_wakeup_bytes(opts.ringbuf_bytes / 8)?;
    let mut poll = tokio::time::interval(POLL_PERIOD);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tracer.set_enabled(true)?;
    match &opts.mode {
        Mode::Serve(cfg) => eprintln!(
            "ready: {} probes attached; metrics at http://{}/metrics",
            tracer.probe_count(),
            cfg.listen
        ),
        Mode::Print { .. } => eprintln!("ready: {} probes attached", tracer.probe_count()),
    }

    let mut state = State {
        events: 0,
        decode_errors: 0,
        exits: 0,
        kernels: KernelTable::default(),
        memory: MemoryTable::default(),
        gpu: GpuTime::default(),
        identities: Identities::default(),
        tracked,
        gone: Vec::new(),
    };
    let mut known: HashSet<PathBuf> = libs.into_iter().collect();
    let mut output_closed = false;
    loop {
        tokio::select! {
            _ = sigint.recv() => break,
            _ = sigterm.recv() => break,
            _ = &mut deadline => break,
            _ = rescan.tick(), if watch => {
                let new: Vec<PathBuf> =
                    discover::mapped_libraries().into_iter().filter(|p| known.insert(p.clone())).collect();
                let before = tracer.libraries.len();
                let _ = attach_all(&mut tracer, &new, false);
                for lib in &tracer.libraries[before..] {
                    eprintln!("discovered: {} at_ns={}", lib.path.display(), events::monotonic_ns());
                }
                if let Some(shared) = shared.as_ref().filter(|_| tracer.libraries.len() > before) {
                    shared.lock().expect("poisoned").probes = probe_rows(&tracer);
                }
            }
            _ = nvml_tick.tick(), if shared.is_some() => {
                let shared = shared.as_ref().expect("checked");
                let gpus = match sampler.as_mut().map(Sampler::sample) {
                    Some(Ok(gpus)) => Some(gpus),
                    Some(Err(e)) => {
                        eprintln!("cudatrace: NVML sample failed: {e}");
                        None
                    }
                    None => None,
                };
                let dropped = sum(&stats, STAT_DROPPED)?;
                let mut ex = shared.lock().expect("poisoned");
                ex.agg.dropped = dropped;
                ex.agg.sweep();
                if let Some(gpus) = gpus {
                    ex.gpus = gpus;
                }
            }
            _ = detect_tick.tick(), if shared.is_some() => {
                let shared = shared.as_ref().expect("checked");
                let changes = {
                    let mut ex = shared.lock().expect("poisoned");
                    let ex = &mut *ex;
                    let agg = &ex.agg;
                    ex.detector.evaluate(started.elapsed().as_secs_f64(), SystemTime::now(), &ex.gpus, |pid| agg.memory_bytes(pid));
                    ex.detector.take_changes()
                };
                publish(&changes, sinks.as_ref());
            }
            _ = poll.tick() => {
                if drain(ring.get_mut(), &mut state, printer.as_mut(), shared.as_ref()).is_err() {
                    output_closed = true;
                    break;
                }
            }
            guard = ring.readable_mut() => {
                let mut guard = guard?;
                if drain(guard.get_inner_mut(), &mut state, printer.as_mut(), shared.as_ref()).is_err() {
                    output_closed = true;
                    break;
                }
                guard.clear_ready();
            }
        }
    }
    // Stop recording first so that nothing new arrives, then read what the programs had
    // already written, then detach.
    tracer.set_enabled(false)?;
    let mut ring = ring.into_inner();
    if !output_closed {
        let _ = drain(&mut ring, &mut state, printer.as_mut(), shared.as_ref());
    }
    let dropped = sum(&stats, STAT_DROPPED)?;
    let orphans = sum(&stats, STAT_ORPHAN_RETURNS)?;
    let inflight = entries.keys().count();
    let tracked = state.tracked.keys().count();
    summary(&state, tracer.probe_count(), dropped, orphans, inflight, tracked);
    if let Some(shared) = &shared {
        // Victims that exited since the last window resolve; firing alerts of live processes are
        // left to expire in Alertmanager (the problem is not known to be over).
        let changes = shared.lock().expect("poisoned").detector.take_changes();
        publish(&changes, sinks.as_ref());
    }
    tracer.detach_in_background();
    if let Some(sinks) = sinks {
        sinks.finish(Duration::from_secs(3)).await;
    }
    Ok(())
}

/// Writes alert state changes as JSON lines on stdout and hands them to the sinks.
fn publish(changes: &[crate::alert::Record], sinks: Option<&Sinks>) {
    if changes.is_empty() {
        return;
    }
    let mut out = std::io::stdout().lock();
    for r in changes {
        if let Ok(line) = serde_json::to_string(r) {
            // A closed stdout loses the lines, not the alerts: the sinks and metrics go on.
            let _ = writeln!(out, "{line}");
        }
        if let Some(s) = sinks {
            s.send(r);
        }
    }
    let _ = out.flush();
}

/// (symbol, library, attached) of every entry point in every attached library.
fn probe_rows(tracer: &Tracer) -> Vec<(&'static str, String, bool)> {
    let mut rows = Vec::new();
    for lib in &tracer.libraries {
        let path = lib.path.display().to_string();
        let r = &lib.resolution;
        rows.extend(r.found.iter().map(|f| (f.api.symbol(), path.clone(), true)));
        rows.extend(r.aliases.iter().map(|(a, _)| (a.symbol(), path.clone(), true)));
        rows.extend(r.missing.iter().map(|a| (a.symbol(), path.clone(), false)));
    }
    rows
}

/// Reads every record now in the ring buffer; with metrics, under one lock for the batch.
fn drain(
    ring: &mut RingBuf<MapData>,
    state: &mut State,
    printer: Option<&mut Printer>,
    shared: Option<&Shared>,
) -> std::io::Result<()> {
    let mut guard = shared.map(|s| s.lock().expect("poisoned"));
    let mut out = match (printer, guard.as_deref_mut()) {
        (Some(p), _) => Out::Print(p),
        (None, Some(ex)) => Out::Serve(ex),
        (None, None) => unreachable!("either a printer or metrics"),
    };
    while let Some(item) = ring.next() {
        match events::decode_record(&item) {
            Ok(record) => state.handle(record, &mut out)?,
            Err(e) => {
                state.decode_errors += 1;
                if state.decode_errors == 1 {
                    eprintln!("cudatrace: skipping undecodable record: {e}");
                }
            }
        }
    }
    for pid in std::mem::take(&mut state.gone) {
        let _ = state.tracked.remove(&pid);
        state.forget(pid, &mut out);
    }
    match out {
        Out::Print(p) => p.flush(),
        Out::Serve(_) => Ok(()),
    }
}

fn sum(stats: &PerCpuArray<MapData, u64>, index: u32) -> Result<u64> {
    Ok(stats.get(&index, 0)?.iter().sum())
}

fn memory_line(pid: u32, m: &ProcessMemory) -> String {
    format!(
        "memory: pid={pid} current_bytes={} peak_bytes={} allocs={} frees={} unknown_frees={}",
        m.current_bytes, m.peak_bytes, m.allocs, m.frees, m.unknown_frees
    )
}

fn gpu_line((pid, stream, tid): &(u32, u64, u32), s: &StreamTime) -> String {
    format!(
        "gpu-time estimate: pid={pid} stream={stream:#x}{} launches={} completed={} gpu_ns_estimate={} wait_ns={}",
        if *tid != 0 { format!(" tid={tid}") } else { String::new() },
        s.launches,
        s.launches_completed,
        s.gpu_ns_estimate,
        s.wait_ns
    )
}

/// Prints what is known of the processes still running, then the totals.
fn summary(state: &State, probes: usize, dropped: u64, orphans: u64, inflight: usize, tracked: usize) {
    for (pid, m) in state.memory.iter() {
        eprintln!("{}", memory_line(pid, m));
    }
    let mut streams: Vec<_> = state.gpu.iter().collect();
    streams.sort_by_key(|(k, _)| *k);
    for (key, s) in streams {
        eprintln!("{}", gpu_line(&key, s));
    }
    eprintln!(
        "summary: events={} dropped={dropped} orphan_returns={orphans} undecodable={} probes={probes} \
         exits={} live_processes={} inflight_entries={inflight} tracked_processes={tracked}",
        state.events,
        state.decode_errors,
        state.exits,
        state.identities.len()
    );
}
