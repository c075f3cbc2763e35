//! The OTLP exporter: spans sent, dropped and failed exports (only while `[otlp]` is on).
use prometheus_client::{collector::Collector, encoding::DescriptorEncoder};

use super::{encode::counter, SnapshotCell};

/// The OTLP collector.
#[derive(Debug)]
pub struct OtlpCollector(pub SnapshotCell);

impl Collector for OtlpCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let snap = self.0.load();
        let Some(o) = snap.otlp else {
            return Ok(());
        };
        let of = |s: &str| vec![("signal", s.to_owned())];
        counter(
            &mut enc,
            "cudatrace_otlp_sent",
            "Spans (signal=spans) and log records (signal=logs) the OTLP collector took.",
            &[
                (of("spans"), o.sent as f64),
                (of("logs"), o.logs_sent as f64),
            ],
        )?;
        counter(
            &mut enc,
            "cudatrace_otlp_dropped",
            "Spans and log records dropped: the queue (otlp.max_queue) was full, or their batch failed every try.",
            &[(of("spans"), o.dropped as f64), (of("logs"), o.logs_dropped as f64)],
        )?;
        counter(
            &mut enc,
            "cudatrace_otlp_export_failures",
            "Export tries the OTLP collector did not take (each retry counts).",
            &[(vec![], o.failed as f64)],
        )
    }
}
