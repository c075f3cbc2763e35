//! The contention detector: each signal's last value and baseline p99, and the alerts it holds.
use prometheus_client::{collector::Collector, encoding::DescriptorEncoder};

use super::{
    encode::{gauge, with, Labels},
    snapshot::SignalRow,
    SnapshotCell,
};

/// The detector collector.
#[derive(Debug)]
pub struct DetectorCollector(pub SnapshotCell);

impl Collector for DetectorCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let snap = self.0.load();
        let signal_rows = |f: &dyn Fn(&SignalRow) -> f64| -> Vec<(Labels, f64)> {
            snap.signals
                .iter()
                .map(|s| {
                    (
                        with(s.process.labels(), &[("signal", s.signal.as_str().into())]),
                        f(s),
                    )
                })
                .collect()
        };
        gauge(
            &mut enc,
            "cudatrace_signal_value",
            "Last detection window's value of a process's signal: launch_latency_p99 and wait_per_launch in seconds, copy_time_per_mib in seconds per MiB.",
            &signal_rows(&|s| s.value),
        )?;
        gauge(
            &mut enc,
            "cudatrace_signal_baseline_p99",
            "The signal's baseline p99 (same unit as cudatrace_signal_value); thresholds are fractions over it.",
            &signal_rows(&|s| s.p99),
        )?;
        gauge(
            &mut enc,
            "cudatrace_signal_forecast",
            "The baseline's forecast of the signal for the last detection window (same unit as cudatrace_signal_value): predicted against actual.",
            &signal_rows(&|s| s.forecast),
        )?;
        let alerts: Vec<(Labels, f64)> = snap
            .alerts
            .iter()
            .map(|r| {
                let labels = vec![
                    ("alert", r.alert.to_owned()),
                    ("state", r.state.as_str().to_owned()),
                    ("severity", r.severity.as_str().to_owned()),
                    ("cause", r.cause.as_str().to_owned()),
                    ("signal", r.evidence.signal.to_owned()),
                    ("gpu", r.gpu.clone()),
                    ("pid", r.victim.pid.to_string()),
                    ("comm", r.victim.comm.clone()),
                    ("namespace", r.victim.namespace.clone().unwrap_or_default()),
                    ("pod", r.victim.pod.clone().unwrap_or_default()),
                    ("container", r.victim.container.clone().unwrap_or_default()),
                    ("aggressors", r.aggressors_label()),
                    ("incident_aggressors", r.incident.aggressors.clone()),
                    ("quiet", r.quiet.is_some().to_string()),
                ];
                (labels, 1.0)
            })
            .collect();
        gauge(
            &mut enc,
            "cudatrace_alert_active",
            "1 for each alert cudatrace's detector holds pending or firing (see README).",
            &alerts,
        )?;
        let schedule = snap.schedule.clone().unwrap_or_else(|| "default".into());
        gauge(
            &mut enc,
            "cudatrace_detect_schedule",
            "1 for the [[detect.schedule]] entry whose tiers are in force (\"default\": the [detect] values).",
            &[(vec![("schedule", schedule)], 1.0)],
        )
    }
}
