//! Per GPU, from NVML: utilization, memory, temperature, power, clocks, clock-event (throttle)
//! reasons, PCIe throughput, and NVML's per-process memory and utilization.
use prometheus_client::{collector::Collector, encoding::DescriptorEncoder};

use super::{
    encode::{gauge, with, Labels},
    SnapshotCell,
};
use crate::nvml::{GpuProcess, GpuSample, REASONS};

/// The GPUs collector.
#[derive(Debug)]
pub struct GpusCollector(pub SnapshotCell);

impl Collector for GpusCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        encode_gpus(&mut enc, &self.0.load().gpus)
    }
}

fn encode_gpus(enc: &mut DescriptorEncoder, gpus: &[GpuSample]) -> std::fmt::Result {
    let gl =
        |g: &GpuSample| -> Labels { vec![("gpu", g.index.to_string()), ("uuid", g.uuid.clone())] };
    let per = |f: &dyn Fn(&GpuSample) -> Option<f64>| -> Vec<(Labels, f64)> {
        gpus.iter()
            .filter_map(|g| f(g).map(|v| (gl(g), v)))
            .collect()
    };
    gauge(
        enc,
        "cudatrace_gpu_utilization_ratio",
        "SM utilization over NVML's last sample period.",
        &per(&|g| g.sm_util.map(|v| v as f64 / 100.0)),
    )?;
    gauge(
        enc,
        "cudatrace_gpu_memory_utilization_ratio",
        "Memory-controller utilization.",
        &per(&|g| g.mem_util.map(|v| v as f64 / 100.0)),
    )?;
    gauge(
        enc,
        "cudatrace_gpu_memory_used_bytes",
        "Device memory used.",
        &per(&|g| g.memory_used.map(|v| v as f64)),
    )?;
    gauge(
        enc,
        "cudatrace_gpu_memory_total_bytes",
        "Device memory in all.",
        &per(&|g| g.memory_total.map(|v| v as f64)),
    )?;
    gauge(
        enc,
        "cudatrace_gpu_temperature_celsius",
        "GPU temperature.",
        &per(&|g| g.temperature.map(f64::from)),
    )?;
    gauge(
        enc,
        "cudatrace_gpu_power_watts",
        "Power draw.",
        &per(&|g| g.power_mw.map(|v| v as f64 / 1000.0)),
    )?;
    gauge(
        enc,
        "cudatrace_gpu_sm_clock_hertz",
        "SM clock.",
        &per(&|g| g.sm_clock_mhz.map(|v| v as f64 * 1e6)),
    )?;
    let reasons: Vec<(Labels, f64)> = gpus
        .iter()
        .filter_map(|g| g.reasons.map(|r| (g, r)))
        .flat_map(|(g, r)| {
            REASONS.iter().map(move |(bit, name)| {
                (
                    with(gl(g), &[("reason", (*name).into())]),
                    f64::from(u8::from(r & bit != 0)),
                )
            })
        })
        .collect();
    gauge(
        enc,
        "cudatrace_gpu_clock_event_reason",
        "1 while the clock-event (throttle) reason holds the clocks down.",
        &reasons,
    )?;
    let pcie: Vec<(Labels, f64)> = gpus
        .iter()
        .filter_map(|g| g.pcie_kbs.map(|k| (g, k)))
        .flat_map(|(g, (tx, rx))| {
            [("tx", tx), ("rx", rx)]
                .map(|(d, v)| (with(gl(g), &[("direction", d.into())]), v as f64 * 1024.0))
        })
        .collect();
    gauge(
        enc,
        "cudatrace_gpu_pcie_throughput_bytes_per_second",
        "PCIe throughput.",
        &pcie,
    )?;
    let procs = |f: &dyn Fn(&GpuProcess) -> Option<f64>| -> Vec<(Labels, f64)> {
        gpus.iter()
            .flat_map(|g| {
                g.processes.iter().filter_map(move |p| {
                    f(p).map(|v| (with(gl(g), &[("pid", p.pid.to_string())]), v))
                })
            })
            .collect()
    };
    gauge(
        enc,
        "cudatrace_gpu_process_memory_bytes",
        "Device memory of a compute process, per NVML.",
        &procs(&|p| p.memory_bytes.map(|v| v as f64)),
    )?;
    gauge(
        enc,
        "cudatrace_gpu_process_sm_utilization_ratio",
        "SM utilization of a process, per NVML's samples.",
        &procs(&|p| p.sm_util.map(|v| v as f64 / 100.0)),
    )?;
    gauge(
        enc,
        "cudatrace_gpu_process_memory_utilization_ratio",
        "Memory-controller utilization of a process.",
        &procs(&|p| p.mem_util.map(|v| v as f64 / 100.0)),
    )
}
