//! Discovery's exec hook (`sched_process_exec`, a raw tracepoint: only executions run it): names
//! each process that executed a file not executed before, so that user space finds its loader
//! and, if it is new, hooks it (`loaded`). The file is known by its filesystem's device and its
//! inode, read through the offsets user space took from the kernel's BTF; each is said once
//! (`EXES`). An execution also forgets what the loader hook saw of the process.
use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_kernel, generated::bpf_ktime_get_ns},
    macros::raw_tracepoint,
    programs::RawTracePointContext,
};
use tracer_common::opens::{
    ExeKey, EXEC_BPRM_FILE, EXEC_FILE_INODE, EXEC_INODE_INO, EXEC_INODE_SB, EXEC_READY,
    EXEC_SB_DEV, EXEC_WAKE_GAP_NS, EXEC_WOKE, OPEN_KIND_EXEC,
};

use super::opened::emit;
use crate::maps::{EXEC_CONFIG, EXES, LOADED};

const BPF_RB_NO_WAKEUP: u64 = 1;

#[raw_tracepoint(tracepoint = "sched_process_exec")]
pub fn cuda_exec(ctx: RawTracePointContext) -> u32 {
    try_cuda_exec(&ctx);
    0
}

/// An `EXEC_CONFIG` slot (0 when unset).
#[inline(always)]
fn config(slot: u32) -> u64 {
    EXEC_CONFIG.get(slot).copied().unwrap_or(0)
}

/// A kernel word of type `T` at `at`.
#[inline(always)]
fn kernel<T>(at: u64) -> Option<T> {
    // SAFETY: a faulting kernel read is an error, returned as None.
    unsafe { bpf_probe_read_kernel(at as *const T) }.ok()
}

#[inline(always)]
fn try_cuda_exec(ctx: &RawTracePointContext) {
    let id = bpf_get_current_pid_tgid();
    let pid = (id >> 32) as u32;
    let _ = LOADED.remove(&pid);
    if config(EXEC_READY) != 1 {
        return;
    }
    // The tracepoint's arguments are (struct task_struct *p, pid_t old_pid,
    // struct linux_binprm *bprm).
    let bprm: u64 = ctx.arg(2);
    let Some(file) = kernel::<u64>(bprm + config(EXEC_BPRM_FILE)) else {
        return;
    };
    let Some(inode) = kernel::<u64>(file + config(EXEC_FILE_INODE)) else {
        return;
    };
    let (Some(ino), Some(sb)) = (
        kernel::<u64>(inode + config(EXEC_INODE_INO)),
        kernel::<u64>(inode + config(EXEC_INODE_SB)),
    ) else {
        return;
    };
    let Some(dev) = kernel::<u32>(sb + config(EXEC_SB_DEV)) else {
        return;
    };
    let exe = ExeKey {
        dev: dev as u64,
        ino,
    };
    // SAFETY: the value is not kept.
    if unsafe { EXES.get(&exe) }.is_some() {
        return;
    }
    let _ = EXES.insert(&exe, &1, 0);
    // SAFETY: bpf_ktime_get_ns has no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    // An execution wakes the reader at most every EXEC_WAKE_GAP_NS; the reader, once woken,
    // reads again within that time, so what came between waits no longer.
    let flags = match EXEC_CONFIG.get_ptr_mut(EXEC_WOKE) {
        // SAFETY: an array slot that stays allocated; a race between CPUs only wakes once more.
        Some(woke) if now.wrapping_sub(unsafe { *woke }) < EXEC_WAKE_GAP_NS => BPF_RB_NO_WAKEUP,
        Some(woke) => {
            // SAFETY: as above.
            unsafe { *woke = now };
            0
        }
        None => 0,
    };
    if !emit(id, OPEN_KIND_EXEC, exe, flags) {
        // Said again at its next execution.
        let _ = EXES.remove(&exe);
    }
}
