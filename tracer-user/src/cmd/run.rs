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
    config,
    config::Config,
    enrich::pods_api,
    enrich::pods_api::PodNamesSource,
    nvml::Sampler,
    pipeline::{Session, Tuning},
    registry::Registry,
    sinks::alerting::AlertSinks,
    sinks::metrics::server,
    sinks::metrics::web,
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
    // The sinks (the CA file, the archive) are checked before anything is loaded, as the port
    // and the web config are.
    let sinks = AlertSinks::start(&cfg, format!("{scheme}://{}/metrics", cfg.listen))?;
    let mut session = Session::open(args.sel.session(Tuning::daemon(&cfg, args.duration)))?;
    let mut sampler = Sampler::new(cfg.nvml_library.as_ref());
    if let Sampler::Off(why) = &sampler {
        log::warn!("cudatrace: {why}");
    }
    let started = Instant::now();
    let mut daemon = Daemon::new(&cfg, &sampler, &session);
    let (requests_tx, mut requests) = mpsc::channel(16);
    server::spawn(listener, requests_tx, web)?;
    let mut nvml_tick = tokio::time::interval(Duration::from_millis(cfg.nvml_period_ms));
    // Alert evaluation: one tick per detection window, the first a window from now.
    let mut detect_tick = super::every(Duration::from_secs(cfg.detect.window_s));
    let pod_names = pods_api::start(&cfg.kubernetes);
    session.set_rate_limit(cfg.record_rate_limit)?;
    let probes = session.start_recording()?;
    let metrics = format!("{scheme}://{}/metrics", cfg.listen);
    log::info!(
        target: "cudatrace::ready",
        probes = probes,
        metrics = metrics.as_str();
        "ready: {probes} probes attached; metrics at {metrics}"
    );
    let output_closed = loop {
        tokio::select! {
            wake = session.wake() => if let Some(closed) = daemon.on_wake(&mut session, wake?) {
                break closed;
            },
            _ = nvml_tick.tick() => {
                daemon.sample(&mut sampler);
                daemon.dropped = session.dropped();
                session.registry.sweep();
                name_pods(pod_names.as_ref(), &mut session.registry);
            }
            _ = detect_tick.tick() => {
                let changes = daemon.evaluate(&mut session, started.elapsed().as_secs_f64());
                sinks.publish(&changes);
            }
            Some(reply) = requests.recv() => {
                name_pods(pod_names.as_ref(), &mut session.registry);
                let _ = reply.send(Arc::new(daemon.snapshot(&mut session)));
            }
        }
    };
    session.finish(&mut daemon, output_closed)?;
    // Victims that exited since the last window resolve; firing alerts of live processes are
    // left to expire in Alertmanager (the problem is not known to be over).
    sinks.publish(&daemon.detector.take_changes());
    session.detach();
    sinks.finish(Duration::from_secs(3)).await;
    Ok(())
}
