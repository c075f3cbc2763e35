//! Discovery off the event loop, on a thread of its own that answers through a channel the loop
//! waits on, so a slow `/proc` or a library file that does not answer delays no drain. Polling:
//! a pass over every process's maps ([`Scanner`]) on each rescan tick. Events ([`super::events`]):
//! the kernel names the processes to read, and passes come when something was found. The first
//! pass, before `ready`, has a deadline; a pass that runs long is said once.
use std::{
    sync::mpsc as std_mpsc,
    time::{Duration, Instant},
};

use tokio::sync::mpsc;

use super::{
    events::{self, Bell, Request},
    Pass, Scanner, Settled,
};

/// How long the first pass may take before cudatrace goes on without it (what it finds later is
/// attached then).
const FIRST_PASS_DEADLINE: Duration = Duration::from_secs(10);
/// A pass running longer than this is reported (once).
const PASS_DEADLINE: Duration = Duration::from_secs(10);

/// The discovery thread: requests in, prepared libraries out.
pub struct Discovery {
    requests: std_mpsc::Sender<Request>,
    /// Wakes the thread for a request (events only).
    bell: Bell,
    /// What the last request said was settled (events: an unchanged one is not sent).
    last_settled: Settled,
    /// Whether the kernel names the processes to read (else every tick reads all).
    events: bool,
    found: mpsc::UnboundedReceiver<Pass>,
    /// When the pass now running was asked for.
    pending_since: Option<Instant>,
    warned: bool,
    /// The open hook (its link is held here while discovery runs).
    hook: Option<super::super::opens::OpenHook>,
    _link: Option<std::os::fd::OwnedFd>,
}

impl Discovery {
    /// Starts the thread (its scanner remembers failures between passes): driven by the
    /// kernel's `opens` when given, else polling. `stats` counts what it does.
    pub fn start(
        opens: Option<super::super::opens::Opens>,
        stats: std::sync::Arc<super::Stats>,
    ) -> std::io::Result<Discovery> {
        let (opens, hook, link, mut loaders) = match opens {
            Some(o) => (Some(o.ring), Some(o.hook), o.link, o.loaders),
            None => (None, None, None, None),
        };
        if let Some(l) = loaders.as_mut() {
            l.share(stats.clone());
        }
        let (requests, incoming) = std_mpsc::channel::<Request>();
        let (out, found) = mpsc::unbounded_channel();
        let events = opens.is_some();
        let bell = Bell::new()?;
        let thread_bell = bell.clone();
        let mut scanner = Scanner {
            stats,
            loaders: loaders.as_ref().map(|_| Vec::new()),
            ..Scanner::default()
        };
        std::thread::Builder::new()
            .name("cudatrace-discover".into())
            .spawn(move || match opens {
                Some(opens) => events::run(scanner, loaders, opens, incoming, thread_bell, out),
                None => {
                    for r in incoming {
                        if out.send(scanner.pass(&r.settled)).is_err() {
                            return;
                        }
                    }
                }
            })?;
        Ok(Discovery {
            requests,
            bell,
            last_settled: Settled::default(),
            events,
            found,
            pending_since: None,
            warned: false,
            hook,
            _link: link,
        })
    }

    /// The kernel's hook that names the processes to read; none when polling.
    pub fn hook(&self) -> Option<&super::super::opens::OpenHook> {
        self.hook.as_ref()
    }

    /// Whether the kernel names the processes to read.
    pub fn event_driven(&self) -> bool {
        self.events
    }

    /// The first pass, waited for up to [`FIRST_PASS_DEADLINE`].
    pub fn first_pass(&mut self, settled: Settled) -> Pass {
        self.pending_since = None;
        self.ask(settled, true);
        let started = Instant::now();
        loop {
            match self.found.try_recv() {
                Ok(found) => {
                    self.pending_since = None;
                    return found;
                }
                Err(mpsc::error::TryRecvError::Disconnected) => return Pass::default(),
                Err(mpsc::error::TryRecvError::Empty)
                    if started.elapsed() >= FIRST_PASS_DEADLINE =>
                {
                    log::warn!(
                        "cudatrace: discovery has not finished in {} s (a /proc or library file that does not answer?); \
                         going on, and attaching what it finds when it does",
                        FIRST_PASS_DEADLINE.as_secs()
                    );
                    self.warned = true;
                    return Pass::default();
                }
                Err(mpsc::error::TryRecvError::Empty) => {
                    std::thread::sleep(Duration::from_millis(2))
                }
            }
        }
    }

    /// Polling: asks for a pass, unless one is running (a long one is said once). Events: tells
    /// the thread what is settled; `full` asks for a pass over every process as well.
    pub fn request(&mut self, settled: Settled, full: bool) {
        if self.events {
            if !full && settled == self.last_settled {
                return;
            }
            self.last_settled.clone_from(&settled);
            if self.requests.send(Request { settled, full }).is_ok() {
                self.bell.ring();
            }
            return;
        }
        match self.pending_since {
            Some(since) => {
                if since.elapsed() > PASS_DEADLINE && !self.warned {
                    self.warned = true;
                    log::warn!(
                        "cudatrace: a discovery pass has run for over {} s (a /proc or library file that does not answer?); \
                         tracing goes on",
                        PASS_DEADLINE.as_secs()
                    );
                }
            }
            None => self.ask(settled, true),
        }
    }

    fn ask(&mut self, settled: Settled, full: bool) {
        if self.requests.send(Request { settled, full }).is_ok() {
            if self.events {
                self.bell.ring();
            } else {
                self.pending_since = Some(Instant::now());
            }
        }
    }

    /// The next pass (`None`: the thread is gone).
    pub async fn next(&mut self) -> Option<Pass> {
        let found = self.found.recv().await;
        self.pending_since = None;
        self.warned = false;
        found
    }
}
