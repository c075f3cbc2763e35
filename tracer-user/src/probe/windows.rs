//! The pair's windows (issue 40): where the kernel has no uprobe sessions, every launch pays the
//! uretprobe's trap, which alone is about 0.4 of an empty probe pair's cost here. So while
//! launches come fast (at least `MIN_RATE` a second on the node), the launches' return probes
//! are attached only part of the time: open for `OPEN_FOR`, then detached for a random 500 to
//! 1,000 ms. Outside a window each launch's entry counts it exactly, untimed, as a session's
//! entry does (`tracer-ebpf`'s `window`); the launches inside windows are timed, and user space
//! spreads the untimed ones over their buckets as it does for sessions. A slower node keeps its
//! windows open: every launch timed, as before. Every other entry point's return stays attached.
//!
//! A window closes in two steps: the programs are told first, so that launches entering from
//! then on count themselves, and the links go `GRACE` later, once the launches in flight have
//! returned (one still in the driver then is counted at its thread's next call).
//! `CUDATRACE_PAIR_WINDOWS=off` keeps the pair's returns attached all the time.
use std::{
    fs::File,
    hash::{BuildHasher as _, Hasher as _},
    os::fd::{AsRawFd as _, OwnedFd},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use tracer_common::{api::Layout, names::PROG_RETURN};

use super::{
    loader::{Attach, Probes},
    multi::{self, Mode, MultiError, MultiPrograms},
    symbols::Resolved,
};

/// How long a window stays open.
const OPEN_FOR: Duration = Duration::from_millis(250);
/// The shortest and longest time between windows (drawn at random between the two, so that
/// the windows do not keep step with a periodic workload).
const CLOSED_FOR: (u64, u64) = (500, 1_000);
/// From telling the programs that returns are closed to detaching them.
const GRACE: Duration = Duration::from_millis(50);
/// Launches a second on the node (counted while a window was open) below which windows stay
/// open.
pub const MIN_RATE: f64 = 1_000.0;

/// One attached library's uprobe_multi links.
pub struct LibraryLinks {
    /// The links that stay while the library is attached.
    pub always: Vec<OwnedFd>,
    /// The launches' return link, detached outside windows (`None` with sessions).
    pub returns: Option<LaunchReturns>,
}

impl LibraryLinks {
    /// Every link's descriptor (closing them detaches the library).
    pub fn into_fds(self) -> Vec<OwnedFd> {
        let mut fds = self.always;
        fds.extend(self.returns.and_then(|r| r.link));
        fds
    }
}

/// A library's links: `always` (what `MultiPrograms::attach` made) and, with the pair, its
/// launches' return link, attached now.
pub fn links(
    programs: &MultiPrograms,
    always: Vec<OwnedFd>,
    file: &File,
    shown: &Path,
    found: &[Resolved],
    pid: Option<u32>,
) -> Result<LibraryLinks, MultiError> {
    let returns = match programs.pair_because() {
        Some(_) => LaunchReturns::attach(programs.program(PROG_RETURN), file, shown, found, pid)?,
        None => None,
    };
    Ok(LibraryLinks { always, returns })
}

/// What attaches one library's launch returns again.
pub struct LaunchReturns {
    /// The library, kept open: the same inode is probed again.
    file: File,
    /// Its path, as errors name it.
    shown: PathBuf,
    offsets: Vec<u64>,
    cookies: Vec<u64>,
    pid: Option<u32>,
    /// The link while attached.
    link: Option<OwnedFd>,
    /// Whether attaching it again failed and was said.
    said: bool,
}

impl LaunchReturns {
    /// Attaches the returns of the launch entry points in `found` (`None`: the library has
    /// none) by `prog`, the return program.
    pub fn attach(
        prog: &OwnedFd,
        file: &File,
        shown: &Path,
        found: &[Resolved],
        pid: Option<u32>,
    ) -> Result<Option<LaunchReturns>, MultiError> {
        let launches: Vec<&Resolved> = found
            .iter()
            .filter(|r| r.api.info().layout != Layout::Regs)
            .collect();
        if launches.is_empty() {
            return Ok(None);
        }
        let file = file
            .try_clone()
            .map_err(|e| MultiError::Object(e.to_string()))?;
        let mut returns = LaunchReturns {
            file,
            shown: shown.to_path_buf(),
            offsets: launches.iter().map(|r| r.offset).collect(),
            cookies: launches.iter().map(|r| r.cookie()).collect(),
            pid,
            link: None,
            said: false,
        };
        returns.reattach(prog)?;
        Ok(Some(returns))
    }

    /// Attaches the link again when it is not attached.
    fn reattach(&mut self, prog: &OwnedFd) -> Result<(), MultiError> {
        if self.link.is_some() {
            return Ok(());
        }
        let path = PathBuf::from(format!("/proc/self/fd/{}", self.file.as_raw_fd()));
        self.link = Some(multi::link(
            prog,
            PROG_RETURN,
            &path,
            &self.shown,
            &self.offsets,
            &self.cookies,
            Mode::Return,
            self.pid,
        )?);
        Ok(())
    }
}

/// Where the windows are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Returns attached and told so.
    Open,
    /// Told closed; the links go at `GRACE`.
    Closing,
    /// Detached until the drawn time passes.
    Closed(Duration),
}

/// The windows' state, moved on by [`Probes::tick_windows`].
pub struct Windows {
    /// Off: `CUDATRACE_PAIR_WINDOWS=off`, or aggregation off (every launch is written).
    on: bool,
    phase: Phase,
    since: Instant,
    /// The kernel's count of launches when the window opened.
    counted_at: u64,
    /// Windows closed so far.
    pub closed: u64,
}

impl Default for Windows {
    fn default() -> Windows {
        Windows {
            on: std::env::var("CUDATRACE_PAIR_WINDOWS").as_deref() != Ok("off"),
            phase: Phase::Open,
            since: Instant::now(),
            counted_at: 0,
            closed: 0,
        }
    }
}

/// A time between windows, drawn at random in `CLOSED_FOR`.
fn draw() -> Duration {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0);
    let (lo, hi) = CLOSED_FOR;
    Duration::from_millis(lo + h.finish() % (hi - lo + 1))
}

impl Probes {
    /// Keeps the pair's windows open from now on when `aggregating` is false (`trace` writes
    /// every launch, timed).
    pub fn windows_for(&mut self, aggregating: bool) {
        self.windows.on &= aggregating;
    }

    /// Whether the returns are detached or about to be: the reader then keeps its short drain
    /// period (outside windows few records come), so that the next window opens on time.
    pub fn windows_closed_now(&self) -> bool {
        self.windows.phase != Phase::Open
    }

    /// Windows closed so far.
    pub fn windows_closed(&self) -> u64 {
        self.windows.closed
    }

    /// Moves the windows on (cheap when nothing is due): called at each drain.
    pub fn tick_windows(&mut self) {
        let Attach::Multi { programs, links } = &mut self.attach else {
            return;
        };
        if !self.windows.on || programs.pair_because().is_none() {
            return;
        }
        let w = &mut self.windows;
        let elapsed = w.since.elapsed();
        match w.phase {
            Phase::Open if elapsed >= OPEN_FOR => {
                let counted = self.maps.launches_counted();
                let rate = counted.saturating_sub(w.counted_at) as f64 / elapsed.as_secs_f64();
                w.since = Instant::now();
                w.counted_at = counted;
                if rate >= MIN_RATE && self.maps.set_returns_closed(true).is_ok() {
                    w.phase = Phase::Closing;
                }
            }
            Phase::Closing if elapsed >= GRACE => {
                for l in links.iter_mut().filter_map(|l| l.returns.as_mut()) {
                    if let Some(link) = l.link.take() {
                        multi::close_later(vec![link]);
                    }
                }
                w.phase = Phase::Closed(draw());
                w.since = Instant::now();
                w.closed += 1;
            }
            Phase::Closed(wait) if elapsed >= wait => {
                let prog = programs.program(PROG_RETURN);
                for l in links.iter_mut().filter_map(|l| l.returns.as_mut()) {
                    if let Err(e) = l.reattach(prog) {
                        if std::mem::replace(&mut l.said, true) {
                            continue;
                        }
                        log::warn!(
                            "cudatrace: cannot attach the launches' returns of {} again ({e}): its launches are counted, untimed",
                            l.shown.display()
                        );
                    }
                }
                if self.maps.set_returns_closed(false).is_ok() {
                    w.phase = Phase::Open;
                    w.since = Instant::now();
                    w.counted_at = self.maps.launches_counted();
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_between_windows_are_drawn_across_the_range() {
        let drawn: Vec<u64> = (0..2_000).map(|_| draw().as_millis() as u64).collect();
        assert!(drawn.iter().all(|d| (500..=1_000).contains(d)), "{drawn:?}");
        // Spread, not one value: both halves of the range come up.
        assert!(drawn.iter().any(|d| *d < 600) && drawn.iter().any(|d| *d > 900));
    }
}
