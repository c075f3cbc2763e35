//! What `run` and `top` keep beside the session: the aggregation and the detector every call
//! goes through, the latest NVML sample, and the snapshot both read them by (the metrics for
//! `run`, the screen for `top`): one implementation for both.
use std::{io, time::SystemTime};

use crate::{
    aggregate::Aggregator, aggregate::SeriesLimits, config::Config, detect::Detector,
    enrich::Enrichment, event::Event, event::LaunchDelta, nvml::GpuSample, nvml::Sampler,
    pipeline::Consumer, pipeline::Session, probe::loader::Drops, registry::Process,
    sinks::metrics::Snapshot, sinks::metrics::Sources,
};

/// The aggregation, the detector and the latest NVML sample.
pub struct Daemon {
    /// Series and quantiles per process.
    pub aggregator: Aggregator,
    /// The contention detector.
    pub detector: Detector,
    /// Latest NVML sample.
    pub gpus: Vec<GpuSample>,
    /// Whether NVML answers.
    pub nvml_up: bool,
    /// Records the kernel did not write, by reason.
    pub dropped: Drops,
    /// The detection window: a call in the driver this long is stuck.
    window: std::time::Duration,
    /// Spans of slow and failed calls, when `[otlp]` is on.
    pub otlp: Option<crate::sinks::otlp::Exporter>,
}

impl Consumer for Daemon {
    fn call(&mut self, ev: &Event, e: &Enrichment, process: &mut Process) -> io::Result<()> {
        self.aggregator
            .observe(&mut process.series, ev, e.kernel.as_deref(), e.captured);
        if let Some(nodes) = e.graph_runs.as_deref() {
            let kernels = &process.kernels;
            self.aggregator
                .observe_graph(&mut process.series, nodes, |f| kernels.name(f));
        }
        // A call recorded into a graph ran nothing: no window counts it.
        if !e.captured {
            self.detector
                .observe(&mut process.signals, ev, e.batch.as_ref());
        }
        if let Some(nodes) = e.graph_runs.as_deref() {
            self.detector.observe_graph(&mut process.signals, nodes);
        }
        if let Some(otlp) = self.otlp.as_mut() {
            let kernel = e.kernel.as_deref().map(|k| &*k.demangled);
            // The call's own device when its context's UUID is known (a process driving several),
            // else the GPU NVML lists the process on, when it does.
            let (gpus, devices) = (&self.gpus, &process.devices);
            // Looked up only when a span is made.
            let gpu = || {
                let key = crate::event::context::nvml_uuid_key;
                let own = devices.uuid_of_context(ev.context);
                own.and_then(|u| gpus.iter().find(|g| key(&g.uuid) == u))
                    .or_else(|| {
                        gpus.iter()
                            .find(|g| g.processes.iter().any(|p| p.pid == ev.pid))
                    })
                    .map(|g| (g.index, g.uuid.clone()))
            };
            otlp.call(ev, (&process.identity, &process.workload), kernel, gpu);
        }
        Ok(())
    }

    fn launches(&mut self, d: &LaunchDelta, process: &mut Process) {
        let kernel = process.kernels.name(d.function);
        self.aggregator
            .observe_launches(&mut process.series, d, kernel.as_deref());
        process.devices.observe_launches(d);
        self.detector.observe_launches(&mut process.signals, d);
    }

    fn exited(&mut self, process: &mut Process) {
        // Its alerts resolve; its series stay for `retain_exited_s`. A death a probe caused
        // is not counted as the workload's restart.
        let harmed = process.probe_harmed;
        let (who, at_exit, slot) = process.at_exit();
        if harmed {
            self.detector
                .exited_after_harm(who, at_exit.0, slot, SystemTime::now());
        } else {
            self.detector.exited(who, at_exit, slot, SystemTime::now());
        }
    }

    fn harm(&mut self, h: &crate::probe::harm::Harm, process: Option<&mut Process>) {
        let victim = match process {
            Some(p) => crate::alert::Party::of(p.view(), None),
            None => crate::alert::Party {
                pid: h.pid,
                workload: None,
                ..crate::alert::Party::workload("")
            },
        };
        self.detector.probe_harm(victim, h, SystemTime::now());
    }
}

impl Daemon {
    /// The daemon of `cfg`, NVML as `sampler` found it.
    pub fn new(cfg: &Config, sampler: &Sampler) -> Daemon {
        Daemon {
            aggregator: Aggregator::new(SeriesLimits {
                top_kernels: cfg.top_kernels,
                max_kernels: cfg.max_kernels,
            }),
            detector: Detector::new(cfg.detect.clone(), 0.0)
                .with_quiet(crate::policy::quiet::Quiet::new(&cfg.alerts.quiet)),
            gpus: Vec::new(),
            nvml_up: sampler.up(),
            dropped: Drops::default(),
            window: std::time::Duration::from_secs(cfg.detect.window_s),
            otlp: None,
        }
    }

    /// Takes an NVML sample (said once when it fails while NVML is up).
    pub fn sample(&mut self, sampler: &mut Sampler) {
        match sampler.sample() {
            Ok(gpus) => self.gpus = gpus,
            Err(e) => {
                if sampler.up() {
                    log::warn!("cudatrace: NVML sample failed: {e}");
                }
            }
        }
    }

    /// One detection window: the launches counted in-kernel read, every process's signals
    /// evaluated (`since_start`: seconds since the daemon started); returns the alert changes.
    pub fn evaluate(
        &mut self,
        session: &mut Session,
        since_start: f64,
    ) -> Vec<crate::alert::AlertChange> {
        session.harvest(self);
        // Calls in the driver for a window or more: what a starved process shows.
        for call in session.in_flight_for(self.window) {
            use crate::detect::Processes as _;
            if let Some(slot) = session.registry.slot_mut(call.pid) {
                self.detector
                    .observe_stuck(slot, call.api.info().kind, call.start_ns);
            }
        }
        // The host's CPU, for the causal verdicts: each traced process's run-queue delay and
        // every cgroup's CPU use.
        {
            use crate::detect::Processes as _;
            for (pid, _, _, slot) in session.registry.slots_mut() {
                if slot.is_some() {
                    self.detector
                        .observe_run_delay(slot, crate::hostcpu::run_delay_ns(pid));
                }
            }
        }
        self.detector.observe_cgroups(
            crate::hostcpu::cgroups(&crate::hostcpu::cgroup_root()),
            since_start,
        );
        self.detector.evaluate(
            &mut session.registry,
            since_start,
            SystemTime::now(),
            &self.gpus,
        );
        self.detector.take_changes()
    }

    /// Reads the launches counted in-kernel, then copies everything a reader needs.
    pub fn snapshot(&mut self, session: &mut Session) -> Snapshot {
        session.harvest(self);
        self.dropped = session.dropped();
        Snapshot::build(&Sources {
            libraries_refused: session.libraries_refused(),
            discovery: session.discovery_counted(),
            drops_by_process: &session.drops_by_process(),
            registry: &session.registry,
            aggregator: &self.aggregator,
            detector: &self.detector,
            events: session.counts.events,
            dropped: self.dropped,
            // Read again: a breaker may have detached a library since start.
            probes: &session.probe_rows(),
            sites: session.site_counts(),
            harms: session
                .harms()
                .iter()
                .map(|((l, s, g), n)| (l.clone(), *s, *g, *n))
                .collect(),
            harms_suspected: session
                .harms_suspected()
                .iter()
                .map(|((l, s, g), n)| (l.clone(), *s, *g, *n))
                .collect(),
            breakers: session.breakers(),
            nvml_up: self.nvml_up,
            gpus: &self.gpus,
            otlp: self.otlp.as_ref().map(|o| {
                use std::sync::atomic::Ordering::Relaxed;
                let s = o.stats();
                crate::sinks::metrics::OtlpCounts {
                    sent: s.sent.load(Relaxed),
                    dropped: s.dropped.load(Relaxed),
                    logs_sent: s.logs_sent.load(Relaxed),
                    logs_dropped: s.logs_dropped.load(Relaxed),
                    failed: s.failed.load(Relaxed),
                }
            }),
        })
    }
}

/// Implements [`Consumer`] for a command's stages that hold a `daemon: Daemon` field (`run`'s
/// and `top`'s): every call, launch count and exit goes to the daemon.
macro_rules! consume_through_daemon {
    ($stages:ty) => {
        impl $crate::pipeline::Consumer for $stages {
            fn call(
                &mut self,
                ev: &$crate::event::Event,
                e: &$crate::enrich::Enrichment,
                process: &mut $crate::registry::Process,
            ) -> std::io::Result<()> {
                $crate::pipeline::Consumer::call(&mut self.daemon, ev, e, process)
            }

            fn launches(
                &mut self,
                d: &$crate::event::LaunchDelta,
                process: &mut $crate::registry::Process,
            ) {
                $crate::pipeline::Consumer::launches(&mut self.daemon, d, process);
            }

            fn exited(&mut self, process: &mut $crate::registry::Process) {
                $crate::pipeline::Consumer::exited(&mut self.daemon, process);
            }

            fn harm(
                &mut self,
                h: &$crate::probe::harm::Harm,
                process: Option<&mut $crate::registry::Process>,
            ) {
                $crate::pipeline::Consumer::harm(&mut self.daemon, h, process);
            }
        }
    };
}
pub(crate) use consume_through_daemon;
