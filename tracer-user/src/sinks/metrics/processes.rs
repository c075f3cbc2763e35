//! Per process: device memory (now and peak) and the GPU-time estimate.
use prometheus_client::{collector::Collector, encoding::DescriptorEncoder};

use super::{
    SnapshotCell,
    encode::{Labels, counter, gauge},
    snapshot::ProcessRow,
};

/// The processes collector.
#[derive(Debug)]
pub struct ProcessesCollector(pub SnapshotCell);

impl Collector for ProcessesCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let snap = self.0.load();
        let rows = |f: &dyn Fn(&ProcessRow) -> f64| -> Vec<(Labels, f64)> {
            snap.processes.iter().map(|p| (p.process.labels(), f(p))).collect()
        };
        gauge(&mut enc, "cudatrace_device_memory_bytes", "Device memory a process holds, from traced allocations and frees.", &rows(&|p| p.memory_bytes as f64))?;
        gauge(&mut enc, "cudatrace_device_memory_peak_bytes", "Highest device memory a process held while traced.", &rows(&|p| p.memory_peak_bytes as f64))?;
        counter(
            &mut enc,
            "cudatrace_gpu_time_estimate_seconds",
            "Estimated device time of a process's completed work (upper bound; see README).",
            &rows(&|p| p.gpu_ns_estimate as f64 / 1e9),
        )
    }
}
