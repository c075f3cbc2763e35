//! `cudatrace trace`: attach, print every call until a signal or `--duration`, then stop
//! recording, drain what is left in the ring buffer, print a summary and detach.
use std::io;

use anyhow::Result;

use crate::{
    cli::TraceArgs,
    enrich::Enrichment,
    event::Event,
    pipeline::{Consumer, Ending, Pipeline, Session, Stages, Tuning},
    registry::Process,
    sinks::stdout::{OnDevice, Printer},
};

impl Consumer for Printer {
    fn call(&mut self, ev: &Event, e: &Enrichment, process: &mut Process) -> io::Result<()> {
        // One lookup of the context; the UUID only for a known device.
        let ordinal = process.devices.device_of_context(ev.context);
        let device = OnDevice {
            ordinal,
            uuid: ordinal.and_then(|d| process.devices.uuid_of_device(d)),
        };
        self.print(
            ev,
            e.kernel.as_deref(),
            e.batch.as_ref(),
            Some(&process.identity),
            device,
        )
    }

    fn flush(&mut self) -> io::Result<()> {
        Printer::flush(self)
    }
}

/// `trace` has no ticks of its own: every call is printed as it is drained.
impl Stages for Printer {
    type Tick = ();

    async fn tick(&mut self, _quiet: bool) {
        std::future::pending::<()>().await;
    }

    fn on_tick(&mut self, (): (), _session: &mut Session) -> Result<Option<Ending>> {
        Ok(None)
    }

    fn ready(&mut self, probes: usize) {
        log::info!(target: "cudatrace::ready", probes = probes; "ready: {probes} probes attached");
    }
}

/// Runs `cudatrace trace`.
pub async fn run(args: TraceArgs) -> Result<()> {
    let tuning = Tuning {
        cmdline: args.cmdline,
        ..Tuning::tracer(args.duration, args.ringbuf_mib, args.rescan_ms)
    };
    let json = args.json;
    Pipeline::open(args.sel.session(tuning), |_| Ok(Printer::new(json)))?
        .run(0)
        .await?;
    Ok(())
}
