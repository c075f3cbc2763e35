//! `cudatrace top`: the daemon's aggregation and detector (`daemon`, as `run`), shown as a
//! screen of GPUs and processes every `-d` seconds (`sinks::top`). On a terminal it is the
//! interactive screen (`sinks::top::tui`; keys read on a thread of their own); with `-b`, or
//! when stdout is not a terminal, the screens are printed one after the other as plain text
//! (for scripts and bug reports), `-n` of them.
use std::{
    io::{IsTerminal as _, Write as _},
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use anyhow::Result;

use ratatui::crossterm::event::KeyEvent;
use tokio::sync::mpsc;

use super::daemon::Daemon;
use crate::{
    cli::TopArgs,
    config::Config,
    nvml::Sampler,
    pipeline::{Ending, Pipeline, Session, Stages, Tuning},
    sinks::{
        metrics::Snapshot,
        top::{
            text,
            tui::{Ask, Screen},
            View,
        },
    },
    text::rfc3339,
};

/// Reads keys on a thread (crossterm's read blocks) and hands them to the loop.
fn keys() -> mpsc::Receiver<KeyEvent> {
    use ratatui::crossterm::event::{read, Event, KeyEventKind};
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    std::thread::spawn(move || {
        while let Ok(ev) = read() {
            if let Event::Key(k) = ev {
                if k.kind == KeyEventKind::Press && tx.blocking_send(k).is_err() {
                    break;
                }
            }
        }
    });
    rx
}

/// Sends stderr to /dev/null while the screen is up (discovery and eBPF log lines would tear
/// it); the guard puts it back.
struct QuietStderr(Option<std::os::fd::OwnedFd>);

impl QuietStderr {
    fn new() -> QuietStderr {
        use std::os::fd::{AsRawFd as _, FromRawFd as _};
        // SAFETY: dup/dup2 on stderr and a freshly opened /dev/null; the saved descriptor is
        // owned by the guard.
        unsafe {
            let saved = libc::dup(2);
            let null = std::fs::OpenOptions::new().write(true).open("/dev/null");
            match (saved, null) {
                (s, Ok(null)) if s >= 0 => {
                    libc::dup2(null.as_raw_fd(), 2);
                    QuietStderr(Some(std::os::fd::OwnedFd::from_raw_fd(s)))
                }
                _ => QuietStderr(None),
            }
        }
    }
}

impl Drop for QuietStderr {
    fn drop(&mut self) {
        use std::os::fd::AsRawFd as _;
        if let Some(saved) = &self.0 {
            // SAFETY: dup2 of the saved descriptor back onto stderr.
            unsafe { libc::dup2(saved.as_raw_fd(), 2) };
        }
    }
}

/// A process's streams for the detail pane (at most 8, by batch span).
fn stream_lines(p: &crate::registry::Process) -> Vec<String> {
    let mut streams = p.streams.sorted();
    streams.sort_by_key(|s| std::cmp::Reverse(s.1.span_ns));
    streams
        .iter()
        .take(8)
        .map(|((stream, tid), s)| {
            let thread = if *tid != 0 {
                format!(" tid {tid}")
            } else {
                String::new()
            };
            format!(
                "{stream:#x}{thread}: {} batches, span {:.3} ms, wait {:.3} ms",
                s.batches,
                s.span_ns as f64 / 1e6,
                s.wait_ns as f64 / 1e6
            )
        })
        .collect()
}

/// `top`'s stages: the daemon (as `run`'s), and the screen it shows every `-d` seconds (the
/// interactive one on a terminal, else plain text).
struct Shown {
    daemon: Daemon,
    sampler: Sampler,
    nvml_tick: tokio::time::Interval,
    detect_tick: tokio::time::Interval,
    screen_tick: tokio::time::Interval,
    started: Instant,
    interactive: bool,
    /// Dropped after the screen, so that stderr comes back once the terminal is.
    quiet: Option<QuietStderr>,
    screen: Option<Screen>,
    keys: Option<mpsc::Receiver<KeyEvent>>,
    previous: Option<Arc<Snapshot>>,
    shown_at: Instant,
    shown: u64,
    /// Screens to show, then stop (`-n`).
    count: Option<u64>,
    /// Alert changes since the last screen (the detail pane shows them).
    changes: Vec<crate::alert::AlertChange>,
}

/// What wakes `top` besides the session.
enum Tick {
    /// An NVML sample is due.
    Nvml,
    /// A detection window ended.
    Detect,
    /// A key was pressed.
    Key(KeyEvent),
    /// The screen is due.
    Screen,
}

super::daemon::consume_through_daemon!(Shown);

impl Shown {
    /// Shows one screen; `Some` when the loop ends (stdout closed, or `-n` screens shown).
    fn show(&mut self, session: &mut Session) -> Result<Option<Ending>> {
        let snapshot = Arc::new(self.daemon.snapshot(session));
        let view = View::build(
            self.previous.as_deref(),
            &snapshot,
            self.shown_at.elapsed().as_secs_f64(),
        );
        self.shown_at = Instant::now();
        let clock = rfc3339(SystemTime::now());
        let clock = clock.get(11..19).unwrap_or(&clock);
        match self.screen.as_mut() {
            Some(s) => {
                s.update(
                    view,
                    snapshot.clone(),
                    std::mem::take(&mut self.changes),
                    clock,
                );
                let streams = s
                    .detail()
                    .and_then(|pid| session.registry.get(pid))
                    .map(stream_lines)
                    .unwrap_or_default();
                s.set_streams(streams);
                s.draw()?;
            }
            None => {
                let mut out = std::io::stdout().lock();
                let text = text::screen(&view, clock) + "\n";
                if out
                    .write_all(text.as_bytes())
                    .and_then(|()| out.flush())
                    .is_err()
                {
                    return Ok(Some(Ending::OutputClosed));
                }
            }
        }
        self.previous = Some(snapshot);
        self.shown += 1;
        Ok(self
            .count
            .is_some_and(|n| self.shown >= n)
            .then_some(Ending::Stopped))
    }
}

impl Stages for Shown {
    type Tick = Tick;

    async fn tick(&mut self, _quiet: bool) -> Tick {
        let up = self.sampler.up();
        tokio::select! {
            _ = self.nvml_tick.tick(), if up => Tick::Nvml,
            _ = self.detect_tick.tick() => Tick::Detect,
            Some(k) = async { self.keys.as_mut()?.recv().await } => Tick::Key(k),
            _ = self.screen_tick.tick() => Tick::Screen,
        }
    }

    fn on_tick(&mut self, tick: Tick, session: &mut Session) -> Result<Option<Ending>> {
        match tick {
            Tick::Nvml => self.daemon.sample(&mut self.sampler),
            Tick::Detect => {
                // The states show in the rows, the changes in the detail pane; `run` is what
                // sends them anywhere.
                let since_start = self.started.elapsed().as_secs_f64();
                let changes = self.daemon.evaluate(session, since_start);
                if let Some(otlp) = self.daemon.otlp.as_mut() {
                    otlp.alerts(&changes);
                }
                self.changes.extend(changes);
            }
            Tick::Key(k) => {
                if let Some(s) = self.screen.as_mut() {
                    if s.key(k) == Ask::Quit {
                        return Ok(Some(Ending::Stopped));
                    }
                    s.draw()?;
                }
            }
            Tick::Screen => return self.show(session),
        }
        Ok(None)
    }

    fn ready(&mut self, probes: usize) {
        log::info!(target: "cudatrace::ready", probes = probes; "ready: {probes} probes attached");
        // After the ready line: from here stderr is quiet while the screen is up.
        if self.interactive {
            self.quiet = Some(QuietStderr::new());
            self.screen = Some(Screen::start());
            self.keys = Some(keys());
        }
    }

    fn ended(&mut self, _ending: Ending) {
        // The terminal first, then stderr: the summary is printed on the restored terminal.
        drop(self.screen.take());
        drop(self.quiet.take());
    }
}

/// Runs `cudatrace top`.
pub async fn run(args: TopArgs) -> Result<()> {
    let cfg = match &args.config {
        Some(path) => Config::load(path)?,
        None => Config::default(),
    };
    // Spans of slow calls and alert records go to OTLP from `top` too, when `[otlp]` is on.
    let otlp = match cfg.otlp.resolve(|k| std::env::var(k).ok())? {
        Some(o) => Some(crate::sinks::otlp::Exporter::start(&o)?),
        None => None,
    };
    let mut pipeline = Pipeline::open(args.sel.session(Tuning::daemon(&cfg, None)), |_session| {
        let sampler = Sampler::new(args.nvml_lib.as_ref().or(cfg.nvml_library.as_ref()));
        let mut daemon = Daemon::new(&cfg, &sampler);
        daemon.otlp = otlp;
        Ok(Shown {
            daemon,
            sampler,
            nvml_tick: tokio::time::interval(Duration::from_millis(cfg.nvml_period_ms)),
            detect_tick: super::every(Duration::from_secs(cfg.detect.window_s)),
            screen_tick: super::every(args.delay),
            started: Instant::now(),
            interactive: !args.batch && std::io::stdout().is_terminal(),
            quiet: None,
            screen: None,
            keys: None,
            previous: None,
            shown_at: Instant::now(),
            shown: 0,
            count: args.count,
            changes: Vec::new(),
        })
    })?;
    pipeline
        .session
        .registry
        .set_workloads(crate::identity::workload::Rules::new(&cfg.workloads));
    let mut shown = pipeline.run(cfg.record_rate_limit).await?;
    if let Some(otlp) = shown.daemon.otlp.take() {
        otlp.finish(Duration::from_secs(3)).await;
    }
    Ok(())
}
