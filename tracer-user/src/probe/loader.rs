//! Loads the eBPF object, takes a typed handle to every map, and attaches one entry and one return
//! probe per exported entry point of each library, reporting per symbol what was attached and
//! what the library does not export.
use std::{
    collections::HashSet,
    num::NonZeroU32,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result};
use aya::{
    maps::{MapData, RingBuf},
    programs::{
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeScope},
        RawTracePoint, UProbe,
    },
    Ebpf, EbpfLoader,
};
use tracer_common::{
    names::{
        MAP_EVENTS, PROG_EXIT, PROG_FAULT, PROG_LAUNCH, PROG_LAUNCH_EX, PROG_REGS, PROG_RENAME,
        PROG_RETURN,
    },
    Layout,
};

pub use super::bpf_maps::{Drops, Maps, ProcessDrops, DROP_REASONS};
pub use super::library::{report, LibraryProbes, ProbeRow};
use super::{
    allow::AllowList,
    breaker::Breaker,
    discovery::{FileKey, Prepared, Settled},
    ebpf_log::{LogLevel, StderrLog},
    error::{open_library, AttachError},
    guard::Guard,
    multi::{MultiError, MultiPrograms},
    sites::SiteCounts,
    slots::Slots,
    symbols::{self, Resolution},
};

/// The compiled eBPF programs, embedded at build time.
pub(crate) static EBPF_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/tracer"));
/// How probes are attached.
pub(super) enum Attach {
    /// uprobe_multi links, per library: needs CAP_BPF and CAP_PERFMON only, and closing them
    /// detaches at once.
    Multi {
        /// The uprobe programs, loaded for uprobe_multi.
        programs: MultiPrograms,
        /// Each attached library's links.
        links: Vec<super::windows::LibraryLinks>,
    },
    /// Classic perf-event uprobes (kernels before 6.6), held by aya's programs.
    Classic,
}

/// The loaded programs and their maps; dropping it detaches every probe.
pub struct Probes {
    /// The loaded object; its programs hold the classic links and the exit tracepoint.
    pub(super) ebpf: Ebpf,
    pub(super) attach: Attach,
    /// The maps user space reads and writes.
    pub maps: Maps,
    /// The ring buffer, until the reader takes it.
    ring: Option<RingBuf<MapData>>,
    /// Libraries attached so far, in order.
    pub libraries: Vec<LibraryProbes>,
    scope: UProbeScope,
    /// Which files may be attached.
    slots: Slots,
    /// Reader of the programs' aya-log records (none with `--log-level off`).
    log: Option<aya_log::EbpfLogger<StderrLog>>,
    /// Which probe sites may be attached on this kernel.
    guard: Guard,
    /// Libraries whose probes harmed a process: never attached again until cleared.
    pub breaker: Breaker,
    /// Discovery's programs for multi links (the open path's, the loaders'), or why not.
    pub(super) discovery: super::opens::Programs,
    /// The pair's windows (`super::windows`).
    pub(super) windows: super::windows::Windows,
}

pub(super) fn take<T: TryFrom<aya::maps::Map, Error = aya::maps::MapError>>(
    ebpf: &mut Ebpf,
    name: &str,
) -> Result<T> {
    let map = ebpf
        .take_map(name)
        .with_context(|| format!("eBPF object lacks map {name}"))?;
    T::try_from(map).with_context(|| format!("map {name} is not of the expected type"))
}

/// Loads the programs, sizing the ring buffer to `ringbuf_bytes`; they log up to `log_level`.
pub fn load(
    ringbuf_bytes: u32,
    pid: Option<u32>,
    log_level: LogLevel,
    max_libraries: usize,
) -> Result<Probes> {
    let level = log_level.aya();
    let mut ebpf = EbpfLoader::new()
        .map_max_entries(MAP_EVENTS, ringbuf_bytes)
        // A load-time constant: the verifier removes the logging of disabled levels.
        .override_global("AYA_LOG_LEVEL", &level, true)
        .load(EBPF_OBJECT)
        .context("cannot load the eBPF programs (is BPF enabled in this kernel, and are you root?)")?;
    let exit: &mut RawTracePoint = ebpf
        .program_mut(PROG_EXIT)
        .context("eBPF object lacks program cuda_exit")?
        .try_into()?;
    exit.load()
        .context("the kernel refused eBPF program cuda_exit")?;
    // A raw tracepoint needs no tracefs; it is attached by name.
    exit.attach("sched_process_exit")
        .context("cannot attach to sched_process_exit")?;
    let rename: &mut RawTracePoint = ebpf
        .program_mut(PROG_RENAME)
        .context("eBPF object lacks program cuda_rename")?
        .try_into()?;
    rename
        .load()
        .context("the kernel refused eBPF program cuda_rename")?;
    rename
        .attach("task_rename")
        .context("cannot attach to task_rename")?;
    // The harm check's fault hook: a kernel that refuses it (no BTF task helpers) traces on,
    // without it, and says so.
    let fault_hook = attach_fault_hook(&mut ebpf);
    if let Err(e) = &fault_hook {
        log::warn!(
            "cudatrace: the probe-harm check is off: {e:#} (faults of traced threads are not examined)"
        );
    }
    // uprobe_multi (with sessions for launches where the kernel has them) unless asked for
    // classic uprobes or the pair (CUDATRACE_ATTACH=classic or pair, which the tests use to keep
    // the fallbacks exercised); the programs are loaded while every map is in `ebpf`.
    let asked = std::env::var("CUDATRACE_ATTACH").unwrap_or_default();
    let attach = if asked == "classic" {
        load_classic(&mut ebpf)?
    } else {
        match MultiPrograms::load(EBPF_OBJECT, &ebpf, asked == "pair") {
            Ok(programs) => Attach::Multi {
                programs: super::session::say(programs),
                links: Vec::new(),
            },
            Err(e) if e.unsupported() => fall_back(&mut ebpf, &e)?,
            Err(e) => return Err(e.into()),
        }
    };
    let scope = match pid.and_then(NonZeroU32::new) {
        Some(pid) => UProbeScope::OneProcess(pid),
        None => UProbeScope::AllProcesses,
    };
    // Loaded while every map is in `ebpf`; attached only if discovery watches the opens.
    let discovery = super::opens::Programs::load(EBPF_OBJECT, &ebpf);
    let maps = Maps::take(&mut ebpf)?;
    let ring = Some(take(&mut ebpf, MAP_EVENTS)?);
    let log = match log_level {
        LogLevel::Off => None,
        level => Some(
            aya_log::EbpfLogger::init_with_logger(&mut ebpf, StderrLog::new(level))
                .context("cannot read the eBPF programs' log")?,
        ),
    };
    Ok(Probes {
        ebpf,
        attach,
        maps,
        ring,
        libraries: Vec::new(),
        scope,
        slots: Slots::new(max_libraries),
        log,
        guard: Guard::running(false),
        breaker: Breaker::default(),
        windows: Default::default(),
        discovery,
    })
}

/// Loads and attaches the `signal_generate` program of the harm check.
fn attach_fault_hook(ebpf: &mut Ebpf) -> Result<()> {
    let fault: &mut RawTracePoint = ebpf
        .program_mut(PROG_FAULT)
        .context("eBPF object lacks program cuda_fault")?
        .try_into()?;
    fault
        .load()
        .context("the kernel refused eBPF program cuda_fault")?;
    fault
        .attach("signal_generate")
        .context("cannot attach to signal_generate")?;
    Ok(())
}

/// Loads aya's uprobe programs for classic perf-event uprobes.
fn load_classic(ebpf: &mut Ebpf) -> Result<Attach> {
    for name in [PROG_LAUNCH, PROG_LAUNCH_EX, PROG_REGS, PROG_RETURN] {
        let prog: &mut UProbe = ebpf
            .program_mut(name)
            .with_context(|| format!("eBPF object lacks program {name}"))?
            .try_into()?;
        prog.load()
            .with_context(|| format!("the kernel refused eBPF program {name}"))?;
    }
    Ok(Attach::Classic)
}

/// Says once why uprobe_multi is not used, then loads for classic uprobes.
fn fall_back(ebpf: &mut Ebpf, why: &MultiError) -> Result<Attach> {
    log::warn!(
        "cudatrace: uprobe_multi links are not available ({why}; they need Linux 6.6 or later): using classic \
         uprobes, which need CAP_SYS_ADMIN on kernels with the 2025 perf_uprobe_event_init fix"
    );
    load_classic(ebpf)
}

impl Probes {
    /// Attaches every exported entry point of `path`. Returns `Ok(None)` when this very file
    /// (same device and inode) is attached or refused already; an error when it cannot be read
    /// or exports none of the entry points.
    pub fn attach_library(&mut self, path: &Path) -> Result<Option<&LibraryProbes>, AttachError> {
        let (file, meta) = open_library(path)?;
        if !self.slots.admit(path, &meta, None)? {
            return Ok(None);
        }
        let resolution = symbols::resolve(&file, path)?;
        self.attach_resolved(path, &file, resolution)
    }

    /// Attaches a library discovery opened and read (see [`Probes::attach_library`]); it takes
    /// one of the `max_libraries` slots unless `--lib-allow` names it.
    pub fn attach_prepared(&mut self, p: Prepared) -> Result<Option<&LibraryProbes>, AttachError> {
        if !self.slots.admit(&p.path, &p.meta, Some(&p.holder))? {
            return Ok(None);
        }
        // Unread when `--lib-allow` did not name it then, and names it now (its globs were
        // expanded again): read now, bounded as in discovery.
        let resolution = match p.resolution {
            Some(r) => r,
            None => symbols::resolve(&p.file, &p.path)?,
        };
        self.attach_resolved(&p.path, &p.file, resolution)
    }

    /// Whether a discovered library's holder exited since last asked (a full pass tells
    /// whether anyone maps it still).
    pub fn holder_gone(&mut self) -> bool {
        self.slots.holder_gone()
    }

    /// Whether the slots are in demand (a holder's exit may then free one for a waiting file).
    pub fn slots_in_demand(&self) -> bool {
        self.slots.in_demand()
    }

    /// Files attached or refused, not opened again, and `--lib-allow`'s files: what discovery
    /// is told.
    pub fn settled(&self) -> Settled {
        Settled {
            skip: self.slots.settled(),
            allowed: self.slots.allowed(),
        }
    }

    /// Detaches the discovered libraries no process maps any more (`mapped`: every libcuda file
    /// mapped now), giving back their slots; returns them. uprobe_multi links only: classic
    /// uprobes stay until cudatrace exits.
    pub fn release_unmapped(&mut self, mapped: &HashSet<FileKey>) -> Vec<LibraryProbes> {
        let Attach::Multi { links, .. } = &mut self.attach else {
            return Vec::new();
        };
        let mut gone = Vec::new();
        let mut i = 0;
        while i < self.libraries.len() {
            let key = self.libraries[i].file;
            if mapped.contains(&key) || self.slots.kept(&key) {
                i += 1;
                continue;
            }
            // Closing the links detaches the probes (on the closer's thread: the kernel waits
            // for a grace period per link, which would stall the loop).
            super::multi::close_later(links.remove(i).into_fds());
            self.slots.release(&key);
            gone.push(self.libraries.remove(i));
        }
        gone
    }

    /// Detaches every probe of the library `key` (its breaker opened); `false` when it is not
    /// attached or its probes are classic uprobes, which stay until cudatrace exits (the
    /// programs then record nothing of it: its calls are dropped in user space).
    pub fn detach_library(&mut self, key: FileKey) -> bool {
        let Attach::Multi { links, .. } = &mut self.attach else {
            return false;
        };
        let Some(i) = self.libraries.iter().position(|l| l.file == key) else {
            return false;
        };
        // Closed here, at once, not on the closer's thread: a probe that harmed a process must
        // be gone before another process can run into it (this waits for the kernel's grace
        // periods, which is rare: a breaker opens once per library).
        drop(links.remove(i));
        self.libraries.remove(i);
        true
    }

    /// Attaches the entry points `resolution` found in the open `file`.
    fn attach_resolved(
        &mut self,
        path: &Path,
        file: &std::fs::File,
        mut resolution: Resolution,
    ) -> Result<Option<&LibraryProbes>, AttachError> {
        if resolution.found.is_empty() {
            return Err(AttachError::NotLibcuda {
                path: path.display().to_string(),
            });
        }
        let key = super::library::file_key(file).map_err(|e| AttachError::Kernel(e.into()))?;
        self.breaker.refuse(path, key)?;
        resolution.set_tag(super::library::tag_of(key));
        let sites = self.guard.apply(path, file, &mut resolution);
        if resolution.found.is_empty() {
            return Err(AttachError::AllRefused {
                path: path.display().to_string(),
                why: format!(
                    "{} sites refused on kernel {}",
                    sites.refused, self.guard.kernel.release
                ),
            });
        }
        self.attach_entry_points(path, file, resolution, sites)
            .map_err(AttachError::Kernel)
    }

    /// Sets which sites may be attached (from `--allow-stepped-probes`) and says the known-bad
    /// rows that apply; before the first library is attached.
    pub fn set_guard(&mut self, guard: Guard) {
        guard.say_rows();
        self.guard = guard;
    }

    /// The running kernel's release.
    pub fn kernel_release(&self) -> &str {
        &self.guard.kernel.release
    }

    /// [`Probes::attach_resolved`] once the library is known to export entry points; what fails
    /// here is the kernel's (or the eBPF object's) answer.
    fn attach_entry_points(
        &mut self,
        path: &Path,
        file: &std::fs::File,
        resolution: Resolution,
        sites: SiteCounts,
    ) -> Result<Option<&LibraryProbes>> {
        use std::os::unix::fs::MetadataExt as _;
        let meta = file.metadata()?;
        let key = (meta.dev(), meta.ino());
        // The kernel probes the inode this descriptor holds: the one just read.
        use std::os::fd::AsRawFd as _;
        let probe_path = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
        if let Attach::Multi { programs, links } = &mut self.attach {
            let pid = match self.scope {
                UProbeScope::OneProcess(pid) => Some(pid.get()),
                _ => None,
            };
            match programs.attach(&probe_path, path, &resolution.found, pid) {
                Ok(new) => {
                    let found = &resolution.found;
                    links.push(super::windows::links(
                        programs, new, file, path, found, pid,
                    )?);
                    self.libraries
                        .push(LibraryProbes::new(path, resolution, key, sites));
                    return Ok(self.libraries.last());
                }
                // A kernel that loads the programs but has no uprobe_multi links (before 6.6).
                Err(e) if e.unsupported() && self.libraries.is_empty() => {
                    self.attach = fall_back(&mut self.ebpf, &e)?;
                }
                Err(e) => return Err(e.into()),
            }
        }
        for r in &resolution.found {
            let entry = match r.api.info().layout {
                Layout::Launch => PROG_LAUNCH,
                Layout::LaunchEx => PROG_LAUNCH_EX,
                Layout::Regs => PROG_REGS,
            };
            for program in [entry, PROG_RETURN] {
                let prog: &mut UProbe = self
                    .ebpf
                    .program_mut(program)
                    .expect("loaded above")
                    .try_into()?;
                let point = UProbeAttachPoint {
                    location: UProbeAttachLocation::AbsoluteOffset(r.offset),
                    cookie: Some(r.cookie()),
                };
                prog.attach(point, &probe_path, self.scope)
                    .with_context(|| {
                        format!(
                            "cannot attach {program} to {} in {}",
                            r.api.symbol(),
                            path.display()
                        )
                    })?;
            }
        }
        self.libraries
            .push(LibraryProbes::new(path, resolution, key, sites));
        Ok(self.libraries.last())
    }

    /// Prints what the programs logged since the last call.
    pub fn flush_log(&mut self) {
        if let Some(log) = self.log.as_mut() {
            log.flush();
        }
    }

    /// The ring buffer, handed to its reader once.
    pub fn take_ring(&mut self) -> Option<RingBuf<MapData>> {
        self.ring.take()
    }

    /// Restricts attaching to the files `allow` names.
    pub fn set_allow(&mut self, allow: AllowList) {
        self.slots.set_allow(allow);
    }

    /// Expands `--lib-allow` again (before a rescan attaches what it found).
    pub fn refresh_allow(&mut self) {
        self.slots.refresh_allow();
    }

    /// Libraries refused because `max_libraries` were attached.
    pub fn refused(&self) -> u64 {
        self.slots.refused()
    }

    /// Whether probes are uprobe_multi links (else classic perf-event uprobes).
    pub fn multi(&self) -> bool {
        matches!(self.attach, Attach::Multi { .. })
    }

    /// Detaches every probe without making the caller wait for it.
    ///
    /// uprobe_multi links go at once when closed. Removing a classic uprobe waits for RCU grace
    /// periods, one probe after another under a kernel mutex: about 0.1 s a probe here, ten
    /// seconds for a full libcuda. Then a forked child inherits the probes' file descriptors and
    /// exits at once; the kernel removes the probes as it closes the child's descriptors, while
    /// this process, holding no last reference, exits promptly. The programs were disabled
    /// before, so the probes record nothing meanwhile.
    pub fn detach_in_background(self) {
        if self.multi() {
            drop(self);
            return;
        }
        // SAFETY: the child only calls _exit, which is async-signal-safe.
        match unsafe { libc::fork() } {
            // SAFETY: _exit is async-signal-safe, as a forked child of a threaded process needs.
            0 => unsafe { libc::_exit(0) },
            -1 => drop(self),
            _ => std::mem::forget(self),
        }
    }
}

#[cfg(test)]
mod tests {
    use object::{Object, ObjectSymbol};
    use tracer_common::names::{MAPS, PROGRAMS};

    use super::EBPF_OBJECT;

    #[test]
    fn the_object_holds_every_map_and_program_tracer_common_names() {
        let file = object::File::parse(EBPF_OBJECT).expect("the embedded eBPF object is ELF");
        let names: Vec<&str> = file.symbols().filter_map(|s| s.name().ok()).collect();
        for name in MAPS.iter().chain(PROGRAMS.iter()) {
            assert!(
                names.contains(name),
                "{name} is not in the eBPF object; symbols: {names:?}"
            );
        }
    }
}
