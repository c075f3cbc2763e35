//! Entry program for `cuLaunchKernel`-shaped calls: `(f, gridX, gridY, gridZ, blockX, blockY,
//! blockZ, sharedMemBytes, hStream, ...)`. Arguments past the registers are on the user stack:
//! on x86-64 blockZ, sharedMemBytes and hStream at rsp+8, rsp+16, rsp+24 (rsp points at the
//! return address at entry); on aarch64 only hStream, at sp (the return address is in x30).
//! Which is which is `crate::arch::CONV` (tracer-common's `callconv`, unit-tested there).
use aya_ebpf::{helpers::bpf_probe_read_user, macros::uprobe, programs::ProbeContext};
use aya_log_ebpf::warn;
use tracer_common::callconv::LAUNCH_STACK_WORDS;
use tracer_common::Entry;

use crate::{
    arch::{stack_pointer, CONV},
    entry::{arg, save},
};

#[uprobe]
pub fn cuda_launch(ctx: ProbeContext) -> u32 {
    let slot = try_cuda_launch(&ctx);
    if crate::window::closed() {
        crate::window::outside(&ctx, slot);
    }
    0
}

/// Saves the launch's entry state; the thread's slot when it holds it.
#[inline(always)]
pub fn try_cuda_launch(ctx: &ProbeContext) -> Option<*mut Entry> {
    let at = stack_pointer(ctx) + CONV.stack_offset;
    // SAFETY: bpf_probe_read_user copies from user memory with fault handling: a bad address is
    // an error, never a fault. One read for the stack words; a fault leaves them 0 rather than
    // losing the call.
    let stack: [u64; LAUNCH_STACK_WORDS] =
        match unsafe { bpf_probe_read_user(at as *const [u64; LAUNCH_STACK_WORDS]) } {
            Ok(s) => s,
            Err(e) => {
                warn!(
                    ctx,
                    "cuLaunchKernel: cannot read the stack arguments at {:x} ({}); recorded as 0",
                    at,
                    e
                );
                [0; LAUNCH_STACK_WORDS]
            }
        };
    save(ctx, CONV.launch_args(|n| arg(ctx, n), &stack))
}
