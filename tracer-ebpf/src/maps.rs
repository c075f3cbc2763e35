//! Maps shared by the programs. Each static's identifier is its name in the object, and equals
//! tracer-common's `names::MAP_*` (a user-space test checks). User space resizes `EVENTS` and
//! reads `STATS`.
use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, LruHashMap, LruPerCpuHashMap, PerCpuArray, RingBuf},
};
use tracer_common::{
    CONFIG_COUNT, DEFAULT_RINGBUF_BYTES, Entry, Filter, MAX_DROPPING, MAX_INFLIGHT, MAX_TRACKED, STAT_COUNT, STAT_DROPPED,
};

/// Completed calls, consumed by the cudatrace binary.
#[map]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(DEFAULT_RINGBUF_BYTES, 0);

/// Per-thread state of the call in progress, keyed by pid_tgid. LRU so that threads that die
/// inside a call cannot fill it.
#[map]
// BPF_F_NO_COMMON_LRU: per-CPU LRU lists, so that threads on different CPUs do not contend on
// one list lock on every call.
pub static ENTRIES: LruHashMap<u64, Entry> = LruHashMap::with_max_entries(MAX_INFLIGHT, 2);

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

/// Counts a record of process `pid` the ring buffer had no room for.
#[inline(always)]
pub fn dropped(pid: u32) {
    bump(STAT_DROPPED);
    match DROPS.get_ptr_mut(&pid) {
        // SAFETY: this CPU's slot of the value for `pid`; no other program runs on this CPU
        // meanwhile, and the pointer is not kept past this program.
        Some(count) => unsafe { *count += 1 },
        None => {
            // BPF_NOEXIST: if another CPU created the entry meanwhile, this CPU's count is lost
            // (one record of a burst); the total in STATS is exact.
            let _ = DROPS.insert(&pid, &1, 1);
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
    if EVENTS.query(BPF_RB_AVAIL_DATA) >= threshold { BPF_RB_FORCE_WAKEUP } else { BPF_RB_NO_WAKEUP }
}

/// Adds one to a per-CPU counter.
#[inline(always)]
pub fn bump(index: u32) {
    if let Some(slot) = STATS.get_ptr_mut(index) {
        // SAFETY: per-CPU slot, no concurrent writer on this CPU while the program runs.
        unsafe { *slot += 1 };
    }
}
