//! In-kernel aggregation of launches: each launch is added to its `LAUNCHES` cell, and reaches
//! the ring buffer only when it is sampled, slow, failed, or opens a stream batch (which the
//! GPU-time estimate needs). Waits close batches here too, so that the next launch on a stream
//! is known to open one.
use core::intrinsics::{AtomicOrdering, atomic_xadd};

use tracer_common::{
    CONFIG_SAMPLE_EVERY, CONFIG_SAMPLE_FIRST, CONFIG_SLOW_US, Entry,
    api::{COOKIE_API_MASK, COOKIE_CLOSES_ALL, COOKIE_CLOSES_ARG_STREAM, COOKIE_CLOSES_DEFAULT_STREAM, COOKIE_PER_THREAD},
    launches::{LaunchCell, LaunchKey, ProcWindow, StreamKey, latency_bucket},
};

use crate::maps::{LAUNCHES, PROCS, STREAMS, config};

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
/// record, so the launch is still counted once).
#[inline(always)]
pub fn count(pid: u32, entry: &Entry, duration_ns: u64, result: i32) -> bool {
    let key = LaunchKey {
        pid,
        api: (entry.cookie & COOKIE_API_MASK) as u16,
        bucket: latency_bucket(duration_ns) as u16,
        function: entry.args[0],
    };
    let cell = match LAUNCHES.get_ptr_mut(&key) {
        Some(c) => c,
        None => {
            // Made empty, then added to like any other: a CPU that made it meanwhile wins, and
            // both adds land.
            let _ = LAUNCHES.insert(&key, &LaunchCell::default(), BPF_NOEXIST);
            match LAUNCHES.get_ptr_mut(&key) {
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
        }
        add(core::ptr::addr_of_mut!((*cell).sum_ns), duration_ns);
    }
    true
}

/// The stream key of `stream` for the calling thread, as the GPU-time estimate keys streams.
#[inline(always)]
fn stream_key(pid: u32, tid: u32, cookie: u64, stream: u64) -> StreamKey {
    let per_thread = cookie & COOKIE_PER_THREAD != 0;
    let (stream, tid) = match stream {
        0 if per_thread => (STREAM_PER_THREAD, tid),
        0 => (STREAM_LEGACY, 0),
        STREAM_PER_THREAD => (STREAM_PER_THREAD, tid),
        s => (s, 0),
    };
    StreamKey { pid, tid, stream }
}

/// Whether a counted launch is written to the ring buffer: it opens its stream's batch, or is
/// among the first `CONFIG_SAMPLE_FIRST` of its process this second, or one in
/// `CONFIG_SAMPLE_EVERY` past those, or slower than `CONFIG_SLOW_US`, or failed.
#[inline(always)]
pub fn wanted(pid: u32, tid: u32, entry: &Entry, end: u64, duration_ns: u64, result: i32) -> bool {
    let (sampled, epoch) = sample(pid, end);
    if result != 0 {
        return true;
    }
    let key = stream_key(pid, tid, entry.cookie, entry.args[5]);
    // SAFETY: the value is copied out at once.
    let opens = match unsafe { STREAMS.get(&key) } {
        Some(e) => *e != epoch,
        None => true,
    };
    if opens {
        let _ = STREAMS.insert(&key, &epoch, 0);
        return true;
    }
    let slow_us = config(CONFIG_SLOW_US);
    sampled || (slow_us != 0 && duration_ns >= u64::from(slow_us) * 1_000)
}

/// Counts a launch in its process's one-second window: (whether it is sampled, the epoch).
#[inline(always)]
fn sample(pid: u32, now: u64) -> (bool, u64) {
    let Some(w) = PROCS.get_ptr_mut(&pid) else {
        let _ = PROCS.insert(&pid, &ProcWindow { start_ns: now, count: 1, epoch: 0 }, 0);
        return (true, 0);
    };
    // SAFETY: the value stays valid while this program runs; a concurrent update from another
    // CPU can only be lost, which moves a sample, never a count.
    let (count, epoch) = unsafe {
        if now.wrapping_sub((*w).start_ns) >= 1_000_000_000 {
            (*w).start_ns = now;
            (*w).count = 0;
        }
        (*w).count += 1;
        ((*w).count, (*w).epoch)
    };
    let first = u64::from(config(CONFIG_SAMPLE_FIRST));
    let every = u64::from(config(CONFIG_SAMPLE_EVERY));
    (count <= first || (every != 0 && (count - first) % every == 0), epoch)
}

/// A successful wait returned: closes the batches it covers, so that the next launch on them
/// opens a new one (and is written).
#[inline(always)]
pub fn close(pid: u32, tid: u32, entry: &Entry) {
    if entry.cookie & COOKIE_CLOSES_ALL != 0 {
        if let Some(w) = PROCS.get_ptr_mut(&pid) {
            // SAFETY: as in `sample`.
            unsafe { (*w).epoch += 1 };
        }
    } else if entry.cookie & COOKIE_CLOSES_ARG_STREAM != 0 {
        let _ = STREAMS.remove(&stream_key(pid, tid, entry.cookie, entry.args[0]));
    } else if entry.cookie & COOKIE_CLOSES_DEFAULT_STREAM != 0 {
        let _ = STREAMS.remove(&stream_key(pid, tid, entry.cookie, 0));
    }
}
