//! Prometheus metrics. The event loop owns every table; a scrape asks it for a [`Snapshot`] (the
//! rows the metrics need, copied between two drains) and encodes that on the metrics server's
//! own thread, so encoding never holds up tracing. One prometheus-client collector per domain
//! (calls, processes, probes and the agent, the detector, GPUs, OTLP), registered in [`registry`].
pub mod admission;
pub mod calls;
pub mod detector;
pub mod encode;
pub mod gpus;
pub mod otlp;
pub mod probes;
pub mod processes;
pub mod server;
pub mod snapshot;
pub mod web;

use prometheus_client::registry::Registry;

pub use snapshot::{OtlpCounts, Snapshot, SnapshotCell, Sources};

/// The registry of every collector, each reading the latest snapshot in `cell`.
pub fn registry(cell: &SnapshotCell) -> Registry {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(calls::CallsCollector(cell.clone())));
    registry.register_collector(Box::new(processes::ProcessesCollector(cell.clone())));
    registry.register_collector(Box::new(probes::ProbesCollector(cell.clone())));
    registry.register_collector(Box::new(detector::DetectorCollector(cell.clone())));
    registry.register_collector(Box::new(gpus::GpusCollector(cell.clone())));
    registry.register_collector(Box::new(otlp::OtlpCollector(cell.clone())));
    registry
}
