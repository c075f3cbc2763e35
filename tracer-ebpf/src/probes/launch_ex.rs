//! Entry program for `cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, ...)`.
//! `CUlaunchConfig` starts with seven `unsigned int` (grid x/y/z, block x/y/z, sharedMemBytes),
//! then `CUstream hStream` at offset 32: its first 40 bytes, read as five u64, already hold the
//! packed launch layout of tracer-common.
use aya_ebpf::{helpers::bpf_probe_read_user, macros::uprobe, programs::ProbeContext};
use aya_log_ebpf::warn;
use tracer_common::Entry;

use crate::entry::{arg, save};

#[uprobe]
pub fn cuda_launch_ex(ctx: ProbeContext) -> u32 {
    let slot = try_cuda_launch_ex(&ctx);
    if crate::window::closed() {
        crate::window::outside(&ctx, slot);
    }
    0
}

/// Saves the launch's entry state; the thread's slot when it holds it.
#[inline(always)]
pub fn try_cuda_launch_ex(ctx: &ProbeContext) -> Option<*mut Entry> {
    let config = arg(ctx, 0);
    let words: [u64; 5] = if config == 0 {
        [0; 5]
    } else {
        // SAFETY: bpf_probe_read_user copies from user memory with fault handling: a bad
        // pointer from the caller is an error, which leaves the dimensions 0.
        match unsafe { bpf_probe_read_user(config as *const [u64; 5]) } {
            Ok(w) => w,
            Err(e) => {
                warn!(
                    ctx,
                    "cuLaunchKernelEx: cannot read its CUlaunchConfig at {:x} ({}); recorded as 0",
                    config,
                    e
                );
                [0; 5]
            }
        }
    };
    save(
        ctx,
        [
            arg(ctx, 1),
            words[0],
            words[1],
            words[2],
            words[3] as u32 as u64,
            words[4],
        ],
    )
}
