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
    nvml::{GpuSample, Sampler},
    pipeline::{Consumer, Ending, Pipeline, Session, Stages, Tuning},
    registry::Process,
    sinks::timeline::Timeline,
    text::printable,
};

/// The timeline, the detector whose alert changes it shows, and the NVML samples it records.
struct Recorder {
    timeline: Timeline,
    detector: Detector,
    gpus: Vec<GpuSample>,
    sampler: Sampler,
    nvml_tick: tokio::time::Interval,
    detect_tick: tokio::time::Interval,
    started: Instant,
}

impl Consumer for Recorder {
    fn call(&mut self, ev: &Event, e: &Enrichment, process: &mut Process) -> io::Result<()> {
        if !e.captured {
            self.detector
                .observe(&mut process.signals, ev, e.batch.as_ref());
        }
        self.timeline.call(ev, e)
    }

    fn exited(&mut self, process: &mut Process) {
        let (who, at_exit, slot) = process.at_exit();
        self.detector.exited(who, at_exit, slot, SystemTime::now());
    }
}

impl Recorder {
    /// The recorder of `timeline`, with NVML as `nvml_lib` (or the loader) gives it.
    fn new(timeline: Timeline, nvml_lib: Option<&std::path::PathBuf>) -> Recorder {
        let sampler = Sampler::new(nvml_lib);
        if let Sampler::Off(why) = &sampler {
            log::warn!("cudatrace: {why}; the timeline has no GPU counters");
        }
        let detect = DetectConfig::default();
        let window = Duration::from_secs(detect.window_s);
        Recorder {
            timeline,
            detector: Detector::new(detect, 0.0),
            gpus: Vec::new(),
            sampler,
            nvml_tick: tokio::time::interval(Duration::from_secs(1)),
            detect_tick: super::every(window),
            started: Instant::now(),
        }
    }

    /// Writes the detector's alert changes.
    fn alerts(&mut self) -> io::Result<()> {
        let now = monotonic_ns();
        for change in self.detector.take_changes() {
            self.timeline.alert(&change, now)?;
        }
        Ok(())
    }
}

/// What wakes `record` besides the session.
enum Tick {
    /// An NVML sample is due.
    Nvml,
    /// A detection window ended.
    Detect,
}

impl Stages for Recorder {
    type Tick = Tick;

    async fn tick(&mut self, _quiet: bool) -> Tick {
        tokio::select! {
            _ = self.nvml_tick.tick(), if self.sampler.up() => Tick::Nvml,
            _ = self.detect_tick.tick() => Tick::Detect,
        }
    }

    fn on_tick(&mut self, tick: Tick, session: &mut Session) -> Result<Option<Ending>> {
        match tick {
            Tick::Nvml => {
                if let Ok(gpus) = self.sampler.sample() {
                    self.timeline.gpus(&gpus, monotonic_ns())?;
                    self.gpus = gpus;
                }
            }
            Tick::Detect => {
                let now = self.started.elapsed().as_secs_f64();
                self.detector
                    .evaluate(&mut session.registry, now, SystemTime::now(), &self.gpus);
                self.alerts()?;
            }
        }
        Ok(None)
    }

    fn ready(&mut self, probes: usize) {
        let output = self.timeline.path().display().to_string();
        let output = printable(&output);
        log::info!(
            target: "cudatrace::ready",
            probes = probes,
            output = output.as_ref();
            "ready: {probes} probes attached; recording to {output}"
        );
    }

    fn finished(&mut self, _session: &mut Session) -> Result<()> {
        Ok(self.alerts()?)
    }
}

/// Runs `cudatrace record`.
pub async fn run(args: RecordArgs) -> Result<()> {
    // The file first: a path that cannot be written is said before anything is attached.
    let existed = args.output.exists();
    let owner = crate::sinks::files::sudo_owner();
    let timeline = Timeline::create(&args.output, args.max_events, owner).with_context(|| {
        format!(
            "cannot create the timeline {} (give a writable path with -o)",
            printable(&args.output.display().to_string())
        )
    })?;
    let tuning = Tuning::tracer(args.duration, args.ringbuf_mib, args.rescan_ms);
    let nvml_lib = args.nvml_lib.clone();
    let opened = Pipeline::open(args.sel.session(tuning), |_| {
        Ok(Recorder::new(timeline, nvml_lib.as_ref()))
    });
    let pipeline = match opened {
        Ok(pipeline) => pipeline,
        Err(e) => {
            // Nothing was traced: a file made for this run goes (one that was there stays,
            // empty). The timeline went with the stages that were never built.
            if !existed {
                let _ = std::fs::remove_file(&args.output);
            }
            return Err(e);
        }
    };
    let rec = pipeline.run(0).await?;
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
