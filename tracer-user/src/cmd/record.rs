//! `cudatrace record`: every traced call, NVML samples and the detector's alert changes written
//! as a timeline (`sinks::timeline`) until a signal, `--duration` or `--max-events`; then the
//! file is closed and a summary line says what it holds.
use std::{
    io,
    time::{Duration, Instant, SystemTime},
};

use anyhow::{Context as _, Result};

use crate::{
    cli::RecordArgs,
    config::DetectConfig,
    detect::Detector,
    enrich::Enrichment,
    event::monotonic_ns,
    event::Event,
    nvml::GpuSample,
    nvml::Sampler,
    pipeline::Consumer,
    pipeline::{Session, Tuning},
    registry::Process,
    sinks::timeline::Timeline,
    text::printable,
};

/// The timeline and the detector whose alert changes it shows.
struct Recorder {
    timeline: Timeline,
    detector: Detector,
    gpus: Vec<GpuSample>,
}

impl Consumer for Recorder {
    fn call(&mut self, ev: &Event, e: &Enrichment, process: &mut Process) -> io::Result<()> {
        self.detector
            .observe(&mut process.signals, ev, e.batch.as_ref());
        self.timeline
            .call(ev, e.kernel.as_deref(), e.batch.as_ref())
    }

    fn exited(&mut self, process: &mut Process) {
        self.detector
            .exited(&mut process.signals, SystemTime::now());
    }
}

impl Recorder {
    /// Writes the detector's alert changes.
    fn alerts(&mut self) -> io::Result<()> {
        let now = monotonic_ns();
        for change in self.detector.take_changes() {
            self.timeline.alert(&change, now)?;
        }
        Ok(())
    }
}

/// Runs `cudatrace record`.
pub async fn run(args: RecordArgs) -> Result<()> {
    // The file first: a path that cannot be written is said before anything is attached.
    let existed = args.output.exists();
    let timeline = Timeline::create(&args.output, args.max_events).with_context(|| {
        format!(
            "cannot create the timeline {} (give a writable path with -o)",
            printable(&args.output.display().to_string())
        )
    })?;
    let tuning = Tuning::tracer(args.duration, args.ringbuf_mib, args.rescan_ms);
    let opened = Session::open(args.sel.session(tuning));
    let mut session = match opened {
        Ok(session) => session,
        Err(e) => {
            // Nothing was traced: a file made for this run goes (one that was there stays, empty).
            drop(timeline);
            if !existed {
                let _ = std::fs::remove_file(&args.output);
            }
            return Err(e);
        }
    };
    let mut sampler = Sampler::new(args.nvml_lib.as_ref());
    if let Sampler::Off(why) = &sampler {
        log::warn!("cudatrace: {why}; the timeline has no GPU counters");
    }
    let detect = DetectConfig::default();
    let window = Duration::from_secs(detect.window_s);
    let mut rec = Recorder {
        timeline,
        detector: Detector::new(detect, 0.0),
        gpus: Vec::new(),
    };
    let started = Instant::now();
    let mut nvml_tick = tokio::time::interval(Duration::from_secs(1));
    let mut detect_tick = super::every(window);
    let probes = session.start_recording()?;
    let output = args.output.display().to_string();
    let output = printable(&output);
    log::info!(
        target: "cudatrace::ready",
        probes = probes,
        output = output.as_ref();
        "ready: {probes} probes attached; recording to {output}"
    );
    let output_closed = loop {
        tokio::select! {
            wake = session.wake() => if let Some(closed) = session.act(wake?, &mut rec).stop() {
                break closed;
            },
            _ = nvml_tick.tick(), if sampler.up() => {
                if let Ok(gpus) = sampler.sample() {
                    rec.timeline.gpus(&gpus, monotonic_ns())?;
                    rec.gpus = gpus;
                }
            }
            _ = detect_tick.tick() => {
                let now = started.elapsed().as_secs_f64();
                rec.detector.evaluate(&mut session.registry, now, SystemTime::now(), &rec.gpus);
                rec.alerts()?;
            }
        }
    };
    session.finish(&mut rec, output_closed)?;
    rec.alerts()?;
    session.detach();
    let path = printable(&rec.timeline.path().display().to_string()).to_string();
    let (written, left_out) = rec
        .timeline
        .finish(monotonic_ns())
        .with_context(|| format!("cannot finish {path}"))?;
    log::info!(
        target: "cudatrace::record",
        written = written,
        left_out = left_out;
        "record: {written} events written to {path}; {left_out} left out past --max-events"
    );
    Ok(())
}
