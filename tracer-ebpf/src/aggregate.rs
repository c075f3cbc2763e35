//! In-kernel aggregation of launches: each launch is added to its `LAUNCHES` cell, and reaches
//! the ring buffer only when it is sampled, slow, failed, or may open a stream batch (which the
//! GPU-time estimate needs). Every wait that closes a batch changes its process's epoch; a
//! launch on the stream of its thread's last launch, under the same epoch, cannot open one. So
//! every launch that opens a batch is written (a few that do not may be too: user space keeps a
//! batch's first start), at the cost of no map beyond the thread's own slot.
use core::intrinsics::{atomic_xadd, AtomicOrdering};

use tracer_common::{
    api::{COOKIE_API_MASK, COOKIE_PER_THREAD},
    launches::{
        latency_bucket, threads, LaunchCell, LaunchKey, ProcWindow, OVERFLOW_BUCKET,
        OVERFLOW_FUNCTION, UNTIMED_BUCKET,
    },
    Entry, CONFIG_CELL_QUOTA, CONFIG_SAMPLE_EVERY, CONFIG_SAMPLE_FIRST, CONFIG_SLOW_US,
    STAT_CELLS_MADE, STAT_COUNTED,
};

use aya_ebpf::helpers::generated::bpf_get_prandom_u32;

use crate::maps::{config, CELLS, LAUNCHES, PROCS};

/// `CU_STREAM_LEGACY`, what stream 0 means for the plain entry points.
const STREAM_LEGACY: u64 = 1;
/// `CU_STREAM_PER_THREAD`, what stream 0 means for the `_ptsz`/`_ptds` ones.
const STREAM_PER_THREAD: u64 = 2;
const BPF_NOEXIST: u64 = 1;

/// Adds `v` to a counter other CPUs add to as well.
#[inline(always)]
fn add(counter: *mut u64, v: u64) {
    // SAFETY: `counter` points into a map value that stays allocated while this program runs;
    // the atomic add is what makes concurrent adds from other CPUs exact.
    unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(counter, v) };
}

/// Counts a launch in its cell; `false` when the map is full (the caller then writes a full
/// record, so the launch is still counted once). A process that has made its quota of cells
/// (`CONFIG_CELL_QUOTA`) counts its launches with new keys in its overflow cell of the api, so
/// that one process cannot take the cells of all.
#[inline(always)]
pub fn count(pid: u32, entry: &Entry, duration_ns: u64, result: i32) -> bool {
    let mut key = LaunchKey {
        pid,
        api: (entry.cookie & COOKIE_API_MASK) as u16,
        bucket: latency_bucket(duration_ns) as u16,
        function: entry.args[0],
    };
    let cell = match LAUNCHES.get_ptr_mut(&key) {
        Some(c) => c,
        None => {
            let made = match made_cells(pid) {
                Some(made) => made,
                None => return false,
            };
            let quota = u64::from(config(CONFIG_CELL_QUOTA));
            // SAFETY: `made` points into a CELLS value, valid while this program runs.
            let over = quota != 0 && unsafe { *made } >= quota;
            if over {
                key.bucket = OVERFLOW_BUCKET;
                key.function = OVERFLOW_FUNCTION;
            }
            // Made empty, then added to like any other: a CPU that made it meanwhile wins, and
            // both adds land. Only the CPU that made a cell counts it against the quota (other
            // CPUs racing on new keys can pass the quota by at most one cell each).
            match make_cell(&key, if over { None } else { Some(made) }) {
                Some(c) => c,
                None => return false,
            }
        }
    };
    // SAFETY: field addresses inside the cell, computed without creating references.
    unsafe {
        add(core::ptr::addr_of_mut!((*cell).count), 1);
        if result != 0 {
            add(core::ptr::addr_of_mut!((*cell).errors), 1);
        } else {
            add(
                core::ptr::addr_of_mut!((*cell).threads),
                threads(&entry.args),
            );
        }
        add(core::ptr::addr_of_mut!((*cell).sum_ns), duration_ns);
    }
    // After the cell: a reader that sees this count sees the cell's adds (or reads again).
    crate::maps::bump(STAT_COUNTED);
    true
}

/// Makes the cell of `key` empty (a CPU that made it meanwhile wins, and both adds land) and
/// returns it; `made`, the process's count of cells, counts it when this CPU made it (`None`:
/// an overflow cell, which counts against no quota).
#[inline(always)]
fn make_cell(key: &LaunchKey, made: Option<*mut u64>) -> Option<*mut LaunchCell> {
    if LAUNCHES
        .insert(key, &LaunchCell::default(), BPF_NOEXIST)
        .is_ok()
    {
        crate::maps::bump(STAT_CELLS_MADE);
        if let Some(m) = made {
            add(m, 1);
        }
    }
    LAUNCHES.get_ptr_mut(key)
}

/// The count of cells `pid` has made (made 0 on its first); `None` when `CELLS` is full, which
/// (one entry a cell) only a full `LAUNCHES` can cause.
#[inline(always)]
fn made_cells(pid: u32) -> Option<*mut u64> {
    if let Some(m) = CELLS.get_ptr_mut(&pid) {
        return Some(m);
    }
    let _ = CELLS.insert(&pid, &0, BPF_NOEXIST);
    CELLS.get_ptr_mut(&pid)
}

/// Counts at entry a launch whose return a uprobe session skips, in its process's
/// `UNTIMED_BUCKET` cell of the kernel: its count and threads, no duration. `false` when that
/// cell is missing and cannot be made (the map full, or the process at its quota of cells): the
/// caller then asks for the return, which counts the launch as without sessions.
#[inline(always)]
pub fn count_untimed(pid: u32, entry: &Entry) -> bool {
    let key = LaunchKey {
        pid,
        api: (entry.cookie & COOKIE_API_MASK) as u16,
        bucket: UNTIMED_BUCKET,
        function: entry.args[0],
    };
    let cell = match LAUNCHES.get_ptr_mut(&key) {
        Some(c) => c,
        None => {
            let Some(made) = made_cells(pid) else {
                return false;
            };
            let quota = u64::from(config(CONFIG_CELL_QUOTA));
            // SAFETY: `made` points into a CELLS value, valid while this program runs.
            if quota != 0 && unsafe { *made } >= quota {
                return false;
            }
            match make_cell(&key, Some(made)) {
                Some(c) => c,
                None => return false,
            }
        }
    };
    // SAFETY: as in `count`.
    unsafe {
        add(core::ptr::addr_of_mut!((*cell).count), 1);
        add(
            core::ptr::addr_of_mut!((*cell).threads),
            threads(&entry.args),
        );
    }
    crate::maps::bump(STAT_COUNTED);
    true
}

/// The stream a launch goes to, as the GPU-time estimate tells them apart for one thread
/// (stream 0 is `CU_STREAM_PER_THREAD` for the `_ptsz` entry points, else `CU_STREAM_LEGACY`).
#[inline(always)]
pub fn stream_of(cookie: u64, stream: u64) -> u64 {
    match stream {
        0 if cookie & COOKIE_PER_THREAD != 0 => STREAM_PER_THREAD,
        0 => STREAM_LEGACY,
        s => s,
    }
}

/// Whether a counted launch is written to the ring buffer: it may open its stream's batch, or
/// is among the first `CONFIG_SAMPLE_FIRST` of its process this second, or one in
/// `CONFIG_SAMPLE_EVERY` past those, or slower than `CONFIG_SLOW_US`, or failed. `slot` is the
/// thread's entry slot, whose last-launch fields are brought up to date.
#[inline(always)]
pub fn wanted(
    pid: u32,
    window: Option<*mut ProcWindow>,
    slot: *mut Entry,
    entry: &Entry,
    end: u64,
    duration_ns: u64,
    result: i32,
) -> bool {
    let (sampled, epoch) = sample(pid, window, end);
    if result != 0 {
        return true;
    }
    let stream = stream_of(entry.cookie, entry.args[5]);
    if entry.last_stream != stream || entry.last_epoch != epoch {
        // SAFETY: the thread's own slot (see `entry::save`), valid while this program runs.
        unsafe {
            (*slot).last_stream = stream;
            (*slot).last_epoch = epoch;
        }
        return true;
    }
    let slow_us = config(CONFIG_SLOW_US);
    sampled || (slow_us != 0 && duration_ns >= u64::from(slow_us) * 1_000)
}

/// Brings a thread's last-launch fields up to date after a launch a session's entry already
/// chose to write (see [`wanted`]).
#[inline(always)]
pub fn note_stream(window: Option<*mut ProcWindow>, slot: *mut Entry, entry: &Entry) {
    // SAFETY: a plain read of a map value that stays valid while this program runs.
    let epoch = window.map_or(entry.last_epoch, |w| unsafe { (*w).epoch });
    // SAFETY: the thread's own slot (see `entry::save`), valid while this program runs.
    unsafe {
        (*slot).last_stream = stream_of(entry.cookie, entry.args[5]);
        (*slot).last_epoch = epoch;
    }
}

/// Counts a launch in its process's one-second window at a session's entry: (whether it is
/// sampled, the epoch). The first `CONFIG_SAMPLE_FIRST` of each second are; past those, each
/// is with probability one in `CONFIG_SAMPLE_EVERY`, drawn at random (every n-th call would
/// alias with a step of n kernels, and time only one of them).
#[inline(always)]
pub fn sample_at_random(pid: u32, window: Option<*mut ProcWindow>, now: u64) -> (bool, u64) {
    let (count, epoch) = tick(pid, window, now);
    let first = u64::from(config(CONFIG_SAMPLE_FIRST));
    let every = config(CONFIG_SAMPLE_EVERY);
    // SAFETY: bpf_get_prandom_u32 has no preconditions.
    let drawn = every != 0 && unsafe { bpf_get_prandom_u32() } % every == 0;
    (count <= first || drawn, epoch)
}

/// Counts a launch in its process's one-second window (made on its first): (its count in the
/// window, the epoch).
#[inline(always)]
pub fn tick(pid: u32, window: Option<*mut ProcWindow>, now: u64) -> (u64, u64) {
    let Some(w) = window else {
        let _ = PROCS.insert(
            &pid,
            &ProcWindow {
                start_ns: now,
                count: 1,
                epoch: now,
                capturing: 0,
            },
            0,
        );
        return (1, now);
    };
    // SAFETY: the value stays valid while this program runs; a concurrent update from another
    // CPU can only be lost, which moves a sample, never a count.
    unsafe {
        if now.wrapping_sub((*w).start_ns) >= 1_000_000_000 {
            (*w).start_ns = now;
            (*w).count = 0;
        }
        (*w).count += 1;
        ((*w).count, (*w).epoch)
    }
}

/// Counts a launch in its process's one-second window: (whether it is sampled, the epoch).
#[inline(always)]
fn sample(pid: u32, window: Option<*mut ProcWindow>, now: u64) -> (bool, u64) {
    let (count, epoch) = tick(pid, window, now);
    if window.is_none() {
        // A process's first launch is written.
        return (true, epoch);
    }
    let first = u64::from(config(CONFIG_SAMPLE_FIRST));
    let every = u64::from(config(CONFIG_SAMPLE_EVERY));
    (
        count <= first || (every != 0 && (count - first) % every == 0),
        epoch,
    )
}

/// A successful wait that closes stream batches returned: the process's epoch changes, so that
/// each thread's next launch is written.
#[inline(always)]
pub fn close(pid: u32) {
    if let Some(w) = PROCS.get_ptr_mut(&pid) {
        // SAFETY: as in `sample`. A change lost to a race with another CPU's wait is made by
        // that wait.
        unsafe { (*w).epoch = (*w).epoch.wrapping_add(1) };
    }
}

/// `pid`'s sampling window (`PROCS`), when it has one: looked up once per launch.
#[inline(always)]
pub fn window(pid: u32) -> Option<*mut ProcWindow> {
    PROCS.get_ptr_mut(&pid)
}

/// Whether a stream capture is in progress in the process of `window` (its launches are then
/// written whole).
#[inline(always)]
pub fn capturing(window: Option<*mut ProcWindow>) -> bool {
    // SAFETY: a plain read of a map value that stays valid while this program runs.
    window.is_some_and(|w| unsafe { (*w).capturing } != 0)
}

/// A stream capture began (`begun`) or ended in `pid`. A lost race with another CPU's change
/// can only leave the count off by one until the process's next capture ends.
#[inline(always)]
pub fn capture(pid: u32, now: u64, begun: bool) {
    if PROCS.get_ptr_mut(&pid).is_none() && begun {
        let _ = PROCS.insert(
            &pid,
            &ProcWindow {
                start_ns: now,
                count: 0,
                epoch: now,
                capturing: 0,
            },
            BPF_NOEXIST,
        );
    }
    if let Some(w) = PROCS.get_ptr_mut(&pid) {
        // SAFETY: as in `sample`.
        unsafe {
            (*w).capturing = if begun {
                (*w).capturing.saturating_add(1)
            } else {
                (*w).capturing.saturating_sub(1)
            };
        }
    }
}
