//! Loads the eBPF object and attaches one entry and one return probe per exported entry point of
//! each library, reporting per symbol what was attached and what the library does not export.
use std::{
    collections::HashSet,
    fmt::Write as _,
    num::NonZeroU32,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result, bail};
use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, MapData},
    programs::{
        RawTracePoint, UProbe,
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeScope},
    },
};
use tracer_common::{Api, CONFIG_ENABLED, CONFIG_WAKEUP_BYTES, Filter, Layout};

use crate::symbols::{self, Resolution};

/// The compiled eBPF programs, embedded at build time.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/tracer"));

const ENTRY_LAUNCH: &str = "cuda_launch";
const ENTRY_LAUNCH_EX: &str = "cuda_launch_ex";
const ENTRY_REGS: &str = "cuda_regs";
const RETURN: &str = "cuda_ret";
const EXIT: &str = "cuda_exit";

/// What was attached in one library.
#[derive(Debug, Clone)]
pub struct LibraryProbes {
    /// The library as given (or found).
    pub path: PathBuf,
    /// Symbols resolved in the library, with their aliases and absentees.
    pub resolution: Resolution,
}

/// The loaded programs; dropping it detaches every probe.
pub struct Tracer {
    /// The loaded object; its programs hold the links.
    pub ebpf: Ebpf,
    /// Libraries attached so far, in order.
    pub libraries: Vec<LibraryProbes>,
    scope: UProbeScope,
    seen: HashSet<(u64, u64)>,
}

/// Loads the programs, sizing the ring buffer to `ringbuf_bytes`.
pub fn load(ringbuf_bytes: u32, pid: Option<u32>) -> Result<Tracer> {
    let mut ebpf = EbpfLoader::new()
        .map_max_entries("EVENTS", ringbuf_bytes)
        .load(EBPF_OBJECT)
        .context("cannot load the eBPF programs (is BPF enabled in this kernel, and are you root?)")?;
    let exit: &mut RawTracePoint =
        ebpf.program_mut(EXIT).context("eBPF object lacks program cuda_exit")?.try_into()?;
    exit.load().context("the kernel refused eBPF program cuda_exit")?;
    // A raw tracepoint needs no tracefs; it is attached by name.
    exit.attach("sched_process_exit").context("cannot attach to sched_process_exit")?;
    for name in [ENTRY_LAUNCH, ENTRY_LAUNCH_EX, ENTRY_REGS, RETURN] {
        let prog: &mut UProbe = ebpf
            .program_mut(name)
            .with_context(|| format!("eBPF object lacks program {name}"))?
            .try_into()?;
        prog.load().with_context(|| format!("the kernel refused eBPF program {name}"))?;
    }
    let scope = match pid.and_then(NonZeroU32::new) {
        Some(pid) => UProbeScope::OneProcess(pid),
        None => UProbeScope::AllProcesses,
    };
    Ok(Tracer { ebpf, libraries: Vec::new(), scope, seen: HashSet::new() })
}

impl Tracer {
    /// Attaches every exported entry point of `path`. Returns `Ok(None)` when this very file
    /// (same device and inode) is attached already; an error when it cannot be read or exports
    /// none of the entry points.
    pub fn attach_library(&mut self, path: &Path) -> Result<Option<&LibraryProbes>> {
        let meta = std::fs::metadata(path).map_err(|e| {
            anyhow::anyhow!(
                "library not found: {} ({e}); pass the path of a libcuda.so.1 with --lib \
                 (`ldconfig -p | grep libcuda` lists the host's)",
                path.display()
            )
        })?;
        use std::os::unix::fs::MetadataExt as _;
        if !self.seen.insert((meta.dev(), meta.ino())) {
            return Ok(None);
        }
        let resolution = symbols::resolve(path)?;
        if resolution.found.is_empty() {
            bail!(
                "{} exports none of the CUDA driver entry points cudatrace probes: is it a libcuda.so.1?",
                path.display()
            );
        }
        for r in &resolution.found {
            let entry = match r.api.info().layout {
                Layout::Launch => ENTRY_LAUNCH,
                Layout::LaunchEx => ENTRY_LAUNCH_EX,
                Layout::Regs => ENTRY_REGS,
            };
            for program in [entry, RETURN] {
                let prog: &mut UProbe = self.ebpf.program_mut(program).expect("loaded above").try_into()?;
                let point = UProbeAttachPoint {
                    location: UProbeAttachLocation::AbsoluteOffset(r.offset),
                    cookie: Some(r.api.cookie()),
                };
                prog.attach(point, path, self.scope).with_context(|| {
                    format!("cannot attach {program} to {} in {}", r.api.symbol(), path.display())
                })?;
            }
        }
        self.libraries.push(LibraryProbes { path: path.to_path_buf(), resolution });
        Ok(self.libraries.last())
    }

    /// Starts or stops recording: the entry programs save nothing while disabled.
    pub fn set_enabled(&mut self, on: bool) -> Result<()> {
        self.set_config(CONFIG_ENABLED, u32::from(on))
    }

    /// Sets how many bytes wait in the ring buffer before the reader is woken (0: every record).
    pub fn set_wakeup_bytes(&mut self, bytes: u32) -> Result<()> {
        self.set_config(CONFIG_WAKEUP_BYTES, bytes)
    }

    fn set_config(&mut self, index: u32, value: u32) -> Result<()> {
        let mut config: Array<&mut MapData, u32> =
            Array::try_from(self.ebpf.map_mut("CONFIG").context("CONFIG map missing")?)?;
        config.set(index, value, 0)?;
        Ok(())
    }

    /// Sets the in-kernel filter (before recording starts).
    pub fn set_filter(&mut self, filter: Filter) -> Result<()> {
        let mut map: Array<&mut MapData, Filter> =
            Array::try_from(self.ebpf.map_mut("FILTER").context("FILTER map missing")?)?;
        map.set(0, filter, 0)?;
        Ok(())
    }

    /// Detaches every probe without making the caller wait for it.
    ///
    /// Removing a uprobe waits for RCU grace periods, one probe after another under a kernel
    /// mutex: about 0.1 s a probe here, ten seconds for a full libcuda. A forked child inherits
    /// the probes' file descriptors and exits at once; the kernel removes the probes as it closes
    /// the child's descriptors, while this process, holding no last reference, exits promptly.
    /// The programs were disabled before, so the probes record nothing meanwhile.
    pub fn detach_in_background(self) {
        // SAFETY: the child only calls _exit, which is async-signal-safe.
        match unsafe { libc::fork() } {
            0 => unsafe { libc::_exit(0) },
            -1 => drop(self),
            _ => std::mem::forget(self),
        }
    }

    /// Number of probes (entry plus return) attached in all libraries.
    pub fn probe_count(&self) -> usize {
        self.libraries.iter().map(|l| l.resolution.found.len() * 2).sum()
    }
}

/// One line per library: attached symbols, aliases and the entry points it does not export.
pub fn report(lib: &LibraryProbes) -> String {
    let r = &lib.resolution;
    let mut s = format!(
        "{}: attached {} of {} entry points",
        lib.path.display(),
        r.found.len(),
        Api::ALL.len()
    );
    if !r.aliases.is_empty() {
        let aliases: Vec<String> =
            r.aliases.iter().map(|(a, b)| format!("{}={}", a.symbol(), b.symbol())).collect();
        let _ = write!(s, "; same code as an attached one: {}", aliases.join(" "));
    }
    if !r.missing.is_empty() {
        let missing: Vec<&str> = r.missing.iter().map(|a| a.symbol()).collect();
        let _ = write!(s, "; not exported: {}", missing.join(" "));
    }
    s
}
