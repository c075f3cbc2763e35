//! The open hook of discovery: the kernel names each process that opens a file named like
//! libcuda. First choice, a kprobe_multi link on the kernel's open path (`do_sys_openat2`): only
//! opens run it. Where the kernel cannot (no kprobes, the function renamed), hooks in the
//! dynamic loaders (`loader_hooks`): only loads and executions run them. Where those cannot
//! either (no uprobe_multi, no BTF), the `sys_enter` raw tracepoint, which every system call of
//! the node runs. Where nothing attaches, the caller polls.
use std::os::fd::OwnedFd;

use anyhow::{Context as _, Result};
use aya::{
    maps::{MapData, RingBuf},
    programs::{KProbe, RawTracePoint},
};
use tracer_common::names::{
    MAP_OPENS, OPENED_FUNCTION, OPENED_TRACEPOINT, PROG_LOADED, PROG_OPENED, PROG_OPENED_PATH,
};

use super::{
    discovery::loaders::Loaders,
    loader::{take, Probes},
    multi,
};

/// Discovery's programs for multi links: the open path's (kprobe_multi), loaded while every map
/// is in the object, and the object relocated then, from which the loaders' program
/// (uprobe_multi) is loaded only if the open path's cannot attach (its verification is the
/// costly one, and a kernel with kprobes never needs it).
pub struct Programs {
    pub(super) open_path: Result<OwnedFd, String>,
    object: Result<aya_obj::Object, String>,
}

impl Programs {
    /// Relocates `object` against `ebpf`'s maps and loads the open path's program.
    pub fn load(object: &[u8], ebpf: &aya::Ebpf) -> Programs {
        let object = multi::relocate(object, ebpf).map_err(|e| e.to_string());
        Programs {
            open_path: object.as_ref().map_err(Clone::clone).and_then(|o| {
                multi::load_kprobe_from(o, PROG_OPENED_PATH).map_err(|e| e.to_string())
            }),
            object,
        }
    }

    /// The loaders' program, loaded now (once: the relocated object is dropped).
    pub(super) fn take_loaded(&mut self) -> Result<OwnedFd, String> {
        let object = std::mem::replace(&mut self.object, Err("already taken".into()))?;
        multi::load_uprobe_from(&object, PROG_LOADED).map_err(|e| e.to_string())
    }

    /// Drops the relocated object (the open path's hook attached: no loader program needed).
    fn done(&mut self) {
        self.object = Err("not needed".into());
    }
}

/// Which hook names the processes that open a libcuda.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OpenHook {
    /// A kprobe on the kernel's open path: other system calls pay nothing.
    OpenPath(String),
    /// A uprobe on this function of every dynamic loader: only loads pay.
    Loaders(String),
    /// The `sys_enter` raw tracepoint: every system call of the node runs it.
    Syscalls(String),
}

impl OpenHook {
    /// How the hook is named in logs and metrics: `kprobe:FUNCTION` or `raw_tracepoint:NAME`.
    pub fn name(&self) -> String {
        match self {
            OpenHook::OpenPath(f) => format!("kprobe:{f}"),
            OpenHook::Loaders(f) => format!("uprobe:{f}"),
            OpenHook::Syscalls(t) => format!("raw_tracepoint:{t}"),
        }
    }
}

/// The attached open hook and the ring it writes to.
pub struct Opens {
    /// Where the hook writes each process that opened a libcuda.
    pub ring: RingBuf<MapData>,
    /// Which hook attached.
    pub hook: OpenHook,
    /// Why the open-path hook did not attach, when another did instead (said by the caller
    /// once it runs as its own uid).
    pub fell_back: Option<String>,
    /// The kprobe_multi link (the hook stays while it is held); none for the tracepoint, which
    /// aya's program holds.
    pub link: Option<OwnedFd>,
    /// The loader hooks, for the discovery thread to add to.
    pub loaders: Option<Loaders>,
}

impl Probes {
    /// Attaches the open hook of discovery, the open path's first; the error says why neither
    /// attaches. `CUDATRACE_OPENS_FUNCTION` and `CUDATRACE_OPENS_TRACEPOINT` name others (a
    /// test names ones that do not exist, to see each fallback).
    pub fn watch_opens(&mut self) -> Result<Opens> {
        let function = std::env::var("CUDATRACE_OPENS_FUNCTION")
            .unwrap_or_else(|_| OPENED_FUNCTION.to_owned());
        // A kprobe_multi link (fprobe) first, else a perf-event kprobe (aya's, held by its
        // program), else the tracepoint.
        let linked = match &self.discovery.open_path {
            Ok(prog) => {
                multi::kprobe_link(prog, PROG_OPENED_PATH, &function).map_err(|e| e.to_string())
            }
            Err(e) => Err(e.clone()),
        };
        let fell_back = match linked {
            Ok(link) => {
                self.discovery.done();
                return Ok(Opens {
                    ring: take(&mut self.ebpf, MAP_OPENS)?,
                    hook: OpenHook::OpenPath(function),
                    fell_back: None,
                    link: Some(link),
                    loaders: None,
                });
            }
            Err(multi) => match self.perf_kprobe(&function) {
                Ok(()) => {
                    self.discovery.done();
                    return Ok(Opens {
                        ring: take(&mut self.ebpf, MAP_OPENS)?,
                        hook: OpenHook::OpenPath(function),
                        fell_back: None,
                        link: None,
                        loaders: None,
                    });
                }
                Err(perf) => format!("kprobe {function}: {multi}; {perf:#}"),
            },
        };
        let fell_back = match self.watch_loaders() {
            Ok(loaders) => {
                return Ok(Opens {
                    ring: take(&mut self.ebpf, MAP_OPENS)?,
                    hook: OpenHook::Loaders(loaders.symbol().to_owned()),
                    fell_back: Some(fell_back),
                    link: None,
                    loaders: Some(loaders),
                });
            }
            Err(e) => format!("{fell_back}; loader hooks: {e:#}"),
        };
        let (prog, tracepoint) = self.syscalls_program()?;
        prog.attach(&tracepoint).with_context(|| {
            format!("{fell_back}; cannot attach to the raw tracepoint {tracepoint}")
        })?;
        Ok(Opens {
            ring: take(&mut self.ebpf, MAP_OPENS)?,
            hook: OpenHook::Syscalls(tracepoint),
            fell_back: Some(fell_back),
            link: None,
            loaders: None,
        })
    }

    /// The `sys_enter` program, loaded, and the raw tracepoint it goes on
    /// (`CUDATRACE_OPENS_TRACEPOINT` names another: a test names one that does not exist).
    pub(super) fn syscalls_program(&mut self) -> Result<(&mut RawTracePoint, String)> {
        let tracepoint = std::env::var("CUDATRACE_OPENS_TRACEPOINT")
            .unwrap_or_else(|_| OPENED_TRACEPOINT.to_owned());
        let prog: &mut RawTracePoint = self
            .ebpf
            .program_mut(PROG_OPENED)
            .context("eBPF object lacks program cuda_opened")?
            .try_into()?;
        prog.load()
            .context("the kernel refused eBPF program cuda_opened")?;
        Ok((prog, tracepoint))
    }

    /// The open-path program as a perf-event kprobe on `function` (kernels without fprobe).
    fn perf_kprobe(&mut self, function: &str) -> Result<()> {
        let prog: &mut KProbe = self
            .ebpf
            .program_mut(PROG_OPENED_PATH)
            .context("eBPF object lacks program cuda_opened_path")?
            .try_into()?;
        prog.load()
            .context("the kernel refused eBPF program cuda_opened_path")?;
        prog.attach(function, 0)
            .with_context(|| format!("no perf-event kprobe on {function} either"))?;
        Ok(())
    }
}
