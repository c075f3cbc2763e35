//! Per process: device memory (now and peak), the GPU-time estimate, and the GPUs it can use.
use prometheus_client::{collector::Collector, encoding::DescriptorEncoder};

use super::{
    encode::{counter, gauge, with, Labels},
    snapshot::ProcessRow,
    SnapshotCell,
};

/// The processes collector.
#[derive(Debug)]
pub struct ProcessesCollector(pub SnapshotCell);

impl Collector for ProcessesCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let snap = self.0.load();
        let rows = |f: &dyn Fn(&ProcessRow) -> f64| -> Vec<(Labels, f64)> {
            snap.processes
                .iter()
                .map(|p| (p.process.labels(), f(p)))
                .collect()
        };
        gauge(
            &mut enc,
            "cudatrace_device_memory_bytes",
            "Device memory a process holds, from traced allocations and frees.",
            &rows(&|p| p.memory_bytes as f64),
        )?;
        gauge(
            &mut enc,
            "cudatrace_device_memory_peak_bytes",
            "Highest device memory a process held while traced.",
            &rows(&|p| p.memory_peak_bytes as f64),
        )?;
        counter(
            &mut enc,
            "cudatrace_gpu_time_estimate_seconds",
            "Estimated device time of a process's completed work (upper bound; see README).",
            &rows(&|p| p.gpu_ns_estimate as f64 / 1e9),
        )?;
        let on: Vec<(Labels, f64)> = snap
            .processes
            .iter()
            .flat_map(|p| {
                p.gpus
                    .iter()
                    .map(|g| (with(p.process.labels(), &[("gpu", g.clone())]), 1.0))
            })
            .collect();
        gauge(
            &mut enc,
            "cudatrace_process_gpu",
            "1 for each GPU a process can use (NVML's placement, else its CUDA_VISIBLE_DEVICES): join per-process series to GPUs by it.",
            &on,
        )
    }
}
