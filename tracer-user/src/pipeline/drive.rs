//! The one place a command's source, stages and sinks are wired: a [`Pipeline`] is a session
//! (probes, ring buffer, registry) and the command's [`Stages`], and [`Pipeline::run`] is the
//! loop every command runs: recording on, `ready`, drain what the session wakes for and hand
//! the command its own ticks, then stop recording, drain the rest, the summary, detach.
use std::future::Future;

use anyhow::Result;

use super::{Consumer, Flow, Session, SessionOptions};

/// How a command's loop ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    /// A signal, the deadline, or the command's own end (`top -n`, `q`).
    Stopped,
    /// The output closed (a reader of stdout went away): nothing more is drained into it.
    OutputClosed,
}

impl Flow {
    /// The loop's end, when this flow ends it.
    pub fn ending(self) -> Option<Ending> {
        match self {
            Flow::Continue | Flow::Attached => None,
            Flow::Stop => Some(Ending::Stopped),
            Flow::OutputClosed => Some(Ending::OutputClosed),
        }
    }
}

/// What a command does with a session's calls (as a [`Consumer`]) and at its own ticks (NVML
/// samples, detection windows, scrapes, screens, keys).
pub trait Stages: Consumer {
    /// One of the command's own wake-ups.
    type Tick;

    /// Waits for the command's next tick (only its own timers and channels: the session is
    /// waited on beside it). A command without ticks never returns. `quiet`: the session
    /// traces no process now, and timers with nothing to do should not wake the process.
    fn tick(&mut self, quiet: bool) -> impl Future<Output = Self::Tick>;

    /// Handles a tick; `Some` ends the loop.
    fn on_tick(&mut self, tick: Self::Tick, session: &mut Session) -> Result<Option<Ending>>;

    /// Recording is on: the `ready` line (what a user and the tests wait for).
    fn ready(&mut self, probes: usize);

    /// A library was attached while running (its probe rows changed).
    fn attached(&mut self, _session: &Session) {}

    /// The loop ended, before the session's last drain and summary (`top` gives the terminal
    /// back here, so that the summary shows on it).
    fn ended(&mut self, _ending: Ending) {}

    /// After the last drain and the summary, before the probes go (the last alert changes).
    fn finished(&mut self, _session: &mut Session) -> Result<()> {
        Ok(())
    }
}

/// A session and the stages of one command.
pub struct Pipeline<S> {
    /// The source: probes, ring buffer, registry.
    pub session: Session,
    /// The command's stages and sinks.
    pub stages: S,
}

impl<S: Stages> Pipeline<S> {
    /// Opens the session `options` ask for (attaches, nothing recorded yet), then builds the
    /// stages over it.
    pub fn open(
        options: SessionOptions,
        stages: impl FnOnce(&Session) -> Result<S>,
    ) -> Result<Pipeline<S>> {
        let session = Session::open(options)?;
        let stages = stages(&session)?;
        Ok(Pipeline { session, stages })
    }

    /// Runs the command: recording on (with the per-process record rate limit, 0 for none),
    /// the loop, then the session's end; returns the stages for what the command does after
    /// the probes are gone (HTTP sinks flushed, a file finished).
    pub async fn run(mut self, rate_limit: u32) -> Result<S> {
        self.session.set_rate_limit(rate_limit)?;
        let probes = self.session.start_recording()?;
        self.stages.ready(probes);
        let ending = self.drive().await?;
        self.stages.ended(ending);
        self.session.finish(&mut self.stages, ending)?;
        let finished = self.stages.finished(&mut self.session);
        self.session.detach();
        finished.map(|()| self.stages)
    }

    /// The loop: what woke the session, or one of the stages' ticks, until one ends it.
    async fn drive(&mut self) -> Result<Ending> {
        let Pipeline { session, stages } = self;
        loop {
            let quiet = session.quiet();
            tokio::select! {
                wake = session.wake() => {
                    let flow = session.act(wake?, stages);
                    if flow == Flow::Attached {
                        stages.attached(session);
                    }
                    if let Some(ending) = flow.ending() {
                        return Ok(ending);
                    }
                }
                tick = stages.tick(quiet) => {
                    if let Some(ending) = stages.on_tick(tick, session)? {
                        return Ok(ending);
                    }
                }
            }
        }
    }
}
