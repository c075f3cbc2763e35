//! `task_rename`: a traced process's leader changed its name. Records carry no name (reading
//! it on every call costs the traced thread), so user space hears of the change here.
use crate::maps::{emit_name, over_rate, rate_limited, TRACKED};
use aya_ebpf::{
    helpers::{
        bpf_get_current_pid_tgid, bpf_probe_read_kernel_str_bytes, generated::bpf_ktime_get_ns,
    },
    macros::raw_tracepoint,
    programs::RawTracePointContext,
};

#[raw_tracepoint(tracepoint = "task_rename")]
pub fn cuda_rename(ctx: RawTracePointContext) -> u32 {
    try_cuda_rename(&ctx);
    0
}

#[inline(always)]
fn try_cuda_rename(ctx: &RawTracePointContext) {
    // The renamed task is the caller or a thread of its group (the kernel allows no other), so
    // the caller's tgid is the process. A rename made by the main thread (prctl on itself, or
    // exec) names the process; threads naming themselves do not.
    let id = bpf_get_current_pid_tgid();
    let (pid, tid) = ((id >> 32) as u32, id as u32);
    // SAFETY: the value is only tested for presence.
    if pid != tid || unsafe { TRACKED.get(&pid) }.is_none() {
        return;
    }
    // A tenant renaming itself in a loop is held to the record rate limit like its calls.
    // SAFETY: bpf_ktime_get_ns has no preconditions.
    if over_rate(pid, unsafe { bpf_ktime_get_ns() }) {
        rate_limited(pid);
        return;
    }
    // The tracepoint's arguments are (struct task_struct *task, const char *comm).
    let comm_ptr: u64 = ctx.arg(1);
    let mut comm = [0u8; 16];
    // SAFETY: a faulting kernel read is an error, which leaves the name empty.
    if unsafe { bpf_probe_read_kernel_str_bytes(comm_ptr as *const u8, &mut comm) }.is_err() {
        return;
    }
    emit_name(pid, tid, true, comm);
}
