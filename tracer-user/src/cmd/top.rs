//! `cudatrace top`: the daemon's aggregation and detector (`daemon`, as `run`), shown as a
//! screen of GPUs and processes every `-d` seconds (`sinks::top`). On a terminal it is the
//! interactive screen (`sinks::top::tui`; keys read on a thread of their own); with `-b`, or
//! when stdout is not a terminal, the screens are printed one after the other as plain text
//! (for scripts and bug reports), `-n` of them.
use std::{
    io::{IsTerminal as _, Write as _},
    time::{Duration, Instant, SystemTime},
};

use anyhow::Result;

use super::daemon::Daemon;
use crate::{
    cli::TopArgs,
    config::Config,
    nvml::Sampler,
    pipeline::{Session, Tuning},
    sinks::top::text,
    sinks::top::tui::Ask,
    sinks::top::tui::Screen,
    sinks::top::View,
    text::rfc3339,
};

/// Reads keys on a thread (crossterm's read blocks) and hands them to the loop.
fn keys() -> tokio::sync::mpsc::Receiver<ratatui::crossterm::event::KeyEvent> {
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

/// A process's streams for the detail pane (at most 8, by estimated GPU time).
fn stream_lines(p: &crate::registry::Process) -> Vec<String> {
    let mut streams = p.streams.sorted();
    streams.sort_by_key(|s| std::cmp::Reverse(s.1.gpu_ns_estimate));
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
                "{stream:#x}{thread}: {} batches, {:.3} ms, wait {:.3} ms",
                s.batches,
                s.gpu_ns_estimate as f64 / 1e6,
                s.wait_ns as f64 / 1e6
            )
        })
        .collect()
}

/// Runs `cudatrace top`.
pub async fn run(args: TopArgs) -> Result<()> {
    let cfg = match &args.config {
        Some(path) => Config::load(path)?,
        None => Config::default(),
    };
    let mut session = Session::open(args.sel.session(Tuning::daemon(&cfg, None)))?;
    let mut sampler = Sampler::new(args.nvml_lib.as_ref().or(cfg.nvml_library.as_ref()));
    let mut daemon = Daemon::new(&cfg, &sampler, &session);
    let started = Instant::now();
    let mut screen_tick = super::every(args.delay);
    let mut nvml_tick = tokio::time::interval(Duration::from_millis(cfg.nvml_period_ms));
    let mut detect_tick = super::every(Duration::from_secs(cfg.detect.window_s));
    session.set_rate_limit(cfg.record_rate_limit)?;
    let probes = session.start_recording()?;
    log::info!(target: "cudatrace::ready", probes = probes; "ready: {probes} probes attached");
    let interactive = !args.batch && std::io::stdout().is_terminal();
    // Declared before the screen, so dropped after it: stderr comes back once the terminal is.
    let quiet = interactive.then(QuietStderr::new);
    let mut screen = interactive.then(Screen::start);
    let mut keys = if interactive { Some(keys()) } else { None };
    let mut previous = None;
    let mut shown_at = Instant::now();
    let mut shown = 0u64;
    let mut changes = Vec::new();
    let mut output_closed = false;
    loop {
        tokio::select! {
            wake = session.wake() => if let Some(closed) = daemon.on_wake(&mut session, wake?) {
                output_closed = closed;
                break;
            },
            _ = nvml_tick.tick(), if sampler.up() => daemon.sample(&mut sampler),
            _ = detect_tick.tick() => {
                // The states show in the rows, the changes in the detail pane; `run` is what
                // sends them anywhere.
                changes.extend(daemon.evaluate(&mut session, started.elapsed().as_secs_f64()));
            }
            Some(k) = async { keys.as_mut()?.recv().await } => {
                if let Some(s) = screen.as_mut() {
                    if s.key(k) == Ask::Quit {
                        break;
                    }
                    s.draw()?;
                }
            }
            _ = screen_tick.tick() => {
                let snapshot = std::sync::Arc::new(daemon.snapshot(&mut session));
                let view = View::build(previous.as_deref(), &snapshot, shown_at.elapsed().as_secs_f64());
                shown_at = Instant::now();
                let clock = rfc3339(SystemTime::now());
                let clock = clock.get(11..19).unwrap_or(&clock);
                match screen.as_mut() {
                    Some(s) => {
                        s.update(view, snapshot.clone(), std::mem::take(&mut changes), clock);
                        let streams = s.detail().and_then(|pid| session.registry.get(pid)).map(stream_lines).unwrap_or_default();
                        s.set_streams(streams);
                        s.draw()?;
                    }
                    None => {
                        let mut out = std::io::stdout().lock();
                        let text = text::screen(&view, clock) + "\n";
                        if out.write_all(text.as_bytes()).and_then(|()| out.flush()).is_err() {
                            output_closed = true;
                            break;
                        }
                    }
                }
                previous = Some(snapshot);
                shown += 1;
                if args.count.is_some_and(|n| shown >= n) {
                    break;
                }
            }
        }
    }
    // The terminal first, then stderr: the summary is printed on the restored terminal.
    drop(screen);
    drop(quiet);
    session.finish(&mut daemon, output_closed)?;
    session.detach();
    Ok(())
}
