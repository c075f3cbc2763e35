//! Per process: device memory (now and peak), device time (two measures), graph replays, the
//! work per device it drives, and the GPUs it can use.
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
        let measures: Vec<(Labels, f64)> = snap
            .processes
            .iter()
            .flat_map(|p| {
                [("batch_span", p.span_ns), ("host_wait", p.wait_ns)].map(|(m, ns)| {
                    (
                        with(p.process.labels(), &[("measure", m.into())]),
                        ns as f64 / 1e9,
                    )
                })
            })
            .collect();
        counter(
            &mut enc,
            "cudatrace_device_time_seconds",
            "Device time of a process's completed work, by measure: host_wait (time blocked in waits) or batch_span (first submission of a batch to its close, host gaps before a wait that did not block left out). Neither is a bound on a shared GPU (docs/metrics.md).",
            &measures,
        )?;
        let replays: Vec<(Labels, f64)> = snap
            .processes
            .iter()
            .filter(|p| p.graph_replays.0 > 0)
            .flat_map(|p| {
                let (all, unknown) = p.graph_replays;
                [("known", all - unknown.min(all)), ("unknown", unknown)].map(|(c, n)| {
                    (
                        with(p.process.labels(), &[("composition", c.into())]),
                        n as f64,
                    )
                })
            })
            .collect();
        counter(
            &mut enc,
            "cudatrace_graph_replays",
            "CUDA graph launches, by whether the graph's kernels are known (captured while traced) or unknown (captured before tracing began, or built node by node: its kernels are not counted in cudatrace_kernel_runs_total).",
            &replays,
        )?;
        let unprobed: Vec<(Labels, f64)> = snap
            .processes
            .iter()
            .flat_map(|p| {
                p.unprobed
                    .iter()
                    .map(|s| (with(p.process.labels(), &[("api", s.clone())]), 1.0))
            })
            .collect();
        gauge(
            &mut enc,
            "cudatrace_unprobed_entry_points",
            "1 for each probed entry point cuGetProcAddress_v2 handed a process elsewhere than its probe: its calls through that address are not traced.",
            &unprobed,
        )?;
        // Per device, for a process that drives several: by the UUID the process read.
        let per_device = |f: &dyn Fn(&super::snapshot::DeviceRow) -> u64| -> Vec<(Labels, f64)> {
            snap.processes
                .iter()
                .flat_map(|p| {
                    p.devices.iter().map(|d| {
                        let at = [
                            ("cuda_device", d.cuda_device.clone()),
                            ("gpu", d.gpu.clone()),
                        ];
                        (with(p.process.labels(), &at), f(d) as f64)
                    })
                })
                .collect()
        };
        counter(
            &mut enc,
            "cudatrace_device_launches",
            "Successful kernel launches per device a process drives: cuda_device is CUDA's ordinal in the process (unknown: a context bound before tracing), gpu NVML's index of the UUID the process read (never matched by ordinal; empty when none matches).",
            &per_device(&|d| d.launches),
        )?;
        counter(
            &mut enc,
            "cudatrace_device_bytes",
            "Bytes of successful copies and memsets per device a process drives (the device of the stream's context), labelled as cudatrace_device_launches_total.",
            &per_device(&|d| d.bytes),
        )?;
        let held = per_device(&|d| d.memory_bytes);
        gauge(
            &mut enc,
            "cudatrace_device_memory_by_device_bytes",
            "Device memory a process holds per device (the allocating context's; a VMM allocation's own location), labelled as cudatrace_device_launches_total: cudatrace_device_memory_bytes split.",
            &held,
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
