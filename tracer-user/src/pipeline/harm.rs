//! The harm check in the session: a fault record of a probed thread is judged
//! (`probe::harm`). A fault the process made itself, or away from the probe, stays the
//! workload's. A harm is corroborated or only suspected (`probe::scope`): corroborated, the
//! library's breaker opens (kept in the state dir), its probes are detached, the process is
//! marked (its death is not its own crash) and the consumer is told (`run` fires
//! `CudatraceProbeHarm`); suspected, nothing is detached and `run` fires
//! `CudatraceProbeHarmSuspected` naming the tenant.
use std::{
    collections::{BTreeMap, HashMap},
    os::unix::fs::FileExt as _,
    time::{Duration, Instant},
};

use tracer_common::{api::library_tag, FaultEvent};

use super::{Consumer, Session};
use crate::{
    identity::Tenant,
    probe::{
        discovery::FileKey,
        guard::hex,
        harm::{self, Basis, Harm},
        kmsg::Kmsg,
        library::LibraryProbes,
        proc_maps,
        scope::{Decision, Fault, Scope},
    },
};

/// Faults judged per process at most (maps read, a line said); past it they are counted only.
const MAX_JUDGED: u32 = 8;
/// Processes whose judged faults are remembered at most (then forgotten all at once).
pub(super) const MAX_FAULT_PIDS: usize = 4096;

/// Distinct (library, symbol, signal) harm counters kept at most.
const MAX_HARM_SERIES: usize = 1024;
/// How long the tenants using a library are kept once read (a tenant faulting from many
/// processes costs one pass over the traced processes' maps this often at most).
const USERS_FRESH: Duration = Duration::from_secs(1);

/// Harms counted by (library, symbol, signal).
pub type HarmCounts = BTreeMap<(String, &'static str, &'static str), u64>;

/// What the harm check keeps between records.
pub(super) struct HarmState {
    /// Corroborated harms by (library, symbol, signal).
    harms: HarmCounts,
    /// Suspected harms, likewise.
    suspected: HarmCounts,
    /// Faults judged so far per process (bounded: see above).
    judged: HashMap<u32, u32>,
    /// The kernel log, where readable (its uprobe-path lines open the breaker too).
    kmsg: Option<Kmsg>,
    /// Suspicions, by library and tenant.
    scope: Scope,
    /// `vm.mmap_min_addr`.
    mmap_min: u64,
    /// The tenants last found using a library, and when.
    users: Option<(FileKey, Instant, Vec<String>)>,
}

impl HarmState {
    /// With the kernel log as opened while still privileged (`None`: said once, unreadable).
    pub(super) fn new(kmsg: Option<Kmsg>) -> HarmState {
        if kmsg.is_none() {
            log::info!(
                target: "cudatrace::kmsg_off",
                "cudatrace: the kernel log (/dev/kmsg) cannot be read: the probe-harm breaker goes by faults and tenants alone, without the kernel's uprobe lines"
            );
        }
        HarmState {
            harms: HarmCounts::new(),
            suspected: HarmCounts::new(),
            judged: HashMap::new(),
            kmsg,
            scope: Scope::default(),
            mmap_min: harm::mmap_min_addr(),
            users: None,
        }
    }
}

/// Counts one more of `key` in `counts`, bounded.
fn count(counts: &mut HarmCounts, key: (String, &'static str, &'static str)) {
    if counts.len() < MAX_HARM_SERIES || counts.contains_key(&key) {
        *counts.entry(key).or_insert(0) += 1;
    }
}

/// The library whose probe the fault's thread hit last: by the tag in its cookie when exactly
/// one attached library has it, else the file mapped at the probed address, else the only
/// library attached; never the first that probes the api (a private copy's fault must not
/// trip the host's library).
fn library_of<'a>(
    libraries: &'a [LibraryProbes],
    f: &FaultEvent,
    mapped: Option<FileKey>,
) -> Option<&'a LibraryProbes> {
    let tag = library_tag(f.cookie);
    let tagged: Vec<&LibraryProbes> = libraries
        .iter()
        .filter(|l| tag != 0 && crate::probe::library::tag_of(l.file) == tag)
        .collect();
    if let [one] = tagged.as_slice() {
        return Some(one);
    }
    if let Some(key) = mapped {
        return libraries.iter().find(|l| l.file == key);
    }
    match libraries {
        [only] => Some(only),
        _ => None,
    }
}

impl Session {
    /// Judges one fault record; on harm, decides whether it is corroborated and acts on it.
    pub(super) fn fault(&mut self, f: FaultEvent, consumer: &mut impl Consumer) {
        // A tenant faulting in a loop (a SIGSEGV handler that returns to the fault) costs at most
        // MAX_JUDGED maps reads and lines; the rest are counted only.
        if self.harm.judged.len() >= MAX_FAULT_PIDS {
            self.harm.judged.clear();
        }
        let judged = self.harm.judged.entry(f.pid).or_insert(0);
        if *judged >= MAX_JUDGED {
            self.counts.own_faults += 1;
            return;
        }
        *judged += 1;
        let place = harm::judge(&f, harm::regions(f.pid).as_deref());
        let own = match place {
            None => Some("away from the probe"),
            Some(_) => harm::self_made(&f, self.harm.mmap_min),
        };
        let Some(place) = place.filter(|_| own.is_none()) else {
            self.counts.own_faults += 1;
            log::info!(
                target: "cudatrace::own_fault",
                pid = f.pid, signal = harm::signal_name(f.sig), code = f.code;
                "cudatrace: pid {} (tid {}) took {} (si_code {}) at {:#x}, {} µs after its last probe hit at {:#x}: {}, the workload's own",
                f.pid,
                f.tid,
                harm::signal_name(f.sig),
                f.code,
                f.pc,
                f.since_hit_ns / 1000,
                f.entry_ip,
                own.unwrap_or_default()
            );
            return;
        };
        let api = harm::api(&f);
        let mapped = std::fs::File::open(format!("/proc/{}/maps", f.pid))
            .ok()
            .and_then(|m| proc_maps::file_offset_of(m, f.entry_ip));
        let lib = library_of(
            &self.probes.libraries,
            &f,
            mapped.as_ref().map(|(m, _)| (m.dev, m.inode)),
        )
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
            tenant: self.tenant_of(f.pid),
            basis: None,
        };
        self.decide_on_harm(h, key, consumer);
    }

    /// The tenant of `pid` as the breaker counts them: from what was read when it was admitted,
    /// else from /proc now.
    fn tenant_of(&self, pid: u32) -> String {
        match self.registry.get(pid) {
            Some(p) => Tenant::unit(p.identity.cgroup.as_deref()),
            None => Tenant::unit_of_pid(pid),
        }
        .as_str()
        .to_owned()
    }

    /// The tenants whose live traced processes other than `except` map the library `key`.
    fn users_of(&mut self, key: FileKey, except: u32) -> Vec<String> {
        if let Some((k, at, users)) = &self.harm.users {
            if *k == key && at.elapsed() < USERS_FRESH {
                return users.clone();
            }
        }
        let mut users: Vec<String> = self
            .registry
            .iter()
            .filter(|p| p.exited_at.is_none() && p.pid != except)
            .filter(|p| {
                std::fs::File::open(format!("/proc/{}/maps", p.pid))
                    .map(proc_maps::libcuda_mappings)
                    .unwrap_or_default()
                    .iter()
                    .any(|m| (m.dev, m.inode) == key)
            })
            .map(|p| {
                Tenant::unit(p.identity.cgroup.as_deref())
                    .as_str()
                    .to_owned()
            })
            .collect();
        users.sort();
        users.dedup();
        self.harm.users = Some((key, Instant::now(), users.clone()));
        users
    }

    /// A judged harm: corroborated (the breaker opens) or suspected (the probes stay).
    fn decide_on_harm(&mut self, mut h: Harm, key: Option<FileKey>, consumer: &mut impl Consumer) {
        let way = match h.place {
            harm::Place::AtSite | harm::Place::PastEntry(_) => "entry",
            harm::Place::Xol => "xol",
            harm::Place::Outside => "outside",
            harm::Place::KernelLog => "kernel_log",
        };
        let line = h.line();
        let fault = |key| Fault {
            key,
            tenant: &h.tenant,
            way,
            evidence: &line,
        };
        let decision = match key {
            // Which library is not known: nothing to open; suspected (kept under no file).
            None => Decision::Suspect {
                first: self.harm.scope.note(&fault((0, 0))),
            },
            Some(key) => {
                let users = self.users_of(key, h.pid);
                let half_open = self.probes.breaker.is_half_open(key);
                self.harm.scope.decide(&fault(key), &users, half_open)
            }
        };
        match decision {
            Decision::Trip(basis) => {
                h.basis = Some(basis);
                self.act_on_harm(h, key, consumer);
            }
            Decision::Suspect { first } => self.suspect(h, key.is_some(), first, consumer),
        }
    }

    /// A suspected harm: counted and said; the consumer told of the `first` of its tenant, way
    /// and library only; no probe is detached. `known`: whether its library is known.
    fn suspect(&mut self, h: Harm, known: bool, first: bool, consumer: &mut impl Consumer) {
        count(
            &mut self.harm.suspected,
            (h.library.clone(), h.symbol, h.signal),
        );
        log::warn!(
            target: "cudatrace::probe_harm_suspected",
            pid = h.pid, symbol = h.symbol, signal = h.signal, library = h.library.as_str(), tenant = h.tenant.as_str();
            "cudatrace: probe harm suspected, not corroborated: {}; {}, so no probe is detached (a second tenant faulting the same way, or the kernel's uprobe log, opens its breaker){}",
            crate::text::printable(&h.line()),
            if known {
                format!("other tenants use {}", crate::text::printable(&h.library))
            } else {
                "which library it was is not known".to_owned()
            },
            if first { "" } else { "; counted only, its tenant was alerted on already" }
        );
        if first {
            let process = self.registry.live_mut(h.pid);
            consumer.harm(&h, process);
        }
    }

    /// Lines of the kernel log that name a process the uprobe path failed in: harm too.
    pub(super) fn kernel_log(&mut self, consumer: &mut impl Consumer) {
        let lines = match self.harm.kmsg.as_mut() {
            Some(kmsg) => kmsg.poll(),
            None => return,
        };
        for k in lines {
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
                tenant: self.tenant_of(k.pid),
                basis: Some(Basis::KernelLog),
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
        count(
            &mut self.harm.harms,
            (h.library.clone(), h.symbol, h.signal),
        );
        let evidence = match &h.basis {
            Some(b) => format!("{}; {}", h.line(), b.describe()),
            None => h.line(),
        };
        let detached = match key {
            Some(key) => {
                let kernel = self.probes.kernel_release().to_owned();
                self.probes
                    .breaker
                    .trip(&h.library, key, evidence.clone(), &kernel);
                self.probes.detach_library(key)
            }
            None => false,
        };
        log::error!(
            target: "cudatrace::probe_harm",
            pid = h.pid, symbol = h.symbol, signal = h.signal, library = h.library.as_str();
            "cudatrace: probe harm: {}; breaker open for {}{}",
            crate::text::printable(&evidence),
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
        &self.harm.harms
    }

    /// Suspected harms counted so far, likewise.
    pub fn harms_suspected(&self) -> &HarmCounts {
        &self.harm.suspected
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
