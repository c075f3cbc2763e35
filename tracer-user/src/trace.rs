//! `cudatrace trace`: attach, stream events until a signal or `--duration`, then detach, drain
//! what is left in the ring buffer and print a summary.
use std::{path::PathBuf, time::Duration};

use anyhow::{Context as _, Result, bail};
use aya::maps::{MapData, PerCpuArray, RingBuf};
use tokio::{
    io::{Interest, unix::AsyncFd},
    signal::unix::{SignalKind, signal},
};
use tracer_common::{STAT_DROPPED, STAT_ORPHAN_RETURNS};

use crate::{
    attach, caps, discover,
    events::{self, Event},
    gputime::GpuTime,
    kernels::KernelTable,
    memory::MemoryTable,
    output::Printer,
};

/// Options of `cudatrace trace`.
pub struct TraceOptions {
    /// Libraries to attach; discovered when empty.
    pub libs: Vec<PathBuf>,
    /// Only this process.
    pub pid: Option<u32>,
    /// JSON lines instead of a table.
    pub json: bool,
    /// Stop after this long.
    pub duration: Option<Duration>,
    /// Ring-buffer size in bytes.
    pub ringbuf_bytes: u32,
}

/// Everything learned from the events of one run.
#[derive(Default)]
struct State {
    events: u64,
    decode_errors: u64,
    kernels: KernelTable,
    memory: MemoryTable,
    gpu: GpuTime,
}

impl State {
    fn handle(&mut self, ev: &Event, printer: &mut Printer) -> std::io::Result<()> {
        self.events += 1;
        let kernel = self.kernels.observe(ev);
        self.memory.observe(ev);
        let est = self.gpu.observe(ev);
        printer.print(ev, kernel.as_deref(), est.as_ref())
    }
}

/// Runs `cudatrace trace`.
pub async fn run(opts: TraceOptions) -> Result<()> {
    if let Some(why) = caps::missing_privilege() {
        bail!(why);
    }
    let libs = if opts.libs.is_empty() { discover::libraries()? } else { opts.libs.clone() };
    let mut tracer = attach::load(opts.ringbuf_bytes, opts.pid)?;
    let mut failures = Vec::new();
    for lib in &libs {
        match tracer.attach_library(lib) {
            Ok(Some(probes)) => eprintln!("{}", attach::report(probes)),
            Ok(None) => {}
            Err(e) => {
                // With one library its error is the run's error, printed once below.
                if libs.len() > 1 {
                    eprintln!("cudatrace: {e:#}");
                }
                failures.push(e);
            }
        }
    }
    if tracer.probe_count() == 0 {
        match failures.into_iter().next() {
            Some(e) if libs.len() == 1 => return Err(e),
            _ => bail!("no probe attached in any of {} libraries; pass a libcuda.so.1 with --lib", libs.len()),
        }
    }
    let ring = RingBuf::try_from(tracer.ebpf.take_map("EVENTS").context("EVENTS map missing")?)?;
    let stats: PerCpuArray<MapData, u64> =
        PerCpuArray::try_from(tracer.ebpf.take_map("STATS").context("STATS map missing")?)?;
    // SAFETY: the ring buffer owns its fd, and AsyncFd owns the ring buffer until into_inner.
    let mut ring = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
        .map_err(|e| anyhow::anyhow!("cannot poll the ring buffer: {}", e.into_parts().1))?;
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let deadline = tokio::time::sleep(opts.duration.unwrap_or(Duration::from_secs(u64::MAX / 4)));
    tokio::pin!(deadline);
    tracer.set_enabled(true)?;
    eprintln!("ready: {} probes attached", tracer.probe_count());

    let mut printer = Printer::new(opts.json);
    let mut state = State::default();
    let mut output_closed = false;
    loop {
        tokio::select! {
            _ = sigint.recv() => break,
            _ = sigterm.recv() => break,
            _ = &mut deadline => break,
            guard = ring.readable_mut() => {
                let mut guard = guard?;
                if drain(guard.get_inner_mut(), &mut state, &mut printer).is_err() {
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
        let _ = drain(&mut ring, &mut state, &mut printer);
    }
    let dropped = sum(&stats, STAT_DROPPED)?;
    let orphans = sum(&stats, STAT_ORPHAN_RETURNS)?;
    summary(&state, tracer.probe_count(), dropped, orphans);
    tracer.detach_in_background();
    Ok(())
}

/// Reads every record now in the ring buffer.
fn drain(ring: &mut RingBuf<aya::maps::MapData>, state: &mut State, printer: &mut Printer) -> std::io::Result<()> {
    while let Some(item) = ring.next() {
        match events::decode(&item) {
            Ok(ev) => state.handle(&ev, printer)?,
            Err(e) => {
                state.decode_errors += 1;
                if state.decode_errors == 1 {
                    eprintln!("cudatrace: skipping undecodable record: {e}");
                }
            }
        }
    }
    printer.flush()
}

fn sum(stats: &PerCpuArray<MapData, u64>, index: u32) -> Result<u64> {
    Ok(stats.get(&index, 0)?.iter().sum())
}

fn summary(state: &State, probes: usize, dropped: u64, orphans: u64) {
    for (pid, m) in state.memory.iter() {
        eprintln!(
            "memory: pid={pid} current_bytes={} peak_bytes={} allocs={} frees={} unknown_frees={}",
            m.current_bytes, m.peak_bytes, m.allocs, m.frees, m.unknown_frees
        );
    }
    let mut streams: Vec<_> = state.gpu.iter().collect();
    streams.sort_by_key(|(k, _)| **k);
    for ((pid, stream, tid), s) in streams {
        eprintln!(
            "gpu-time estimate: pid={pid} stream={stream:#x}{} launches={} completed={} gpu_ns_estimate={} wait_ns={}",
            if *tid != 0 { format!(" tid={tid}") } else { String::new() },
            s.launches,
            s.launches_completed,
            s.gpu_ns_estimate,
            s.wait_ns
        );
    }
    eprintln!(
        "summary: events={} dropped={dropped} orphan_returns={orphans} undecodable={} probes={probes}",
        state.events, state.decode_errors
    );
}
