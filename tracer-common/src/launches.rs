//! In-kernel aggregation of kernel launches: the keys and cells of the `LAUNCHES` map, the
//! per-process sampling window and wait epoch of `PROCS`, and the latency buckets both sides
//! share.
//!
//! Buckets hold two significant decimal digits of a duration in nanoseconds: (10, 11], (11, 12],
//! ..., (99, 100], (100, 110], ... up to 100 s. Every upper bound of the Prometheus latency
//! buckets (1, 2.5 and 5 times a power of ten) is the upper bound of one of them, so a bucket's
//! Prometheus bucket is exact; a quantile read from them is within 10% (5% from the midpoint).

/// Number of latency buckets; durations past 100 s count in the last.
pub const LATENCY_BUCKETS: u32 = 910;

/// The latency bucket of a duration of `ns` nanoseconds (upper bound inclusive). Written as
/// straight-line compares so that the eBPF verifier sees no loop.
#[inline(always)]
pub fn latency_bucket(ns: u64) -> u32 {
    let u = ns.saturating_sub(1);
    if u < 10 {
        return u as u32;
    }
    // 10^k <= u < 10^(k+1); the two leading digits are u / 10^(k-1).
    let (k, scale): (u32, u64) = if u < 100 {
        (1, 1)
    } else if u < 1_000 {
        (2, 10)
    } else if u < 10_000 {
        (3, 100)
    } else if u < 100_000 {
        (4, 1_000)
    } else if u < 1_000_000 {
        (5, 10_000)
    } else if u < 10_000_000 {
        (6, 100_000)
    } else if u < 100_000_000 {
        (7, 1_000_000)
    } else if u < 1_000_000_000 {
        (8, 10_000_000)
    } else if u < 10_000_000_000 {
        (9, 100_000_000)
    } else if u < 100_000_000_000 {
        (10, 1_000_000_000)
    } else {
        return LATENCY_BUCKETS - 1;
    };
    let m = (u / scale) as u32;
    10 + (k - 1) * 90 + (m - 10)
}

/// (exclusive lower, inclusive upper) bounds of a latency bucket, ns.
pub fn bucket_bounds(index: u32) -> (u64, u64) {
    let index = if index >= LATENCY_BUCKETS {
        LATENCY_BUCKETS - 1
    } else {
        index
    };
    if index < 10 {
        return (u64::from(index), u64::from(index) + 1);
    }
    let i = index - 10;
    let scale = 10u64.pow(i / 90);
    let m = u64::from(i % 90 + 10);
    (m * scale, (m + 1) * scale)
}

/// Key of a `LAUNCHES` cell: one (process, api, kernel handle, latency bucket).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LaunchKey {
    /// Process id.
    pub pid: u32,
    /// The [`crate::Api`] id.
    pub api: u16,
    /// [`latency_bucket`] of the launches counted.
    pub bucket: u16,
    /// `CUfunction` handle (or `CUkernel`) launched.
    pub function: u64,
}

/// Cumulative counts of one `LAUNCHES` key, added to atomically by every CPU; user space reads
/// the difference since its last read and deletes the cells of exited processes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LaunchCell {
    /// Launches.
    pub count: u64,
    /// Of which returned an error.
    pub errors: u64,
    /// Sum of their durations, ns.
    pub sum_ns: u64,
    /// Threads the successful ones asked for: the sum of [`threads`] (grid x block) per launch.
    pub threads: u64,
}

/// Most blocks one launch counts for: a grid's x, y and z are multiplied in steps, each capped
/// here, so that no argument a caller passes can overflow the product.
pub const MAX_BLOCKS: u64 = 1 << 40;
/// Most threads per block one launch counts for (the hardware's limit is 1,024).
pub const MAX_BLOCK_THREADS: u64 = 1 << 10;

#[inline(always)]
fn capped(a: u64, b: u64, cap: u64) -> u64 {
    // A factor capped at 2^40 times one at 2^32 need not fit in 64 bits: over the cap is
    // found by a division first (no 128-bit multiply in eBPF).
    let (a, b) = (
        if a > cap { cap } else { a },
        if b > 0xffff_ffff { 0xffff_ffff } else { b },
    );
    let p = if b != 0 && a > cap / b { cap } else { a * b };
    if p > cap {
        cap
    } else {
        p
    }
}

/// The threads a launch record asks for (grid x*y*z times block x*y*z, each part capped at
/// [`MAX_BLOCKS`] and [`MAX_BLOCK_THREADS`]): the submitted work the causal verdicts compare.
/// `args` in the launch layout of [`crate::CallEvent`]. Straight-line code for the verifier.
#[inline(always)]
pub fn threads(args: &[u64; 6]) -> u64 {
    let (gx, gy, gz) = (args[1] & 0xffff_ffff, args[1] >> 32, args[2] & 0xffff_ffff);
    let (bx, by, bz) = (args[2] >> 32, args[3] & 0xffff_ffff, args[3] >> 32);
    let blocks = capped(capped(gx, gy, MAX_BLOCKS), gz, MAX_BLOCKS);
    let per_block = capped(capped(bx, by, MAX_BLOCK_THREADS), bz, MAX_BLOCK_THREADS);
    blocks * per_block
}

/// One process's launch-sampling window and context-wait epoch (`PROCS`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcWindow {
    /// When the current one-second window began (CLOCK_MONOTONIC ns).
    pub start_ns: u64,
    /// Launches in it.
    pub count: u64,
    /// Changes with every successful wait that closes a stream batch (a stream or context
    /// synchronize, a synchronous copy): a thread whose last launch saw another epoch may be
    /// opening a batch, and its launch is written. (It starts at the window's first time, so a
    /// remade entry never matches an old one.)
    pub epoch: u64,
    /// Stream captures begun and not yet ended in the process: while any is, its launches are
    /// written whole (never counted in `LAUNCHES`), so that user space can tell the captured
    /// ones, which run nothing, from those that run.
    pub capturing: u64,
}

/// Flag of [`crate::CallEvent::flags`]: the call is already counted in `LAUNCHES`; the record
/// is a sample (or opens a stream batch) and must not be counted again.
pub const FLAG_COUNTED: u32 = 1;
/// Flag of [`crate::CallEvent::flags`]: a successful poll that followed `CUDA_ERROR_NOT_READY`
/// answers on its thread (their count is `flags >> POLLS_SHIFT`): the work finished while polled.
pub const FLAG_AFTER_NOT_READY: u32 = 2;
/// Flag of [`crate::CallEvent::flags`]: written at the launch's entry, outside a window of the
/// pair (no return probe ran): its start is true, its duration (0) and result (0) unknown.
pub const FLAG_UNTIMED: u32 = 4;
/// Where the count of `CUDA_ERROR_NOT_READY` answers sits in the flags of a poll's record.
pub const POLLS_SHIFT: u32 = 8;

/// `LaunchKey::bucket` of a process's overflow cell of one launch api: its launches past its
/// quota of cells (`CONFIG_CELL_QUOTA`), whatever their kernel and latency. Real buckets are
/// far below it; such a cell does not count against the quota (a process has at most one per
/// launch entry point).
pub const OVERFLOW_BUCKET: u16 = u16::MAX;
/// `LaunchKey::bucket` of the launches a uprobe session's entry counted without asking for
/// their return: their count and threads are exact, their durations and results unknown (user
/// space spreads them over the sampled launches' buckets of the same kernel). Counts against
/// the quota like a bucket.
pub const UNTIMED_BUCKET: u16 = u16::MAX - 1;
/// `LaunchKey::function` of an overflow cell.
pub const OVERFLOW_FUNCTION: u64 = u64::MAX;
/// Default quota of `LAUNCHES` cells per process: eight processes at their quota fill the map.
pub const DEFAULT_CELLS_PER_PROCESS: u32 = 16_384;

/// Capacity of `LAUNCHES` (allocated as used). A launch finding it full is written to the ring
/// buffer as a full record instead, so it is still counted once.
pub const MAX_LAUNCH_CELLS: u32 = 131_072;
/// Capacity of the LRU map of per-process sampling windows.
pub const MAX_SAMPLED_PROCS: u32 = 16_384;

const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(size_of::<LaunchKey>() == 16 && offset_of!(LaunchKey, function) == 8);
    assert!(size_of::<LaunchCell>() == 32 && size_of::<ProcWindow>() == 32);
};

#[cfg(feature = "user")]
mod pod {
    // SAFETY: plain `#[repr(C)]` integers without padding; any bit pattern is valid.
    unsafe impl aya::Pod for super::LaunchKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::LaunchCell {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::ProcWindow {}
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;

    #[test]
    fn buckets_hold_two_digits_and_round_trip() {
        assert_eq!(
            (latency_bucket(0), latency_bucket(1), latency_bucket(10)),
            (0, 0, 9)
        );
        assert_eq!(bucket_bounds(latency_bucket(11)), (10, 11));
        assert_eq!(bucket_bounds(latency_bucket(1_556)), (1_500, 1_600));
        assert_eq!(bucket_bounds(latency_bucket(1_600)), (1_500, 1_600));
        assert_eq!(bucket_bounds(latency_bucket(1_601)), (1_600, 1_700));
        assert_eq!(latency_bucket(u64::MAX), LATENCY_BUCKETS - 1);
        assert_eq!(bucket_bounds(LATENCY_BUCKETS - 1).1, 100_000_000_000);
        // Every value falls inside its bucket, and buckets are ordered and contiguous.
        let mut v = 1u64;
        while v < 200_000_000_000 {
            let (lo, hi) = bucket_bounds(latency_bucket(v));
            assert!(
                v > lo && (v <= hi || v > 100_000_000_000),
                "{v} in ({lo}, {hi}]"
            );
            v = v * 13 / 10 + 1;
        }
        for i in 1..LATENCY_BUCKETS {
            assert_eq!(bucket_bounds(i - 1).1, bucket_bounds(i).0, "bucket {i}");
        }
    }

    #[test]
    fn threads_multiply_grid_and_block_and_never_overflow() {
        use crate::event::pack;
        let args = |g: [u32; 3], b: [u32; 3]| {
            [
                0,
                pack(g[0], g[1]),
                pack(g[2], b[0]),
                pack(b[1], b[2]),
                0,
                0,
            ]
        };
        assert_eq!(threads(&args([64, 2, 1], [128, 1, 1])), 64 * 2 * 128);
        assert_eq!(threads(&args([1000, 2, 3], [32, 8, 2])), 6000 * 512);
        assert_eq!(threads(&args([0, 1, 1], [1, 1, 1])), 0);
        let max = threads(&args([u32::MAX; 3], [u32::MAX; 3]));
        assert_eq!(max, MAX_BLOCKS * MAX_BLOCK_THREADS);
        // 2^14 of the largest still add up without wrapping a u64.
        assert!(max.checked_mul(1 << 13).is_some());
    }

    #[test]
    fn prometheus_bounds_are_bucket_bounds() {
        // 1 µs to 10 s at 1, 2.5 and 5 per decade.
        for ns in [
            1_000u64,
            2_500,
            5_000,
            10_000,
            25_000,
            50_000,
            250_000_000,
            5_000_000_000,
            10_000_000_000,
        ] {
            assert_eq!(bucket_bounds(latency_bucket(ns)).1, ns);
            assert_eq!(bucket_bounds(latency_bucket(ns + 1)).0, ns);
        }
    }
}
