//! Uprobe-session programs of the launch families (Linux 6.13+, `BPF_TRACE_UPROBE_SESSION`):
//! one program runs at a launch's entry and, only when its entry returns 0, at its return. The
//! entry counts every launch exactly (`crate::session::decide`) and asks for the return only for
//! the launches it samples, those that may open a stream batch, and those it cannot count; so an
//! unsampled launch pays one probe instead of the uprobe and uretprobe pair.
//!
//! Entry and return are told apart without the session kfuncs (which aya-obj does not
//! relocate): at entry the instruction pointer is the probed function's first instruction,
//! which is what `bpf_get_func_ip` reports both times; at return it is the caller's return
//! address, never that.
//!
//! The programs are written without aya's `#[uprobe]` macro, whose wrapper returns 0 whatever
//! the function returns: a session's entry must answer 1 to skip the return.
use core::ffi::c_void;

use aya_ebpf::{
    helpers::generated::bpf_get_func_ip,
    programs::{ProbeContext, RetProbeContext},
    EbpfContext,
};

use tracer_common::Entry;

use super::{launch::try_cuda_launch, launch_ex::try_cuda_launch_ex, ret::try_cuda_ret};
use crate::{arch::entry_ip, session::decide};

/// Whether this run of a session program is the return half.
#[inline(always)]
fn returning(ctx: &ProbeContext) -> bool {
    // SAFETY: the context pointer is the program's own, as bpf_get_func_ip requires.
    let func = unsafe { bpf_get_func_ip(ctx.as_ptr()) };
    entry_ip(ctx) != func
}

/// One session program: the return half, or the entry saved by `save` and then `decide`d.
#[inline(always)]
fn session(ctx: *mut c_void, save: fn(&ProbeContext) -> Option<*mut Entry>) -> u32 {
    let ctx = ProbeContext::new(ctx);
    if returning(&ctx) {
        try_cuda_ret(&RetProbeContext::new(ctx.as_ptr()));
        return 0;
    }
    decide(save(&ctx))
}

/// The session program of `cuLaunchKernel`-shaped calls: its answer at entry is the kernel's.
#[unsafe(no_mangle)]
#[unsafe(link_section = "uprobe")]
pub fn cuda_session(ctx: *mut c_void) -> u32 {
    session(ctx, try_cuda_launch)
}

/// The session program of `cuLaunchKernelEx`.
#[unsafe(no_mangle)]
#[unsafe(link_section = "uprobe")]
pub fn cuda_session_ex(ctx: *mut c_void) -> u32 {
    session(ctx, try_cuda_launch_ex)
}
