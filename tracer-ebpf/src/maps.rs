//! Maps shared by the programs. Each static's identifier is its name in the object, and equals
//! tracer-common's `names::MAP_*` (a user-space test checks). User space resizes `EVENTS` and
//! reads `STATS`.
use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, LruHashMap, LruPerCpuHashMap, PerCpuArray, RingBuf},
};
use tracer_common::{
    launches::{LaunchCell, LaunchKey, ProcWindow, MAX_LAUNCH_CELLS, MAX_SAMPLED_PROCS},
    opens::{ExeKey, LoadedState, EXEC_CONFIG_COUNT, MAX_EXES, MAX_OPENERS, OPENS_RINGBUF_BYTES},
    CensusKey, Entry, EventTag, Filter, NameEvent, RateWindow, CONFIG_COUNT, CONFIG_RATE_LIMIT,
    DEFAULT_RINGBUF_BYTES, MAX_CENSUS, MAX_DROPPING, MAX_INFLIGHT, MAX_RATED, MAX_TRACKED,
    STAT_COUNT, STAT_DROPPED, STAT_RATE_LIMITED,
};

/// Completed calls, consumed by the cudatrace binary.
#[map]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(DEFAULT_RINGBUF_BYTES, 0);

/// Per-thread state of the call in progress, keyed by pid_tgid: a slot per thread, made on its
/// first call, reused by the next ones (`start_ns` 0 while idle), removed when the thread exits.
/// Not LRU: a flood of threads could then evict another process's slot in the middle of its
/// call. A process holds at most `SLOTS_PER_PROCESS` slots and a cgroup `SLOTS_PER_CGROUP`
/// (`SLOTS`, `SLOTS_CG`), so that one tenant cannot fill it either.
#[map]
pub static ENTRIES: HashMap<u64, Entry> = HashMap::with_max_entries(MAX_INFLIGHT, 0);

/// Slots each process holds (added to atomically).
#[map]
pub static SLOTS: HashMap<u32, u64> = HashMap::with_max_entries(MAX_INFLIGHT, 0);

/// Slots each cgroup's processes hold (added to atomically).
#[map]
pub static SLOTS_CG: HashMap<u64, u64> = HashMap::with_max_entries(MAX_INFLIGHT, 0);

/// Calls per process that found no slot; as `DROPS`.
#[map]
pub static UNSLOTTED: LruPerCpuHashMap<u32, u64> =
    LruPerCpuHashMap::with_max_entries(MAX_DROPPING, 0);

/// Per-CPU counters, indexed by the `STAT_*` constants of tracer-common.
#[map]
pub static STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(STAT_COUNT, 0);

/// Settings written by user space, indexed by the `CONFIG_*` constants of tracer-common.
#[map]
pub static CONFIG: Array<u32> = Array::with_max_entries(CONFIG_COUNT, 0);

/// The in-kernel filter (one entry), written by user space before recording starts.
#[map]
pub static FILTER: Array<Filter> = Array::with_max_entries(1, 0);

/// Processes user space has seen events of; their exit is reported and the entry removed.
#[map]
pub static TRACKED: HashMap<u32, u8> = HashMap::with_max_entries(MAX_TRACKED, 0);

/// Records dropped per process (the ring buffer full): who filled it. Per CPU (no atomics on
/// this target; user space adds the CPUs up), LRU so that many processes cannot fill it either.
#[map]
pub static DROPS: LruPerCpuHashMap<u32, u64> = LruPerCpuHashMap::with_max_entries(MAX_DROPPING, 0);

/// Records not written per process, over the rate limit; as `DROPS`.
#[map]
pub static LIMITED: LruPerCpuHashMap<u32, u64> =
    LruPerCpuHashMap::with_max_entries(MAX_DROPPING, 0);

/// Each process's current one-second window of records. Shared by the CPUs without atomics: a
/// count lost to a race lets a record more through, never fewer.
#[map]
pub static RATES: LruHashMap<u32, RateWindow> = LruHashMap::with_max_entries(MAX_RATED, 0);

/// Launches counted in-kernel while aggregating, added to atomically from every CPU. Allocated
/// as used; user space deletes the cells of exited processes.
#[map]
pub static LAUNCHES: HashMap<LaunchKey, LaunchCell> =
    HashMap::with_max_entries(MAX_LAUNCH_CELLS, BPF_F_NO_PREALLOC);

/// Cells of `LAUNCHES` each process has made, against its quota; added to atomically. User
/// space deletes a process's entry with its cells.
#[map]
pub static CELLS: HashMap<u32, u64> =
    HashMap::with_max_entries(MAX_LAUNCH_CELLS, BPF_F_NO_PREALLOC);

/// Opens of files named like libcuda, for discovery (a ring of its own: a flood of calls cannot
/// hide a new library).
#[map]
pub static OPENS: RingBuf = RingBuf::with_byte_size(OPENS_RINGBUF_BYTES, 0);

/// When each process that opened a libcuda was last reported, for `OPEN_REPORT_GAP_NS`.
#[map]
pub static OPENERS: LruHashMap<u32, u64> = LruHashMap::with_max_entries(MAX_OPENERS, 0);

/// What the loader program saw of each process's loaded objects (its count and last object), so
/// that a load looks at the new objects only; forgotten at each execution.
#[map]
pub static LOADED: LruHashMap<u32, LoadedState> = LruHashMap::with_max_entries(MAX_OPENERS, 0);

/// Executed files said to discovery already: each is said once (its loader does not change).
#[map]
pub static EXES: LruHashMap<ExeKey, u8> = LruHashMap::with_max_entries(MAX_EXES, 0);

/// The exec program's field offsets (from the kernel's BTF, set by user space) and when it last
/// woke the reader (`EXEC_*` slots).
#[map]
pub static EXEC_CONFIG: Array<u64> = Array::with_max_entries(EXEC_CONFIG_COUNT, 0);

/// Each process's launch-sampling window and wait epoch, while aggregating.
#[map]
pub static PROCS: LruHashMap<u32, ProcWindow> = LruHashMap::with_max_entries(MAX_SAMPLED_PROCS, 0);

/// `BPF_F_NO_PREALLOC`: hash entries allocated on insert.
const BPF_F_NO_PREALLOC: u32 = 1;

/// A `CONFIG` slot (0 when unset).
#[inline(always)]
pub fn config(index: u32) -> u32 {
    CONFIG.get(index).copied().unwrap_or(0)
}

/// Writes a thread's name (its first call, or a rename); a full ring buffer counts it dropped.
#[inline(always)]
pub fn emit_name(pid: u32, tid: u32, renamed: bool, comm: [u8; 16]) {
    match EVENTS.reserve::<NameEvent>(0) {
        Some(mut slot) => {
            slot.write(NameEvent {
                tag: EventTag::Name as u32,
                pid,
                tid,
                renamed: u32::from(renamed),
                comm,
            });
            slot.submit(0);
        }
        None => dropped(pid),
    }
}

/// Counts a record of process `pid` the ring buffer had no room for.
#[inline(always)]
pub fn dropped(pid: u32) {
    bump(STAT_DROPPED);
    count_for(&DROPS, pid);
}

/// Counts a record of process `pid` left out for the rate limit.
#[inline(always)]
pub fn rate_limited(pid: u32) {
    bump(STAT_RATE_LIMITED);
    count_for(&LIMITED, pid);
}

/// Whether process `pid` has written its `CONFIG_RATE_LIMIT` records in the window that holds
/// `now` (a window lasts a second from the record that opened it).
#[inline(always)]
pub fn over_rate(pid: u32, now: u64) -> bool {
    let limit = match CONFIG.get(CONFIG_RATE_LIMIT) {
        Some(l) if *l > 0 => u64::from(*l),
        _ => return false,
    };
    match RATES.get_ptr_mut(&pid) {
        // SAFETY: the value stays valid while this program runs; a concurrent update from
        // another CPU can only be lost, as said on RATES.
        Some(w) => unsafe {
            if now.wrapping_sub((*w).start_ns) >= 1_000_000_000 {
                (*w).start_ns = now;
                (*w).count = 1;
                false
            } else {
                (*w).count += 1;
                (*w).count > limit
            }
        },
        None => {
            let _ = RATES.insert(
                &pid,
                &RateWindow {
                    start_ns: now,
                    count: 1,
                },
                0,
            );
            false
        }
    }
}

/// Adds one to `pid`'s count in a per-CPU LRU map.
#[inline(always)]
pub fn count_for(map: &LruPerCpuHashMap<u32, u64>, pid: u32) {
    match map.get_ptr_mut(&pid) {
        // SAFETY: this CPU's slot of the value for `pid`; no other program runs on this CPU
        // meanwhile, and the pointer is not kept past this program.
        Some(count) => unsafe { *count += 1 },
        None => {
            // BPF_NOEXIST: if another CPU created the entry meanwhile, this CPU's count is lost
            // (one record of a burst); the total in STATS is exact.
            let _ = map.insert(&pid, &1, 1);
        }
    }
}

/// Whether user space wants calls recorded (it clears this before its final drain).
#[inline(always)]
pub fn enabled() -> bool {
    matches!(CONFIG.get(tracer_common::CONFIG_ENABLED), Some(&1))
}

/// Submit flags for a record: waking the reader costs an interrupt and a context switch per
/// record, so the reader is woken only once `CONFIG_WAKEUP_BYTES` are waiting (it also drains on
/// a timer). 0 in that slot wakes it for every record.
#[inline(always)]
pub fn submit_flags() -> u64 {
    const BPF_RB_NO_WAKEUP: u64 = 1;
    const BPF_RB_FORCE_WAKEUP: u64 = 2;
    const BPF_RB_AVAIL_DATA: u64 = 0;
    let threshold = match CONFIG.get(tracer_common::CONFIG_WAKEUP_BYTES) {
        Some(t) if *t > 0 => *t as u64,
        _ => return 0,
    };
    if EVENTS.query(BPF_RB_AVAIL_DATA) >= threshold {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    }
}

/// Adds one to a per-CPU counter.
#[inline(always)]
pub fn bump(index: u32) {
    if let Some(slot) = STATS.get_ptr_mut(index) {
        // SAFETY: per-CPU slot, no concurrent writer on this CPU while the program runs.
        unsafe { *slot += 1 };
    }
}

/// `cudatrace census`: calls per (process, exported symbol), counted at entry only.
#[map]
pub static CENSUS: HashMap<CensusKey, u64> = HashMap::with_max_entries(MAX_CENSUS, 0);
