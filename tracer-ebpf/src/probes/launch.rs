//! Entry program for `cuLaunchKernel`-shaped calls: `(f, gridX, gridY, gridZ, blockX, blockY,
//! blockZ, sharedMemBytes, hStream, ...)`. blockZ, sharedMemBytes and hStream are arguments 6-8,
//! on the user stack at rsp+8, rsp+16, rsp+24 (rsp points at the return address at entry).
use aya_ebpf::{helpers::bpf_probe_read_user, macros::uprobe, programs::ProbeContext};
use aya_log_ebpf::warn;
use tracer_common::event::pack;

use crate::entry::{arg, save};

#[uprobe]
pub fn cuda_launch(ctx: ProbeContext) -> u32 {
    try_cuda_launch(&ctx);
    0
}

#[inline(always)]
fn try_cuda_launch(ctx: &ProbeContext) {
    // SAFETY: `ctx.regs` points at the probed thread's saved registers, valid (and only read)
    // for the duration of the program.
    let sp = unsafe { (*ctx.regs).rsp };
    // SAFETY: bpf_probe_read_user copies from user memory with fault handling: a bad address is
    // an error, never a fault. One read for the three stack slots; a fault leaves them 0 rather
    // than losing the call.
    let stack: [u64; 3] = match unsafe { bpf_probe_read_user((sp + 8) as *const [u64; 3]) } {
        Ok(s) => s,
        Err(e) => {
            warn!(
                ctx,
                "cuLaunchKernel: cannot read the stack arguments at {:x} ({}); recorded as 0",
                sp + 8,
                e
            );
            [0; 3]
        }
    };
    save(
        ctx,
        [
            arg(ctx, 0),
            pack(arg(ctx, 1) as u32, arg(ctx, 2) as u32),
            pack(arg(ctx, 3) as u32, arg(ctx, 4) as u32),
            pack(arg(ctx, 5) as u32, stack[0] as u32),
            stack[1] as u32 as u64,
            stack[2],
        ],
    );
}
