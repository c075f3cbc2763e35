//! The agent itself: probes attached per library, records consumed and dropped, processes
//! evicted, and whether NVML answers.
use prometheus_client::{collector::Collector, encoding::DescriptorEncoder};

use super::{
    encode::{counter, gauge, Labels},
    SnapshotCell,
};

/// The probes and agent collector.
#[derive(Debug)]
pub struct ProbesCollector(pub SnapshotCell);

impl Collector for ProbesCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let snap = self.0.load();
        counter(
            &mut enc,
            "cudatrace_events",
            "Ring-buffer records consumed.",
            &[(vec![], snap.events as f64)],
        )?;
        counter(
            &mut enc,
            "cudatrace_processes_evicted",
            "Processes whose series were dropped to stay within max_processes.",
            &[(vec![], snap.evicted as f64)],
        )?;
        let dropped: Vec<(Labels, f64)> = snap
            .dropped
            .by_reason()
            .into_iter()
            .map(|(r, n)| (vec![("reason", r.to_owned())], n as f64))
            .collect();
        counter(
            &mut enc,
            "cudatrace_events_dropped",
            "Records not written: reason ring_full (the ring buffer was full), rate_limit (the process was over record_rate_limit).",
            &dropped,
        )?;
        counter(
            &mut enc,
            "cudatrace_libraries_refused",
            "Library files not attached because max_libraries distinct ones were attached already.",
            &[(vec![], snap.libraries_refused as f64)],
        )?;
        counter(
            &mut enc,
            "cudatrace_discovery_maps_read",
            "Processes whose /proc/PID/maps discovery read (polling: every process each rescan; event-driven: those the kernel named, and full passes).",
            &[(vec![], snap.discovery.maps_read as f64)],
        )?;
        counter(
            &mut enc,
            "cudatrace_discovery_opens_dropped",
            "Opens of a libcuda not queued for a read: the opener's tenant (cgroup) had 256 processes waiting, or all had 4,096; a full pass then reads every process.",
            &[(vec![], snap.discovery.opens_dropped as f64)],
        )?;
        counter(
            &mut enc,
            "cudatrace_discovery_opens_deferred",
            "Opens of a libcuda by a process whose reads found none a moment ago: read when its quiet time (1 s, doubling to 60 s) is up.",
            &[(vec![], snap.discovery.opens_deferred as f64)],
        )?;
        counter(
            &mut enc,
            "cudatrace_discovery_full_passes",
            "Passes over every process's maps (the first at start; later ones paid from the reads' CPU budget).",
            &[(vec![], snap.discovery.full_passes as f64)],
        )?;
        counter(
            &mut enc,
            "cudatrace_discovery_execs_read",
            "Executions of a file not executed before whose process's maps were read for its dynamic loader (where the loaders are hooked).",
            &[(vec![], snap.discovery.execs_read as f64)],
        )?;
        counter(
            &mut enc,
            "cudatrace_discovery_execs_dropped",
            "Executions of a new file not read, the reads' CPU budget being spent: said again at the file's next execution.",
            &[(vec![], snap.discovery.execs_dropped as f64)],
        )?;
        gauge(
            &mut enc,
            "cudatrace_discovery_loaders",
            "Dynamic loader files whose _dl_debug_state discovery hooks (where the kernel's open path cannot be probed; at most 64, then the sys_enter hook runs as well).",
            &[(vec![], snap.discovery.loaders as f64)],
        )?;
        let by_process: Vec<(Labels, f64)> = snap
            .drops_by_process
            .iter()
            .map(|(d, comm)| {
                (
                    vec![
                        ("pid", d.pid.to_string()),
                        ("comm", comm.clone()),
                        ("reason", d.reason.to_owned()),
                    ],
                    d.count as f64,
                )
            })
            .collect();
        counter(
            &mut enc,
            "cudatrace_events_dropped_by_process",
            "Records not written, by the process whose calls they were and the reason (ring_full: who filled the ring buffer; no_slot: calls not timed, their process or cgroup over its share of entry slots).",
            &by_process,
        )?;
        let overflows: Vec<(Labels, f64)> = snap
            .table_overflows
            .iter()
            .map(|(table, n)| (vec![("table", (*table).to_owned())], *n as f64))
            .collect();
        counter(
            &mut enc,
            "cudatrace_table_overflows",
            "Entries a process's bounded table did not take (kernel_handles, allocations, streams): a process past the limits.",
            &overflows,
        )?;
        let probes: Vec<(Labels, f64)> = snap
            .probes
            .iter()
            .map(|p| {
                (
                    vec![
                        ("symbol", p.symbol.to_owned()),
                        ("library", p.library.clone()),
                    ],
                    f64::from(u8::from(p.attached)),
                )
            })
            .collect();
        gauge(
            &mut enc,
            "cudatrace_probe_attached",
            "1 when the symbol's probes are attached in the library, 0 when it is not exported.",
            &probes,
        )?;
        let arch = crate::probe::kernels::Arch::HOST.name();
        let sites: Vec<(Labels, f64)> = [
            ("emulated", snap.sites.emulated),
            ("stepped", snap.sites.stepped),
        ]
        .into_iter()
        .map(|(path, n)| {
            (
                vec![("arch", arch.to_owned()), ("path", path.to_owned())],
                n as f64,
            )
        })
        .collect();
        gauge(
            &mut enc,
            "cudatrace_probe_sites",
            "Probe sites attached, by how the kernel runs their instruction: emulated (no single step) or stepped (single-stepped out of line, the path a kernel bug can harm).",
            &sites,
        )?;
        counter(
            &mut enc,
            "cudatrace_probe_harm",
            "Faults of traced threads judged cudatrace's own probe's harm (at or just past a probed entry, in the XOL page, or at a corrupted return, right after a probe hit) and corroborated: the library's breaker opened.",
            &harm_rows(&snap.harms),
        )?;
        counter(
            &mut enc,
            "cudatrace_probe_harm_suspected",
            "Faults judged as a probe's harm would be, from one tenant while others use the library and nothing corroborated them: no probe detached.",
            &harm_rows(&snap.harms_suspected),
        )?;
        let breakers: Vec<(Labels, f64)> = snap
            .breakers
            .iter()
            .map(|l| (vec![("library", l.clone())], 1.0))
            .collect();
        gauge(
            &mut enc,
            "cudatrace_probe_breaker_open",
            "1 for a library whose probes harmed a process: detached on this node until `cudatrace breaker --clear`.",
            &breakers,
        )?;
        gauge(
            &mut enc,
            "cudatrace_nvml_up",
            "1 when NVML answers, 0 without it.",
            &[(vec![], f64::from(u8::from(snap.nvml_up)))],
        )
    }
}

/// Harm counts as labelled rows.
fn harm_rows(harms: &[(String, &'static str, &'static str, u64)]) -> Vec<(Labels, f64)> {
    harms
        .iter()
        .map(|(library, symbol, signal, n)| {
            (
                vec![
                    ("library", library.clone()),
                    ("symbol", (*symbol).to_owned()),
                    ("signal", (*signal).to_owned()),
                ],
                *n as f64,
            )
        })
        .collect()
}
