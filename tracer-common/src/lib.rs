//! The `#[repr(C)]` ABI shared by the eBPF programs and the `cudatrace` binary: which driver entry
//! points exist, how the attach cookie encodes them, and the records the ring buffer carries.
#![no_std]

pub mod api;
pub mod callconv;
pub mod caps;
pub mod entry;
pub mod event;
pub mod launches;
pub mod names;
pub mod opens;
pub mod params;
pub mod results;

pub use api::{Api, Kind, Layout};
pub use entry::Entry;
pub use event::{
    CallEvent, EventTag, ExitEvent, FaultEvent, LongLookupEvent, LookupEvent, NameEvent,
    EXIT_STATUS_KNOWN, LONG_NAME_MAX, NAME_MAX, SI_CODE_UNKNOWN,
};

/// Index of the dropped-events slot in the `STATS` per-CPU array.
pub const STAT_DROPPED: u32 = 0;
/// Index of the slot counting returns whose entry state was missing (evicted or attached mid-call).
pub const STAT_ORPHAN_RETURNS: u32 = 1;
/// Index of the slot counting records not written because their process was over
/// `CONFIG_RATE_LIMIT`.
pub const STAT_RATE_LIMITED: u32 = 2;
/// Index of the slot counting libcuda opens the `OPENS` ring buffer had no room for.
pub const STAT_OPENS_LOST: u32 = 3;
/// Index of the slot counting `CUDA_ERROR_NOT_READY` answers to polls, filtered in the kernel.
pub const STAT_POLLS_NOT_READY: u32 = 4;
/// Index of the slot counting launches added to their `LAUNCHES` cell: while its sum stands
/// still, no cell changed, and user space does not read the map.
pub const STAT_COUNTED: u32 = 5;
/// Index of the slot counting cells made in `LAUNCHES`: while it stands still, user space reads
/// the cells it knows one by one instead of walking every bucket of the map.
pub const STAT_CELLS_MADE: u32 = 6;
/// Index in `STATS` of the launches counted after the fact, untimed: their return was cut off
/// by the end of a window of the pair, or their thread exited inside them.
pub const STAT_COUNTED_LATE: u32 = 7;
/// Index in `STATS` of the launches of threads without an entry slot (their process's or
/// cgroup's share used, or the map full), counted untimed at entry all the same.
pub const STAT_COUNTED_UNSLOTTED: u32 = 8;
/// Number of slots in the `STATS` per-CPU array.
pub const STAT_COUNT: u32 = 9;

/// Index of the on/off switch in the `CONFIG` array: calls are recorded while it holds 1.
pub const CONFIG_ENABLED: u32 = 0;
/// Index of the wake-up threshold in the `CONFIG` array: records are submitted without waking
/// the reader until this many bytes wait in the ring buffer (the reader also polls on a timer).
pub const CONFIG_WAKEUP_BYTES: u32 = 1;
/// Index of the per-process record rate limit in the `CONFIG` array: at most this many records
/// per process per second (a window that starts at its first record); 0: no limit.
pub const CONFIG_RATE_LIMIT: u32 = 2;
/// Index of the launch-aggregation switch in the `CONFIG` array: 1 counts launches in
/// `LAUNCHES` and writes only sampled ones to the ring buffer; 0 writes every launch.
pub const CONFIG_AGGREGATE: u32 = 3;
/// Index of how many launches of each process each second are all written, when aggregating.
pub const CONFIG_SAMPLE_FIRST: u32 = 4;
/// Index of the sampling period past those: one launch in this many is written (0: none).
pub const CONFIG_SAMPLE_EVERY: u32 = 5;
/// Index of the slow-launch threshold in microseconds: slower launches are always written
/// (0: none is slow).
pub const CONFIG_SLOW_US: u32 = 6;
/// Index of the per-process quota of `LAUNCHES` cells: a process's launches past it are counted
/// in its overflow cells (0: no quota).
pub const CONFIG_CELL_QUOTA: u32 = 7;
/// Index of the byte offset of `exit_code` in the kernel's `struct task_struct`, which user
/// space reads from the kernel's BTF (0: unknown, and exit records carry no status).
pub const CONFIG_EXIT_CODE_OFFSET: u32 = 8;
/// Index of the pair's window switch in the `CONFIG` array: 1 while the launches' return probes
/// are detached (outside a window), when each launch's entry counts it and writes what must be
/// written itself; 0 (the default, and always with sessions or classic uprobes): returns run.
pub const CONFIG_RETURNS_CLOSED: u32 = 9;
/// Number of slots in the `CONFIG` array.
pub const CONFIG_COUNT: u32 = 10;

/// Filter flag: record only calls of threads whose `comm` equals [`Filter::comm`].
pub const FILTER_COMM: u32 = 1;
/// Filter flag: record only calls from the cgroup (v2) whose id is [`Filter::cgroup_id`].
pub const FILTER_CGROUP: u32 = 2;

/// In-kernel filter, the one entry of the `FILTER` array: filtered-out calls cost no ring-buffer
/// record and no user-space work.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Filter {
    /// `FILTER_*` flags; 0 records everything.
    pub flags: u32,
    /// Padding; always 0.
    pub _pad: u32,
    /// cgroup v2 id (the inode number of the cgroup's directory).
    pub cgroup_id: u64,
    /// Thread name, NUL-padded.
    pub comm: [u8; 16],
}

#[cfg(feature = "user")]
// SAFETY: plain #[repr(C)] integers with explicit padding.
unsafe impl aya::Pod for Filter {}

/// Capacity of the map of processes user space has seen (their exits are reported).
pub const MAX_TRACKED: u32 = 65536;

/// Capacity of the LRU map of records dropped per process (the processes that filled the ring
/// buffer), and of the one of records rate-limited per process.
pub const MAX_DROPPING: u32 = 4096;

/// Capacity of the LRU map of per-process rate windows.
pub const MAX_RATED: u32 = 16384;

/// One process's record-rate window (eBPF side only).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct RateWindow {
    /// When the window began (CLOCK_MONOTONIC ns).
    pub start_ns: u64,
    /// Records counted in it.
    pub count: u64,
}

/// One (process, symbol) count of `cudatrace census`: the symbol is its index in the list user
/// space attached, carried in the attach cookie.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CensusKey {
    /// Process id.
    pub pid: u32,
    /// Index of the symbol.
    pub symbol: u32,
}

#[cfg(feature = "user")]
// SAFETY: plain #[repr(C)] integers without padding.
unsafe impl aya::Pod for CensusKey {}

/// Capacity of the census map: (process, symbol) pairs counted at most.
pub const MAX_CENSUS: u32 = 65_536;

/// Capacity of the per-thread entry-state map (threads that made a driver call and live). Not
/// LRU: a slot is never taken from a thread whose call is in flight; a thread's slot goes when
/// it exits.
pub const MAX_INFLIGHT: u32 = 16384;
/// Entry slots (threads) one process holds at most.
pub const SLOTS_PER_PROCESS: u64 = 2048;
/// Entry slots the processes of one cgroup hold at most together.
pub const SLOTS_PER_CGROUP: u64 = 4096;
/// Default ring-buffer size in bytes (a power of two, multiple of the page size).
pub const DEFAULT_RINGBUF_BYTES: u32 = 8 << 20;

// The layout both sides rely on: a change here is a change of the ABI, and must be deliberate.
const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(size_of::<Filter>() == 32);
    assert!(offset_of!(Filter, cgroup_id) == 8 && offset_of!(Filter, comm) == 16);
};
