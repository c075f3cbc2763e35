//! Maps shared by the programs. User space resizes `EVENTS` and reads `STATS`.
use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf},
};
use tracer_common::{CONFIG_COUNT, DEFAULT_RINGBUF_BYTES, Filter, MAX_INFLIGHT, MAX_TRACKED, STAT_COUNT};

use crate::entry::Entry;

/// Completed calls, consumed by the cudatrace binary.
#[map]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(DEFAULT_RINGBUF_BYTES, 0);

/// Per-thread state of the call in progress, keyed by pid_tgid. LRU so that threads that die
/// inside a call cannot fill it.
#[map]
pub static ENTRIES: LruHashMap<u64, Entry> = LruHashMap::with_max_entries(MAX_INFLIGHT, 0);

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

/// Whether user space wants calls recorded (it clears this before its final drain).
#[inline(always)]
pub fn enabled() -> bool {
    matches!(CONFIG.get(tracer_common::CONFIG_ENABLED), Some(&1))
}

/// Adds one to a per-CPU counter.
#[inline(always)]
pub fn bump(index: u32) {
    if let Some(slot) = STATS.get_ptr_mut(index) {
        // SAFETY: per-CPU slot, no concurrent writer on this CPU while the program runs.
        unsafe { *slot += 1 };
    }
}
