//! Names of the maps and programs in the eBPF object, for both sides. The eBPF side names each
//! map and program by its identifier, so those identifiers must equal these strings; a user-space
//! test checks the built object holds every one of them.

/// Ring buffer of records (`EVENTS`): [`crate::CallEvent`], [`crate::LookupEvent`],
/// [`crate::ExitEvent`].
pub const MAP_EVENTS: &str = "EVENTS";
/// Per-thread entry state (LRU hash, pid_tgid to [`crate::Entry`]; `start_ns` 0 when idle).
pub const MAP_ENTRIES: &str = "ENTRIES";
/// Per-CPU counters, indexed by `STAT_*` (u64 each).
pub const MAP_STATS: &str = "STATS";
/// Settings, indexed by `CONFIG_*` (u32 each).
pub const MAP_CONFIG: &str = "CONFIG";
/// The in-kernel [`crate::Filter`] (one entry).
pub const MAP_FILTER: &str = "FILTER";
/// Processes whose exit user space wants to hear of (pid to u8).
pub const MAP_TRACKED: &str = "TRACKED";
/// Records dropped per process, the ring buffer being full (LRU hash, pid to u64).
pub const MAP_DROPS: &str = "DROPS";
/// Records not written per process, over the rate limit (LRU hash, pid to u64).
pub const MAP_LIMITED: &str = "LIMITED";
/// Per-process rate windows (LRU hash, pid to [`crate::RateWindow`]).
pub const MAP_RATES: &str = "RATES";
/// Launches counted in-kernel (hash, [`crate::launches::LaunchKey`] to
/// [`crate::launches::LaunchCell`]).
pub const MAP_LAUNCHES: &str = "LAUNCHES";
/// Cells of `LAUNCHES` made per process (hash, pid to u64), for the per-process quota.
pub const MAP_CELLS: &str = "CELLS";
/// Opens of files named like libcuda (ring buffer of [`crate::opens::OpenEvent`]).
pub const MAP_OPENS: &str = "OPENS";
/// When each process that opened a libcuda was last reported (LRU hash, pid to ns).
pub const MAP_OPENERS: &str = "OPENERS";
/// Per-process sampling windows (LRU hash, pid to [`crate::launches::ProcWindow`]).
pub const MAP_PROCS: &str = "PROCS";
/// What the loader program saw of each process's loaded objects (LRU hash, pid to
/// [`crate::opens::LoadedState`]).
pub const MAP_LOADED: &str = "LOADED";
/// Executed files said already (LRU hash, [`crate::opens::ExeKey`] to u8).
pub const MAP_EXES: &str = "EXES";
/// The exec program's offsets and wake time (array of u64, `EXEC_*` slots).
pub const MAP_EXEC_CONFIG: &str = "EXEC_CONFIG";

/// Entry program for `cuLaunchKernel`-shaped calls.
pub const PROG_LAUNCH: &str = "cuda_launch";
/// Entry program for `cuLaunchKernelEx`.
pub const PROG_LAUNCH_EX: &str = "cuda_launch_ex";
/// Entry program for calls whose arguments all sit in registers.
pub const PROG_REGS: &str = "cuda_regs";
/// The return program, on every probed symbol (on the ones a session program covers, only where
/// uprobe sessions are not available).
pub const PROG_RETURN: &str = "cuda_ret";
/// The uprobe-session program of `cuLaunchKernel`-shaped calls: entry and, when the entry asks
/// for it, return (Linux 6.13+).
pub const PROG_SESSION: &str = "cuda_session";
/// The uprobe-session program of `cuLaunchKernelEx`.
pub const PROG_SESSION_EX: &str = "cuda_session_ex";
/// The `sched_process_exit` raw tracepoint program.
pub const PROG_EXIT: &str = "cuda_exit";
/// The `task_rename` raw tracepoint program.
pub const PROG_RENAME: &str = "cuda_rename";
/// The `sys_enter` raw tracepoint program of discovery without polling (opens of libcuda).
pub const PROG_OPENED: &str = "cuda_opened";
/// The raw tracepoint [`PROG_OPENED`] is attached to.
pub const OPENED_TRACEPOINT: &str = "sys_enter";
/// The kprobe program of discovery on the kernel's open path (only opens run it).
pub const PROG_OPENED_PATH: &str = "cuda_opened_path";
/// Discovery's hook in each dynamic loader (`_dl_debug_state`, a uprobe_multi link per loader
/// file): names the processes that loaded a libcuda.
pub const PROG_LOADED: &str = "cuda_loaded";
/// Discovery's exec hook: names the processes that executed a file not seen before, whose
/// loader may need [`PROG_LOADED`].
pub const PROG_EXEC: &str = "cuda_exec";
/// The raw tracepoint [`PROG_EXEC`] is attached to.
pub const EXEC_TRACEPOINT: &str = "sched_process_exec";
/// The kernel function [`PROG_OPENED_PATH`] probes: every `open`, `openat` and `openat2`, the
/// user-space path its second argument.
pub const OPENED_FUNCTION: &str = "do_sys_openat2";

/// The `signal_generate` raw tracepoint program: synchronous faults of probed threads.
pub const PROG_FAULT: &str = "cuda_fault";
/// Calls per (process, exported symbol) counted by `cudatrace census`.
pub const MAP_CENSUS: &str = "CENSUS";
/// The count-only entry program of `cudatrace census`.
pub const PROG_CENSUS: &str = "cuda_census";

/// Entry slots each process holds, against its share.
pub const MAP_SLOTS: &str = "SLOTS";
/// Entry slots each cgroup holds, against its share.
pub const MAP_SLOTS_CGROUP: &str = "SLOTS_CG";
/// Calls per process that found no entry slot (the process or its cgroup over its share, or
/// every slot taken): not timed, and counted against that process.
pub const MAP_UNSLOTTED: &str = "UNSLOTTED";

/// Every map name.
pub const MAPS: [&str; 21] = [
    MAP_EVENTS,
    MAP_ENTRIES,
    MAP_STATS,
    MAP_CONFIG,
    MAP_FILTER,
    MAP_TRACKED,
    MAP_DROPS,
    MAP_LIMITED,
    MAP_RATES,
    MAP_LAUNCHES,
    MAP_CELLS,
    MAP_OPENS,
    MAP_OPENERS,
    MAP_PROCS,
    MAP_CENSUS,
    MAP_SLOTS,
    MAP_SLOTS_CGROUP,
    MAP_UNSLOTTED,
    MAP_LOADED,
    MAP_EXES,
    MAP_EXEC_CONFIG,
];
/// Every program name.
pub const PROGRAMS: [&str; 14] = [
    PROG_FAULT,
    PROG_LAUNCH,
    PROG_LAUNCH_EX,
    PROG_REGS,
    PROG_RETURN,
    PROG_SESSION,
    PROG_SESSION_EX,
    PROG_EXIT,
    PROG_RENAME,
    PROG_OPENED,
    PROG_OPENED_PATH,
    PROG_CENSUS,
    PROG_LOADED,
    PROG_EXEC,
];
