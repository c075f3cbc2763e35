//! Discovery's hooks in the dynamic loaders, for kernels whose open path cannot be probed: the
//! loader program on this process's own loader first (whether the kernel takes the hook at
//! all), the exec hook that says which executed files are new (with the offsets it reads
//! through, from the kernel's BTF), and the `sys_enter` program loaded, not attached, for when
//! loaders overflow ([`Loaders`]).
use std::os::fd::AsFd as _;

use anyhow::{anyhow, Context as _, Result};
use aya::{
    maps::{Array, HashMap, MapData},
    programs::RawTracePoint,
};
use tracer_common::{
    names::{EXEC_TRACEPOINT, MAP_EXEC_CONFIG, MAP_EXES, PROG_EXEC},
    opens::{
        ExeKey, EXEC_BPRM_FILE, EXEC_FILE_INODE, EXEC_INODE_INO, EXEC_INODE_SB, EXEC_READY,
        EXEC_SB_DEV, LOADER_SYMBOL,
    },
};

use super::{
    btf,
    discovery::loaders::{Loaders, Syscalls},
    loader::{take, Probes},
};

impl Probes {
    /// Hooks this process's loader and attaches the exec hook; the error says why the kernel
    /// cannot. `CUDATRACE_LOADER_SYMBOL` names another function to hook (a test names one that
    /// does not exist, to see the fallback).
    pub(super) fn watch_loaders(&mut self) -> Result<Loaders> {
        let symbol =
            std::env::var("CUDATRACE_LOADER_SYMBOL").unwrap_or_else(|_| LOADER_SYMBOL.to_owned());
        let prog = self.discovery.take_loaded().map_err(|e| anyhow!(e))?;
        let offsets = btf::exec_offsets().context(
            "the kernel's BTF does not say where an executed file's inode is (no /sys/kernel/btf/vmlinux?)",
        )?;
        let mut loaders = Loaders::new(prog, symbol);
        loaders.watch_own().map_err(|e| anyhow!(e))?;
        let mut config: Array<MapData, u64> = take(&mut self.ebpf, MAP_EXEC_CONFIG)?;
        let slots = [
            EXEC_BPRM_FILE,
            EXEC_FILE_INODE,
            EXEC_INODE_INO,
            EXEC_INODE_SB,
            EXEC_SB_DEV,
        ];
        for (slot, offset) in slots.into_iter().zip(offsets) {
            config.set(slot, offset as u64, 0)?;
        }
        config.set(EXEC_READY, 1, 0)?;
        let exes: HashMap<MapData, ExeKey, u8> = take(&mut self.ebpf, MAP_EXES)?;
        let exec: &mut RawTracePoint = self
            .ebpf
            .program_mut(PROG_EXEC)
            .context("eBPF object lacks program cuda_exec")?
            .try_into()?;
        exec.load()
            .context("the kernel refused eBPF program cuda_exec")?;
        exec.attach(EXEC_TRACEPOINT)
            .with_context(|| format!("cannot attach to the raw tracepoint {EXEC_TRACEPOINT}"))?;
        let syscalls = self.syscalls_for_overflow();
        if let Err(e) = &syscalls {
            log::warn!(
                "cudatrace: past {} dynamic loaders, discovery will rely on full passes: {e:#}",
                super::discovery::loaders::MAX_LOADERS
            );
        }
        loaders.overflow_to(Some(exes), syscalls.ok());
        Ok(loaders)
    }

    /// The `sys_enter` program, loaded, for [`Loaders`] to attach if loaders overflow.
    fn syscalls_for_overflow(&mut self) -> Result<Syscalls> {
        let (prog, tracepoint) = self.syscalls_program()?;
        let fd = prog.fd()?.as_fd().try_clone_to_owned()?;
        Ok(Syscalls {
            prog: fd,
            tracepoint,
        })
    }
}
