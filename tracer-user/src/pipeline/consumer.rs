//! The seams between the session and a command: the `Consumer` of calls, what woke the
//! session (`Wake`) and what the loop does next (`Flow`); one call handed over (`consume`), and a
//! process's last lines.
use std::io;

use crate::{
    enrich::Enrichment,
    event::{Event, LaunchDelta},
    registry::Process,
};

/// Where a session's calls go; each command implements it.
pub trait Consumer {
    /// One decoded call, with what enrichment learned and its process's entry.
    fn call(
        &mut self,
        ev: &Event,
        enrichment: &Enrichment,
        process: &mut Process,
    ) -> io::Result<()>;
    /// Launches the kernel counted since the last read (only when aggregating).
    fn launches(&mut self, _delta: &LaunchDelta, _process: &mut Process) {}
    /// A process exited; its per-call tables are released after this.
    fn exited(&mut self, _process: &mut Process) {}
    /// A probe harmed a process (`pipeline::harm`); its entry, while it is known.
    fn harm(&mut self, _harm: &crate::probe::harm::Harm, _process: Option<&mut Process>) {}
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

/// What a command's loop does after [`super::Session::act`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    /// Go on waiting.
    Continue,
    /// A library was attached (its probe rows changed).
    Attached,
    /// Stop: a signal or the deadline.
    Stop,
    /// Stop: the consumer's output closed.
    OutputClosed,
}

/// One call of a known process: its context found (`enrich::devices`), enriched against its
/// tables, then handed to the consumer.
pub(super) fn consume(
    process: &mut Process,
    ev: &mut Event,
    consumer: &mut impl Consumer,
) -> io::Result<()> {
    process.last_seen_ns = ev.start_ns.saturating_add(ev.duration_ns);
    ev.context = process.devices.observe(ev);
    let enrichment = process.enrich(ev);
    consumer.call(ev, &enrichment, process)
}

/// Prints a process's final memory, device-time and graphs lines.
pub(super) fn final_lines(p: &Process) {
    if p.memory.touched() {
        log::info!(target: "cudatrace::memory", pid = p.pid; "{}", p.memory.line(p.pid));
    }
    for line in p.streams.lines(p.pid) {
        log::info!(target: "cudatrace::device_time", pid = p.pid; "{line}");
    }
    if let Some(line) = p.graphs.line(p.pid) {
        log::info!(target: "cudatrace::graphs", pid = p.pid; "{line}");
    }
}
