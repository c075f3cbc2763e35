//! `cudatrace census`: a count-only entry program on every exported `cu*` symbol, so that a
//! user sees what a workload really calls, traced or not. No entry state, no return probe, no
//! record: one map add per call.
use core::intrinsics::{atomic_xadd, AtomicOrdering};

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, generated::bpf_get_attach_cookie},
    macros::uprobe,
    programs::ProbeContext,
    EbpfContext,
};
use tracer_common::CensusKey;

use crate::maps::CENSUS;

const BPF_NOEXIST: u64 = 1;

#[uprobe]
pub fn cuda_census(ctx: ProbeContext) -> u32 {
    try_cuda_census(&ctx);
    0
}

#[inline(always)]
fn try_cuda_census(ctx: &ProbeContext) {
    // SAFETY: the context pointer is the program's own, as bpf_get_attach_cookie requires.
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    let key = CensusKey {
        pid: (bpf_get_current_pid_tgid() >> 32) as u32,
        symbol: cookie as u32,
    };
    if CENSUS.get_ptr_mut(&key).is_none() {
        // Made at 0 by whichever CPU comes first, then added to like any other; a full map
        // loses the pair's calls (user space says how many pairs it holds).
        let _ = CENSUS.insert(&key, &0, BPF_NOEXIST);
    }
    if let Some(count) = CENSUS.get_ptr_mut(&key) {
        // SAFETY: a map value that stays allocated while this program runs; the atomic add
        // makes adds from several CPUs exact.
        unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(count, 1) };
    }
}
