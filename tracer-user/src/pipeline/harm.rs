//! The harm check in the session: a fault record of a probed thread is judged
//! (`probe::harm`); on harm the library's breaker opens (kept in the state dir), its probes are
//! detached, the process is marked (its death is not its own crash) and the consumer is told
//! (`run` fires `CudatraceProbeHarm`). A fault anywhere else stays the workload's.
use std::{collections::BTreeMap, os::unix::fs::FileExt as _};

use tracer_common::FaultEvent;

use super::{Consumer, Session};
use crate::probe::{
    guard::hex,
    harm::{self, Harm},
    proc_maps,
};

/// Faults judged per process at most (maps read, a line said); past it they are counted only.
const MAX_JUDGED: u32 = 8;
/// Processes whose judged faults are remembered at most (then forgotten all at once).
pub(super) const MAX_FAULT_PIDS: usize = 4096;

/// Distinct (library, symbol, signal) harm counters kept at most.
const MAX_HARM_SERIES: usize = 1024;

/// Harms counted by (library, symbol, signal).
pub type HarmCounts = BTreeMap<(String, &'static str, &'static str), u64>;

impl Session {
    /// Judges one fault record; on harm, acts on it.
    pub(super) fn fault(&mut self, f: FaultEvent, consumer: &mut impl Consumer) {
        // A tenant faulting in a loop (a SIGSEGV handler that returns to the fault) costs at most
        // MAX_JUDGED maps reads and lines; the rest are counted only.
        if self.faults_judged.len() >= MAX_FAULT_PIDS {
            self.faults_judged.clear();
        }
        let judged = self.faults_judged.entry(f.pid).or_insert(0);
        if *judged >= MAX_JUDGED {
            self.counts.own_faults += 1;
            return;
        }
        *judged += 1;
        let regions = harm::regions(f.pid);
        let Some(place) = harm::judge(&f, regions.as_deref()) else {
            self.counts.own_faults += 1;
            log::info!(
                target: "cudatrace::own_fault",
                pid = f.pid, signal = harm::signal_name(f.sig);
                "cudatrace: pid {} (tid {}) took {} at {:#x}, {} µs after its last probe hit at {:#x}: away from the probe, the workload's own",
                f.pid,
                f.tid,
                harm::signal_name(f.sig),
                f.pc,
                f.since_hit_ns / 1000,
                f.entry_ip
            );
            return;
        };
        let api = harm::api(&f);
        // The library: the file mapped at the probed address, else the one probing this api.
        let mapped = std::fs::File::open(format!("/proc/{}/maps", f.pid))
            .ok()
            .and_then(|m| proc_maps::file_offset_of(m, f.entry_ip));
        let lib = match &mapped {
            Some((m, _)) => self
                .probes
                .libraries
                .iter()
                .find(|l| l.file == (m.dev, m.inode)),
            None => self
                .probes
                .libraries
                .iter()
                .find(|l| api.is_some_and(|a| l.resolution.found.iter().any(|r| r.api == a))),
        }
        .cloned();
        let (library, key, instruction) = match &lib {
            Some(l) => {
                let offset = mapped.map(|(_, o)| o).or_else(|| {
                    let a = api?;
                    l.resolution
                        .found
                        .iter()
                        .find(|r| r.api == a)
                        .map(|r| r.offset)
                });
                let mut code = [0u8; 8];
                let n = offset
                    .and_then(|o| {
                        std::fs::File::open(&l.path)
                            .ok()?
                            .read_at(&mut code, o)
                            .ok()
                    })
                    .unwrap_or(0);
                (l.path.display().to_string(), Some(l.file), hex(&code[..n]))
            }
            None => ("unknown".to_owned(), None, String::new()),
        };
        let h = Harm {
            pid: f.pid,
            tid: f.tid,
            signal: harm::signal_name(f.sig),
            library,
            symbol: api.map_or("unknown", |a| a.symbol()),
            place,
            pc: f.pc,
            site: f.entry_ip,
            instruction,
            kernel: self.probes.kernel_release().to_owned(),
            after_us: f.since_hit_ns / 1000,
        };
        self.act_on_harm(h, key, consumer);
    }

    /// Lines of the kernel log that name a process the uprobe path failed in: harm too.
    pub(super) fn kernel_log(&mut self, consumer: &mut impl Consumer) {
        let Some(kmsg) = self.kmsg.as_mut() else {
            return;
        };
        for k in kmsg.poll() {
            // The attached library the process maps, else the only one attached.
            let mapped = std::fs::File::open(format!("/proc/{}/maps", k.pid))
                .map(proc_maps::libcuda_mappings)
                .unwrap_or_default();
            let lib = self
                .probes
                .libraries
                .iter()
                .find(|l| mapped.iter().any(|m| (m.dev, m.inode) == l.file))
                .or(match self.probes.libraries.as_slice() {
                    [only] => Some(only),
                    _ => None,
                })
                .cloned();
            let h = Harm {
                pid: k.pid,
                tid: k.pid,
                signal: "kernel_log",
                library: lib
                    .as_ref()
                    .map_or_else(|| "unknown".to_owned(), |l| l.path.display().to_string()),
                symbol: "unknown",
                place: harm::Place::KernelLog,
                pc: 0,
                site: 0,
                instruction: k.message,
                kernel: self.probes.kernel_release().to_owned(),
                after_us: 0,
            };
            self.act_on_harm(h, lib.map(|l| l.file), consumer);
        }
    }

    /// Counts a harm, opens its library's breaker and detaches it, marks the process and tells
    /// the consumer.
    fn act_on_harm(
        &mut self,
        h: Harm,
        key: Option<crate::probe::discovery::FileKey>,
        consumer: &mut impl Consumer,
    ) {
        let counter = (h.library.clone(), h.symbol, h.signal);
        if self.harms.len() < MAX_HARM_SERIES || self.harms.contains_key(&counter) {
            *self.harms.entry(counter).or_insert(0) += 1;
        }
        let detached = match key {
            Some(key) => {
                self.probes.breaker.trip(&h.library, key, h.line());
                self.probes.detach_library(key)
            }
            None => false,
        };
        log::error!(
            target: "cudatrace::probe_harm",
            pid = h.pid, symbol = h.symbol, signal = h.signal, library = h.library.as_str();
            "cudatrace: probe harm: {}; breaker open for {}{}",
            crate::text::printable(&h.line()),
            crate::text::printable(&h.library),
            if detached { ", its probes detached" } else { " (classic uprobes stay until cudatrace stops)" }
        );
        let process = self.registry.live_mut(h.pid);
        if let Some(p) = process {
            p.probe_harmed = true;
            consumer.harm(&h, Some(p));
        } else {
            consumer.harm(&h, None);
        }
    }

    /// Harms counted so far, by (library, symbol, signal).
    pub fn harms(&self) -> &HarmCounts {
        &self.harms
    }

    /// The libraries whose probe-harm breaker is open.
    pub fn breakers(&self) -> Vec<String> {
        self.probes
            .breaker
            .open
            .iter()
            .map(|o| o.library.clone())
            .collect()
    }
}
