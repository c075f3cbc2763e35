//! The open hook of discovery on the kernel's open path (a kprobe_multi link on
//! `do_sys_openat2`, which `open`, `openat` and `openat2` all pass through): only opens run it,
//! and every other system call of the node pays nothing. Its second argument is the user-space
//! path, read as the `sys_enter` hook reads it (`opened::report_if_libcuda`).
use aya_ebpf::{macros::kprobe, programs::ProbeContext};

use super::opened::report_if_libcuda;

#[kprobe]
pub fn cuda_opened_path(ctx: ProbeContext) -> u32 {
    try_cuda_opened_path(&ctx);
    0
}

#[inline(always)]
fn try_cuda_opened_path(ctx: &ProbeContext) {
    // do_sys_openat2(int dfd, const char __user *filename, struct open_how *how)
    let Some(filename) = ctx.arg::<u64>(1) else {
        return;
    };
    report_if_libcuda(filename);
}
