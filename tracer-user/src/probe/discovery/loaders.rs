//! Discovery's loader hooks, where the kernel's open path cannot be probed: the `cuda_loaded`
//! program on `_dl_debug_state` of every dynamic loader the node's processes use (one
//! uprobe_multi link per loader file), so that only loads pay and no other system call does.
//! Loaders are found in the maps discovery reads: every process's at start, and each process
//! that executes a file not executed before (the exec hook). A loader is hooked once per file
//! (device and inode), at most [`MAX_LOADERS`] of them; past that (a tenant shipping loader after
//! loader), the `sys_enter` hook is attached as well, said once, so that nothing goes unseen.
use std::{
    collections::HashSet,
    os::fd::{AsRawFd as _, OwnedFd},
    path::Path,
    sync::{atomic::Ordering, Arc},
};

use aya::maps::{HashMap as BpfHashMap, MapData};
use tracer_common::{
    names::PROG_LOADED,
    opens::{ExeKey, LOADER_DEBUG_SYMBOL},
};

use super::{open_mapped, FileKey, Stats, Unmapped};
use crate::{
    probe::{multi, proc_maps::Mapping, symbols::debug_state::debug_state},
    text::printable,
};

/// Loader files hooked or refused at most; past it the `sys_enter` hook runs as well.
pub const MAX_LOADERS: usize = 64;

/// The `sys_enter` hook, loaded but not attached, for when loaders overflow.
pub struct Syscalls {
    /// The loaded program.
    pub prog: OwnedFd,
    /// The raw tracepoint it goes on.
    pub tracepoint: String,
}

/// Why a loader was not hooked.
#[derive(Debug, thiserror::Error)]
enum NotHooked {
    /// Its file could not be opened (gone before it was read): tried again when another
    /// process maps it.
    #[error("{0}")]
    Unopened(String),
    /// Its file was refused (not the file mapped, not an empty `_dl_debug_state`, or the link
    /// failed): not tried again.
    #[error("{0}")]
    Refused(String),
}

/// The loader hooks and what they have seen.
pub struct Loaders {
    prog: OwnedFd,
    /// The function hooked (`_dl_debug_state`; a test names another to see the fallback).
    symbol: String,
    links: Vec<OwnedFd>,
    /// Loader files hooked, or tried and refused (not tried again).
    seen: HashSet<FileKey>,
    max: usize,
    /// Executed files said by the kernel, forgotten there when they could not be read.
    exes: Option<BpfHashMap<MapData, ExeKey, u8>>,
    syscalls: Option<Syscalls>,
    /// The `sys_enter` link once loaders overflowed.
    overflow: Option<OwnedFd>,
    stats: Arc<Stats>,
    /// Hooks not said yet (the own loader's, hooked before cudatrace leaves uid 0, when a run
    /// that cannot leave it must say that one line only).
    unsaid: Vec<(String, u32)>,
}

impl Loaders {
    /// Loader hooks of the loaded `cuda_loaded` program `prog` on `symbol`, none attached yet
    /// ([`Loaders::overflow_to`] gives the exec hook's map and the hook for overflow).
    pub fn new(prog: OwnedFd, symbol: String) -> Loaders {
        let max = std::env::var("CUDATRACE_MAX_LOADERS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(MAX_LOADERS);
        Loaders {
            prog,
            symbol,
            links: Vec::new(),
            seen: HashSet::new(),
            max,
            exes: None,
            syscalls: None,
            overflow: None,
            stats: Arc::default(),
            unsaid: Vec::new(),
        }
    }

    /// Says the hooks made before discovery started.
    pub fn say_unsaid(&mut self) {
        for (path, pid) in std::mem::take(&mut self.unsaid) {
            say_hooked(&path, pid);
        }
    }

    /// Counts into discovery's `stats` from now on.
    pub fn share(&mut self, stats: Arc<Stats>) {
        stats
            .loaders
            .store(self.links.len() as u64, Ordering::Relaxed);
        self.stats = stats;
    }

    /// Where executions are remembered (`EXES`), and the `sys_enter` hook for overflow.
    pub fn overflow_to(
        &mut self,
        exes: Option<BpfHashMap<MapData, ExeKey, u8>>,
        syscalls: Option<Syscalls>,
    ) {
        self.exes = exes;
        self.syscalls = syscalls;
    }

    /// The function hooked in each loader.
    pub fn symbol(&self) -> &str {
        &self.symbol
    }

    /// Hooks this process's own loader: whether the kernel takes a loader hook at all.
    pub fn watch_own(&mut self) -> Result<(), String> {
        let maps = std::fs::File::open("/proc/self/maps").map_err(|e| e.to_string())?;
        let own = crate::probe::proc_maps::mappings(maps).loaders;
        let Some(m) = own.first() else {
            return Err("cudatrace itself maps no dynamic loader".into());
        };
        self.attach(std::process::id(), m)
            .map_err(|e| e.to_string())
    }

    /// Hooks the loader `pid` maps as `m` unless its file was hooked or refused before: whether
    /// it was hooked now. A refusal is said once, at debug level (a tenant's file named like a
    /// loader is no fault of the node's).
    pub fn watch(&mut self, pid: u32, m: &Mapping) -> bool {
        let key = (m.dev, m.inode);
        if self.seen.contains(&key) {
            return false;
        }
        if self.seen.len() >= self.max {
            self.overflowed();
            return false;
        }
        match self.attach(pid, m) {
            Ok(()) => true,
            Err(why) => {
                log::debug!("cudatrace: loader not hooked: {why}");
                if matches!(why, NotHooked::Refused(_)) {
                    self.seen.insert(key);
                }
                false
            }
        }
    }

    fn attach(&mut self, pid: u32, m: &Mapping) -> Result<(), NotHooked> {
        let (file, _, shown) = open_mapped(pid, m).map_err(|e| match e {
            Unmapped::Unopened(why) => NotHooked::Unopened(why),
            Unmapped::Unusable(why) => NotHooked::Refused(why),
        })?;
        let site = debug_state(&file, &shown, &self.symbol, LOADER_DEBUG_SYMBOL)
            .map_err(NotHooked::Refused)?;
        let fd_path = format!("/proc/self/fd/{}", file.as_raw_fd());
        let link = multi::link(
            &self.prog,
            PROG_LOADED,
            Path::new(&fd_path),
            &shown,
            &[site.offset],
            &[site.cookie],
            multi::Mode::Entry,
            None,
        )
        .map_err(|e| NotHooked::Refused(e.to_string()))?;
        self.links.push(link);
        self.seen.insert((m.dev, m.inode));
        self.stats
            .loaders
            .store(self.links.len() as u64, Ordering::Relaxed);
        let shown = printable(&shown.display().to_string()).into_owned();
        if pid == std::process::id() {
            self.unsaid.push((shown, pid));
        } else {
            say_hooked(&shown, pid);
        }
        Ok(())
    }

    /// An executed file whose process was not read (the budget was spent): counted, and
    /// forgotten by the kernel, so that its next execution is said again.
    pub fn forget(&mut self, exe: ExeKey) {
        self.stats.execs_dropped.fetch_add(1, Ordering::Relaxed);
        self.again(exe);
    }

    /// An executed file whose process was gone before it could be read: its next execution is
    /// said again.
    pub fn again(&mut self, exe: ExeKey) {
        if let Some(exes) = self.exes.as_mut() {
            let _ = exes.remove(&exe);
        }
    }

    /// More loader files than [`MAX_LOADERS`]: the `sys_enter` hook goes on as well, said once.
    fn overflowed(&mut self) {
        if self.overflow.is_some() {
            return;
        }
        let Some(s) = self.syscalls.take() else {
            return;
        };
        match multi::raw_tracepoint(&s.prog, &s.tracepoint) {
            Ok(link) => {
                log::warn!(
                    "cudatrace: more than {} dynamic loaders on this node: discovery's open hook now runs on every system call of the node as well (raw_tracepoint:{})",
                    self.max,
                    s.tracepoint
                );
                self.overflow = Some(link);
            }
            Err(e) => log::warn!(
                "cudatrace: more than {} dynamic loaders on this node, and the raw tracepoint {} cannot be attached ({e}): processes of the loaders past it are found by full passes only",
                self.max,
                s.tracepoint
            ),
        }
    }
}

/// The line (and `loader_hooked` event) of a loader hooked.
fn say_hooked(path: &str, pid: u32) {
    log::info!(
        target: "cudatrace::loader_hooked",
        path = path,
        pid = pid;
        "loader hooked: {path} (pid {pid})"
    );
}
