//! `cudatrace census`'s probes: a count-only entry probe on every exported `cu*` function of
//! each library (uprobe_multi where the kernel has it, else classic uprobes), counted per
//! process in the kernel; nothing is recorded per call.
use std::{
    io::Read as _,
    os::fd::{AsRawFd as _, OwnedFd},
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result};
use aya::{
    maps::HashMap as BpfHashMap,
    programs::{
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeScope},
        UProbe,
    },
    Ebpf, EbpfLoader,
};
use tracer_common::{names::MAP_CENSUS, names::PROG_CENSUS, Api, CensusKey};

use super::{loader::EBPF_OBJECT, multi, symbols};

/// One exported symbol probed.
#[derive(Clone, Debug)]
pub struct Symbol {
    /// Its name.
    pub name: String,
    /// Whether cudatrace's tracing probes it.
    pub traced: bool,
}

/// The census probes, attached.
pub struct Census {
    ebpf: Ebpf,
    _links: Vec<OwnedFd>,
    /// Every symbol probed; a count's `symbol` indexes it.
    pub symbols: Vec<Symbol>,
    /// `uprobe_multi` or `classic`.
    pub how: &'static str,
}

/// Calls of one symbol by one process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Count {
    /// Process id.
    pub pid: u32,
    /// Index into [`Census::symbols`].
    pub symbol: usize,
    /// Calls.
    pub calls: u64,
}

impl Census {
    /// Loads the census program and attaches it to every exported `cu*` function of `libs`
    /// (for process `pid` only, when given).
    pub fn attach(libs: &[PathBuf], pid: Option<u32>) -> Result<Census> {
        let mut ebpf = EbpfLoader::new().load(EBPF_OBJECT).context(
            "cannot load the eBPF programs (is BPF enabled in this kernel, and are you root?)",
        )?;
        let traced: std::collections::HashSet<&str> = Api::ALL.iter().map(|a| a.symbol()).collect();
        let mut symbols = Vec::new();
        let mut targets = Vec::new();
        // One line each, saying what to do (the errors' own sources are in their messages).
        let what_to_do = |e: &dyn std::fmt::Display| {
            anyhow::anyhow!("{e}: name the libcuda to count with --lib PATH")
        };
        for lib in libs {
            let (mut file, _) = symbols::open(lib).map_err(|e| what_to_do(&e))?;
            let mut data = Vec::new();
            (&mut file)
                .take(symbols::MAX_LIBRARY_BYTES)
                .read_to_end(&mut data)
                .map_err(|e| what_to_do(&e))?;
            let found = symbols::exported_cu(&data, lib).map_err(|e| what_to_do(&e))?;
            if !found.iter().any(|(name, _)| traced.contains(name.as_str())) {
                return Err(what_to_do(&format!(
                    "{} exports none of the driver's entry points cudatrace traces (it is no libcuda)",
                    shown(lib)
                )));
            }
            let first = symbols.len() as u64;
            symbols.extend(found.iter().map(|(name, _)| Symbol {
                name: name.clone(),
                traced: traced.contains(name.as_str()),
            }));
            let offsets: Vec<u64> = found.iter().map(|(_, o)| *o).collect();
            targets.push((lib.clone(), file, offsets, first));
        }
        let mut links = Vec::new();
        let how = match multi::load_program(EBPF_OBJECT, &ebpf, PROG_CENSUS) {
            Ok(prog) => {
                for (lib, file, offsets, first) in &targets {
                    let cookies: Vec<u64> = (0..offsets.len() as u64).map(|i| first + i).collect();
                    let path = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
                    links.push(multi::link(
                        &prog,
                        PROG_CENSUS,
                        &path,
                        lib,
                        offsets,
                        &cookies,
                        multi::Mode::Entry,
                        pid,
                    )?);
                }
                "uprobe_multi"
            }
            Err(e) if e.unsupported() => {
                classic(&mut ebpf, &targets, pid)?;
                "classic"
            }
            Err(e) => return Err(e.into()),
        };
        Ok(Census {
            ebpf,
            _links: links,
            symbols,
            how,
        })
    }

    /// The counts so far, by process and symbol.
    pub fn counts(&self) -> Result<Vec<Count>> {
        let map: BpfHashMap<_, CensusKey, u64> = BpfHashMap::try_from(
            self.ebpf
                .map(MAP_CENSUS)
                .context("eBPF object lacks map CENSUS")?,
        )?;
        Ok(map
            .iter()
            .filter_map(Result::ok)
            .filter(|(k, _)| (k.symbol as usize) < self.symbols.len())
            .map(|(k, calls)| Count {
                pid: k.pid,
                symbol: k.symbol as usize,
                calls,
            })
            .collect())
    }
}

/// Classic perf-event uprobes, one per symbol (kernels before 6.6).
fn classic(
    ebpf: &mut Ebpf,
    targets: &[(PathBuf, std::fs::File, Vec<u64>, u64)],
    pid: Option<u32>,
) -> Result<()> {
    let prog: &mut UProbe = ebpf
        .program_mut(PROG_CENSUS)
        .context("eBPF object lacks program cuda_census")?
        .try_into()?;
    prog.load()
        .context("the kernel refused eBPF program cuda_census")?;
    let scope = match pid.and_then(std::num::NonZeroU32::new) {
        Some(p) => UProbeScope::OneProcess(p),
        None => UProbeScope::AllProcesses,
    };
    for (lib, file, offsets, first) in targets {
        let path = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
        for (i, offset) in offsets.iter().enumerate() {
            let point = UProbeAttachPoint {
                location: UProbeAttachLocation::AbsoluteOffset(*offset),
                cookie: Some(first + i as u64),
            };
            prog.attach(point, &path, scope)
                .with_context(|| format!("cannot attach the census probe in {}", shown(lib)))?;
        }
    }
    Ok(())
}

fn shown(p: &Path) -> String {
    crate::text::printable(&p.display().to_string()).into_owned()
}
