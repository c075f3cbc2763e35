//! `cudatrace trace`: attach, print every call until a signal or `--duration`, then stop
//! recording, drain what is left in the ring buffer, print a summary and detach.
use std::io;

use anyhow::Result;

use crate::{
    cli::TraceArgs,
    enrich::Enrichment,
    event::Event,
    pipeline::Consumer,
    pipeline::{Session, Tuning},
    registry::Process,
    sinks::stdout::Printer,
};

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
    let tuning = Tuning {
        cmdline: args.cmdline,
        ..Tuning::tracer(args.duration, args.ringbuf_mib, args.rescan_ms)
    };
    let mut session = Session::open(args.sel.session(tuning))?;
    let mut printer = Printer::new(args.json);
    let probes = session.start_recording()?;
    log::info!(target: "cudatrace::ready", probes = probes; "ready: {probes} probes attached");
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
