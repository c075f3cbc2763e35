//! `cudatrace trace`: attach, print every call until a signal or `--duration`, then stop
//! recording, drain what is left in the ring buffer, print a summary and detach.
use std::{io, time::Duration};

use anyhow::Result;

use crate::{
    cli::TraceArgs, enrich::Enrichment, event::Event, pipeline::Consumer, pipeline::Session,
    registry::Process, registry::RegistryLimits, sinks::stdout::Printer,
};

/// Processes `trace` holds at most (identity, kernel names, memory, streams); an exited one is
/// released at once.
pub(crate) const MAX_PROCESSES: usize = 4096;
/// Distinct library files `trace` attaches at most (as `run`'s default).
pub(crate) const MAX_LIBRARIES: usize = 32;

impl Consumer for Printer {
    fn call(&mut self, ev: &Event, e: &Enrichment, process: &mut Process) -> io::Result<()> {
        self.print(
            ev,
            e.kernel.as_deref(),
            e.batch.as_ref(),
            Some(&process.identity),
        )
    }

    fn flush(&mut self) -> io::Result<()> {
        Printer::flush(self)
    }
}

/// Runs `cudatrace trace`.
pub async fn run(args: TraceArgs) -> Result<()> {
    let limits = RegistryLimits {
        max_processes: MAX_PROCESSES,
        retain_exited: Duration::ZERO,
    };
    let mut session = Session::open(args.sel.session(
        args.duration,
        args.ringbuf_mib,
        args.rescan_ms,
        limits,
        args.cmdline,
        MAX_LIBRARIES,
        Vec::new(),
    ))?;
    let mut printer = Printer::new(args.json);
    let probes = session.start_recording()?;
    eprintln!("ready: {probes} probes attached");
    let output_closed = loop {
        let wake = session.wake().await?;
        if let Some(closed) = session.act(wake, &mut printer).stop() {
            break closed;
        }
    };
    session.finish(&mut printer, output_closed)?;
    session.detach();
    Ok(())
}
