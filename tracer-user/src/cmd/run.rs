//! `cudatrace run`: the daemon. Every call is aggregated and fed to the contention detector
//! (`daemon`); NVML is sampled; each detection window's alert changes go to stdout and the alert
//! sinks; the metrics server asks the loop for snapshots. On a signal or at `--duration` it stops like
//! `trace`: recording off, the ring buffer drained, a summary, detached.
use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::Result;
use tokio::sync::mpsc;

use super::daemon::Daemon;
use crate::{
    cli::RunArgs,
    config::{self, Config},
    enrich::pods_api::{self, PodNamesSource},
    nvml::Sampler,
    pipeline::{Ending, Pipeline, Session, Stages, Tuning},
    registry::Registry,
    sinks::{
        alerting::AlertSinks,
        metrics::{server, server::SnapshotRequest, web},
    },
};

/// The config file, with the command line's overrides.
fn config(args: &mut RunArgs) -> Result<Config> {
    let mut cfg = match &args.config {
        Some(path) => Config::load(path)?,
        None => Config::default(),
    };
    if let Some(listen) = args.listen {
        cfg.listen = listen;
    }
    if let Some(lib) = args.nvml_lib.take() {
        cfg.nvml_library = Some(lib);
    }
    if let Some(file) = args.web_config_file.take() {
        cfg.web_config_file = Some(file);
    }
    for (flag, url, slot) in [
        (
            "--alertmanager",
            args.alertmanager.take(),
            &mut cfg.alerts.alertmanager_url,
        ),
        (
            "--webhook",
            args.webhook.take(),
            &mut cfg.alerts.webhook_url,
        ),
    ] {
        if let Some(url) = url {
            config::check_url(&url).map_err(|e| anyhow::anyhow!("{flag} {url}: {e}"))?;
            *slot = Some(url);
        }
    }
    cfg.alerts.check_credentials()?;
    Ok(cfg)
}

/// Gives processes in pods their names from the latest pod list; a pod not listed yet asks
/// for an early refresh.
fn name_pods(source: Option<&PodNamesSource>, registry: &mut Registry) {
    if let Some(source) = source {
        if registry.label_pods(&source.index()) {
            source.refresh_soon();
        }
    }
}

/// `run`'s stages: the daemon (aggregation, detector, NVML), the alert sinks, the metrics
/// server's requests and the pod names.
struct Daemonized {
    daemon: Daemon,
    sampler: Sampler,
    sinks: AlertSinks,
    requests: mpsc::Receiver<SnapshotRequest>,
    pod_names: Option<PodNamesSource>,
    nvml_tick: tokio::time::Interval,
    detect_tick: tokio::time::Interval,
    started: Instant,
    metrics_url: String,
    /// Saves the per-workload memory (`[state] dir`).
    saver: Option<crate::state::Saver>,
    /// The session traced nothing at the last wait (the timers were off).
    quiet: bool,
}

/// What wakes `run` besides the session.
enum Tick {
    /// An NVML sample is due (and the registry's sweep, and pod names).
    Nvml,
    /// A detection window ended.
    Detect,
    /// A scrape asks for a snapshot.
    Scrape(SnapshotRequest),
}

super::daemon::consume_through_daemon!(Daemonized);

impl Stages for Daemonized {
    type Tick = Tick;

    async fn tick(&mut self, quiet: bool) -> Tick {
        // Tracing nothing, only a scrape (or NVML's sample, where it is up) wakes `run`; the
        // detection window starts a full period after the first process shows.
        if self.quiet && !quiet {
            self.detect_tick.reset();
        }
        self.quiet = quiet;
        tokio::select! {
            // NVML where it is up (a GPU node): a first call's span and the GPU metrics need a
            // sample taken before it; without NVML, nothing to sample while nothing is traced.
            _ = self.nvml_tick.tick(), if !quiet || self.sampler.up() => Tick::Nvml,
            _ = self.detect_tick.tick(), if !quiet => Tick::Detect,
            Some(reply) = self.requests.recv() => Tick::Scrape(reply),
        }
    }

    fn on_tick(&mut self, tick: Tick, session: &mut Session) -> Result<Option<Ending>> {
        match tick {
            Tick::Nvml => {
                self.daemon.sample(&mut self.sampler);
                self.daemon.dropped = session.dropped();
                session.registry.sweep();
                name_pods(self.pod_names.as_ref(), &mut session.registry);
            }
            Tick::Detect => {
                let since_start = self.started.elapsed().as_secs_f64();
                let changes = self.daemon.evaluate(session, since_start);
                self.sinks.publish(&changes);
                if let Some(otlp) = self.daemon.otlp.as_mut() {
                    otlp.alerts(&changes);
                }
                if let Some(saver) = self.saver.as_mut() {
                    saver.tick(self.daemon.detector.memory(), false);
                }
            }
            Tick::Scrape(reply) => {
                name_pods(self.pod_names.as_ref(), &mut session.registry);
                let _ = reply.send(Arc::new(self.daemon.snapshot(session)));
            }
        }
        Ok(None)
    }

    fn ready(&mut self, probes: usize) {
        let metrics = self.metrics_url.as_str();
        log::info!(
            target: "cudatrace::ready",
            probes = probes,
            metrics = metrics;
            "ready: {probes} probes attached; metrics at {metrics}"
        );
    }

    fn finished(&mut self, _session: &mut Session) -> Result<()> {
        // Victims that exited since the last window resolve; firing alerts of live processes
        // are left to expire in Alertmanager (the problem is not known to be over).
        let changes = self.daemon.detector.take_changes();
        self.sinks.publish(&changes);
        if let Some(otlp) = self.daemon.otlp.as_mut() {
            otlp.alerts(&changes);
        }
        if let Some(saver) = self.saver.as_mut() {
            saver.tick(self.daemon.detector.memory(), true);
        }
        Ok(())
    }
}

/// Says what the daemon's fence (`probe::sandbox`) holds, once it runs as its own uid, in one
/// `sandbox` line; warns when a check passed that must fail.
fn say_fence(seccomp: &Result<usize, String>) {
    let seccomp = match seccomp {
        Ok(n) => format!("{n} calls denied"),
        Err(e) => format!("off ({e})"),
    };
    let c = crate::probe::sandbox::check();
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    log::info!(
        target: "cudatrace::sandbox",
        seccomp = seccomp.as_str(),
        uid = uid,
        ptrace = c.ptrace.as_str(),
        proc_mem = c.proc_mem.as_str();
        "sandbox: seccomp {seccomp}; uid {uid}; ptrace: {}; open /proc/1/mem for writing: {}",
        c.ptrace,
        c.proc_mem
    );
    if !c.hold() {
        log::warn!(
            "cudatrace: its fence does not hold (ptrace: {}, /proc/1/mem: {}): a bug in it could reach other processes; tracing goes on",
            c.ptrace,
            c.proc_mem
        );
    }
}

/// Runs `cudatrace run`.
pub async fn run(mut args: RunArgs) -> Result<()> {
    let cfg = config(&mut args)?;
    let web = match cfg.web_config_file.as_deref() {
        Some(path) => web::load(path)?,
        None => web::WebConfig {
            tls: None,
            auth: None,
        },
    };
    let scheme = if web.tls.is_some() { "https" } else { "http" };
    server::raise_fd_limit();
    crate::probe::symbols::set_max_library_bytes(cfg.max_library_mib << 20);
    // Bind before loading anything, so that a taken port is reported at once.
    let listener = server::bind(cfg.listen)?;
    let metrics_url = format!("{scheme}://{}/metrics", cfg.listen);
    let options = args.sel.session(Tuning::daemon(&cfg, args.duration));
    // The state directory is made the daemon's own while it may still be uid 0; the file is
    // read once it runs as the uid that writes it.
    // SAFETY: geteuid and getegid have no preconditions.
    let me = unsafe { (libc::geteuid(), libc::getegid()) };
    let owner = match options.run_as {
        Some(r) if me.0 == 0 => (r.uid, r.gid),
        _ => me,
    };
    let state_file = crate::state::prepare_dir(&cfg, owner);
    // The seccomp filter, before any thread starts: every thread after inherits it.
    let fence = crate::probe::sandbox::raise();
    // The sinks (the CA file, the archive) are checked before anything is loaded, as the port
    // and the web config are.
    let sinks = AlertSinks::start(&cfg, metrics_url.clone())?;
    let otlp = match cfg.otlp.resolve(|k| std::env::var(k).ok())? {
        Some(o) => Some(crate::sinks::otlp::Exporter::start(&o)?),
        None => None,
    };
    let mut pipeline = Pipeline::open(options, |_session| {
        // Open, attached and its own uid: the fence is checked now.
        say_fence(&fence);
        let sampler = Sampler::new(cfg.nvml_library.as_ref());
        if let Sampler::Off(why) = &sampler {
            log::warn!("cudatrace: {why}");
        }
        let mut daemon = Daemon::new(&cfg, &sampler);
        daemon.otlp = otlp;
        let saver = state_file.map(|path| {
            let (memory, saver) = crate::state::resume(path, &cfg);
            daemon.detector.set_memory(memory);
            saver
        });
        let (requests_tx, requests) = mpsc::channel(16);
        server::spawn(listener, requests_tx, web)?;
        Ok(Daemonized {
            daemon,
            sampler,
            sinks,
            requests,
            pod_names: pods_api::start(&cfg.kubernetes),
            nvml_tick: tokio::time::interval(Duration::from_millis(cfg.nvml_period_ms)),
            // One tick per detection window, the first a window from now.
            detect_tick: super::every(Duration::from_secs(cfg.detect.window_s)),
            started: Instant::now(),
            metrics_url,
            saver,
            quiet: false,
        })
    })?;
    // Nothing is recorded before `run`: every process is named by the config's rules.
    pipeline
        .session
        .registry
        .set_workloads(crate::identity::workload::Rules::new(&cfg.workloads));
    let mut stages = pipeline.run(cfg.record_rate_limit).await?;
    if let Some(otlp) = stages.daemon.otlp.take() {
        otlp.finish(Duration::from_secs(3)).await;
    }
    stages.sinks.finish(Duration::from_secs(3)).await;
    Ok(())
}
