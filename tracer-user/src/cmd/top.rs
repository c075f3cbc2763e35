//! `cudatrace top`: the daemon's aggregation and detector (`daemon`, as `run`), shown as a
//! screen of GPUs and processes every `-d` seconds (`sinks::top`). With `-b` the screens are
//! printed one after the other as plain text (for scripts and bug reports), `-n` of them; on a
//! terminal without `-b` the screen is redrawn in place.
use std::{
    io::{IsTerminal as _, Write as _},
    time::{Duration, Instant, SystemTime},
};

use anyhow::Result;
use tokio::time::MissedTickBehavior;

use super::daemon::Daemon;
use crate::{
    alert::rfc3339,
    cli::TopArgs,
    config::Config,
    nvml::Sampler,
    pipeline::{Flow, Session},
    registry::RegistryLimits,
    sinks::top::{View, text},
};

/// Runs `cudatrace top`.
pub async fn run(args: TopArgs) -> Result<()> {
    let cfg = match &args.config {
        Some(path) => Config::load(path)?,
        None => Config::default(),
    };
    let limits = RegistryLimits { max_processes: cfg.max_processes, retain_exited: Duration::from_secs(cfg.retain_exited_s) };
    let mut opts = args.sel.session(None, cfg.ringbuf_mib, cfg.rescan_ms, limits, false, cfg.max_libraries, cfg.lib_allow.clone());
    opts.sampling = cfg.launches.sampling();
    let mut session = Session::open(opts)?;
    let mut sampler = Sampler::new(args.nvml_lib.as_ref().or(cfg.nvml_library.as_ref()));
    let mut daemon = Daemon::new(&cfg, &sampler, &session);
    let started = Instant::now();
    let delay = args.delay;
    let mut screen_tick = tokio::time::interval_at(tokio::time::Instant::now() + delay, delay);
    screen_tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut nvml_tick = tokio::time::interval(Duration::from_millis(cfg.nvml_period_ms));
    let window = Duration::from_secs(cfg.detect.window_s);
    let mut detect_tick = tokio::time::interval_at(tokio::time::Instant::now() + window, window);
    detect_tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    session.set_rate_limit(cfg.record_rate_limit)?;
    let probes = session.start_recording()?;
    eprintln!("ready: {probes} probes attached");
    let redraw = !args.batch && std::io::stdout().is_terminal();
    let mut previous = None;
    let mut shown_at = Instant::now();
    let mut shown = 0u64;
    let mut output_closed = false;
    loop {
        tokio::select! {
            wake = session.wake() => match session.act(wake?, &mut daemon) {
                Flow::Continue => {}
                Flow::Attached => daemon.probes = session.probe_rows(),
                Flow::Stop => break,
                Flow::OutputClosed => {
                    output_closed = true;
                    break;
                }
            },
            _ = nvml_tick.tick(), if sampler.up() => daemon.sample(&mut sampler),
            _ = detect_tick.tick() => {
                session.harvest(&mut daemon);
                daemon.detector.evaluate(&mut session.registry, started.elapsed().as_secs_f64(), SystemTime::now(), &daemon.gpus);
                // The changes show in the rows; `run` is what sends them anywhere.
                let _ = daemon.detector.take_changes();
            }
            _ = screen_tick.tick() => {
                let snapshot = daemon.snapshot(&mut session);
                let view = View::build(previous.as_ref(), &snapshot, shown_at.elapsed().as_secs_f64());
                shown_at = Instant::now();
                previous = Some(snapshot);
                let clock = rfc3339(SystemTime::now());
                let mut text = text::screen(&view, clock.get(11..19).unwrap_or(&clock));
                if redraw {
                    text.insert_str(0, "\x1b[H\x1b[2J");
                } else {
                    text.push('\n');
                }
                let mut out = std::io::stdout().lock();
                if out.write_all(text.as_bytes()).and_then(|()| out.flush()).is_err() {
                    output_closed = true;
                    break;
                }
                shown += 1;
                if args.count.is_some_and(|n| shown >= n) {
                    break;
                }
            }
        }
    }
    session.finish(&mut daemon, output_closed)?;
    session.detach();
    Ok(())
}
