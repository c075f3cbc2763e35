//! Discovery off the event loop: passes over every process's maps ([`Scanner`]) run on a thread
//! of their own, asked for on each rescan tick and answered through a channel the loop waits on,
//! so a slow `/proc` or a library file that does not answer delays no drain. The first pass,
//! before `ready`, has a deadline; a pass that runs long is said once.
use std::{
    collections::HashSet,
    sync::mpsc as std_mpsc,
    time::{Duration, Instant},
};

use tokio::sync::mpsc;

use super::{FileKey, Pass, Scanner};

/// How long the first pass may take before cudatrace goes on without it (what it finds later is
/// attached then).
const FIRST_PASS_DEADLINE: Duration = Duration::from_secs(10);
/// A pass running longer than this is reported (once).
const PASS_DEADLINE: Duration = Duration::from_secs(10);

/// The discovery thread: requests in, prepared libraries out.
pub struct Discovery {
    requests: std_mpsc::Sender<HashSet<FileKey>>,
    found: mpsc::UnboundedReceiver<Pass>,
    /// When the pass now running was asked for.
    pending_since: Option<Instant>,
    warned: bool,
}

impl Discovery {
    /// Starts the thread (its scanner remembers failures between passes).
    pub fn start() -> std::io::Result<Discovery> {
        let (requests, incoming) = std_mpsc::channel::<HashSet<FileKey>>();
        let (out, found) = mpsc::unbounded_channel();
        std::thread::Builder::new()
            .name("cudatrace-discover".into())
            .spawn(move || {
                let mut scanner = Scanner::default();
                for skip in incoming {
                    if out.send(scanner.pass(&skip)).is_err() {
                        return;
                    }
                }
            })?;
        Ok(Discovery {
            requests,
            found,
            pending_since: None,
            warned: false,
        })
    }

    /// The first pass, waited for up to [`FIRST_PASS_DEADLINE`].
    pub fn first_pass(&mut self, skip: HashSet<FileKey>) -> Pass {
        self.request(skip);
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

    /// Asks for a pass, unless one is running (a long one is said once).
    pub fn request(&mut self, skip: HashSet<FileKey>) {
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
            None => {
                if self.requests.send(skip).is_ok() {
                    self.pending_since = Some(Instant::now());
                }
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
