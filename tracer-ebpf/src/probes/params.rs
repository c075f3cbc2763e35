//! The copies whose sizes sit in memory, read at entry for `registers`: a 2-D or 3-D copy's
//! memory types and extents from the `CUDA_MEMCPY2D`/`CUDA_MEMCPY3D` its first argument points
//! to, and a batch's sizes, summed (at most `BATCH_SIZES_MAX` of them), with its stream from
//! argument 7 or 8. The record's arguments are laid out as `tracer_common::params` says.
use aya_ebpf::{helpers::bpf_probe_read_user, programs::ProbeContext};
use tracer_common::{
    api::{COOKIE_BATCH, COOKIE_BATCH_FAIL_IDX, COOKIE_PARAMS_3D},
    callconv::LAUNCH_STACK_WORDS,
    params::{BATCH_SIZES_MAX, MEMCPY2D_OFFSETS, MEMCPY3D_DEPTH, MEMCPY3D_OFFSETS},
};

use crate::{
    arch::{stack_pointer, CONV},
    entry::arg,
};

/// The 64-bit word at `at` in the probed process, or `None` when it cannot be read.
#[inline(always)]
fn word(at: u64) -> Option<u64> {
    // SAFETY: bpf_probe_read_user copies from user memory with fault handling: a bad address
    // (a tenant's garbage pointer included) is an error, never a fault.
    unsafe { bpf_probe_read_user(at as *const u64) }.ok()
}

/// The record's arguments of the call whose cookie is `cookie`.
#[inline(always)]
pub fn read(ctx: &ProbeContext, cookie: u64) -> [u64; 6] {
    if cookie & COOKIE_BATCH != 0 {
        return batch(ctx, cookie);
    }
    let p = arg(ctx, 0);
    let (at, depth) = if cookie & COOKIE_PARAMS_3D != 0 {
        (MEMCPY3D_OFFSETS, word(p + MEMCPY3D_DEPTH).unwrap_or(0))
    } else {
        (MEMCPY2D_OFFSETS, 1)
    };
    let read = |i: usize| word(p + at[i]).unwrap_or(0);
    // The memory types are 32-bit enums: the padding after them is not theirs.
    let types = (read(0) & 0xffff_ffff) | (read(1) << 32);
    [types, read(2), read(3), depth, arg(ctx, 1), p]
}

/// A batch `(dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs[, failIdx], hStream)`.
#[inline(always)]
fn batch(ctx: &ProbeContext, cookie: u64) -> [u64; 6] {
    let (sizes, count) = (arg(ctx, 2), arg(ctx, 3));
    let at = stack_pointer(ctx) + CONV.stack_offset;
    // SAFETY: as in `word`; an unreadable stack leaves the stream 0.
    let stack: [u64; LAUNCH_STACK_WORDS] =
        unsafe { bpf_probe_read_user(at as *const [u64; LAUNCH_STACK_WORDS]) }
            .unwrap_or([0; LAUNCH_STACK_WORDS]);
    let n = if cookie & COOKIE_BATCH_FAIL_IDX != 0 {
        8
    } else {
        7
    };
    let stream = CONV.arg(n, |i| arg(ctx, i), &stack);
    let (mut sum, mut read) = (0u64, 0u64);
    for i in 0..BATCH_SIZES_MAX as u64 {
        if i >= count {
            break;
        }
        match word(sizes + i * 8) {
            Some(v) => sum = sum.saturating_add(v),
            None => break,
        }
        read += 1;
    }
    [sum, count, read, 0, stream, sizes]
}
