//! Shares of the entry-slot map: a thread's slot is made only while its process holds fewer
//! than `SLOTS_PER_PROCESS` and its cgroup fewer than `SLOTS_PER_CGROUP`, and given back when
//! the thread exits; a count back at 0 is deleted. A call of a thread without a slot is not
//! timed and is counted against its own process (`UNSLOTTED`), so that a tenant parking
//! thousands of threads in driver calls costs itself its timings, not another tenant's; a
//! launch of such a thread is still counted, untimed, in its kernel's cell (`entry`), so that
//! no share hides a process's launches from the verdicts.
use core::intrinsics::{atomic_xadd, AtomicOrdering};

use aya_ebpf::maps::HashMap;
use tracer_common::{SLOTS_PER_CGROUP, SLOTS_PER_PROCESS};

use crate::maps::{count_for, SLOTS, SLOTS_CG, UNSLOTTED};

/// The counter of `key` in `map`, made at 0 when missing (`None`: the map is full).
#[inline(always)]
fn counter<K>(map: &HashMap<K, u64>, key: &K) -> Option<*mut u64> {
    if let Some(c) = map.get_ptr_mut(key) {
        return Some(c);
    }
    // BPF_NOEXIST: another CPU may have made it meanwhile; then its counter is used.
    let _ = map.insert(key, &0, 1);
    map.get_ptr_mut(key)
}

/// Takes a slot for process `pid` of cgroup `cgroup`: whether both are under their share (the
/// counts are then one higher). A race between CPUs may let a slot or two past a share, never
/// refuse one under it.
#[inline(always)]
pub fn take(pid: u32, cgroup: u64) -> bool {
    let (Some(p), Some(c)) = (counter(&SLOTS, &pid), counter(&SLOTS_CG, &cgroup)) else {
        count_for(&UNSLOTTED, pid);
        return false;
    };
    // SAFETY: map values live while this program runs; the reads race only with atomic adds.
    let over = unsafe { *p >= SLOTS_PER_PROCESS || *c >= SLOTS_PER_CGROUP };
    if over {
        // A counter made here at 0 for nothing is not kept: every entry of either map stands
        // for a slot held.
        // SAFETY: as above.
        unsafe {
            if *p == 0 {
                let _ = SLOTS.remove(&pid);
            }
            if *c == 0 {
                let _ = SLOTS_CG.remove(&cgroup);
            }
        }
        count_for(&UNSLOTTED, pid);
        return false;
    }
    // SAFETY: as above; the adds are atomic, so concurrent takes and gives from other CPUs
    // are all counted.
    unsafe {
        atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(p, 1);
        atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(c, 1);
    }
    true
}

/// Gives back the slot `take` gave (its thread exits, or its slot could not be inserted). A
/// count that reaches 0 is deleted, whatever order a process's threads exit in and however
/// many cgroups come and go: both maps drain as fast as they fill.
#[inline(always)]
pub fn give_back(pid: u32, cgroup: u64) {
    if let Some(c) = SLOTS.get_ptr_mut(&pid) {
        if one_less(c) {
            let _ = SLOTS.remove(&pid);
        }
    }
    if let Some(c) = SLOTS_CG.get_ptr_mut(&cgroup) {
        if one_less(c) {
            let _ = SLOTS_CG.remove(&cgroup);
        }
    }
}

/// Subtracts one, atomically, from a count above 0: a count already 0 (made anew after a
/// leader's exit) is left alone, so a count errs low,
/// never high. Whether the count is 0 now (its entry is then deleted; a take racing on another
/// CPU may lose its count with it: low again, never high). The count is read again after the
/// add (the programs are built for the generic BPF CPU, where an atomic add returns nothing).
#[inline(always)]
fn one_less(c: *mut u64) -> bool {
    // SAFETY: a map value, live while this program runs; the add is atomic.
    unsafe {
        if *c > 0 {
            atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(c, u64::MAX);
        }
        *c == 0
    }
}

/// Forgets process `pid`'s count (its leader exits).
#[inline(always)]
pub fn forget(pid: u32) {
    let _ = SLOTS.remove(&pid);
}
