//! `sched_process_exit`: drops the entry state of a thread that dies inside a driver call, and
//! tells user space when a process it tracks exits, so that its tables die with it.
use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid, macros::raw_tracepoint, programs::RawTracePointContext,
};
use aya_log_ebpf::debug;
use tracer_common::{EventTag, ExitEvent};

use crate::maps::{dropped, ENTRIES, EVENTS, TRACKED};

#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn cuda_exit(ctx: RawTracePointContext) -> u32 {
    try_cuda_exit(&ctx);
    0
}

#[inline(always)]
fn try_cuda_exit(ctx: &RawTracePointContext) {
    let id = bpf_get_current_pid_tgid();
    let _ = ENTRIES.remove(&id);
    let (pid, tid) = ((id >> 32) as u32, id as u32);
    // The leader's exit stands for the process's: reported once, for tracked processes only.
    // SAFETY: the value is only tested for presence, never read through the reference.
    if pid != tid || unsafe { TRACKED.get(&pid) }.is_none() {
        return;
    }
    let _ = TRACKED.remove(&pid);
    debug!(ctx, "tracked process {} exited", pid);
    match EVENTS.reserve::<ExitEvent>(0) {
        Some(mut slot) => {
            slot.write(ExitEvent {
                tag: EventTag::Exit as u32,
                pid,
            });
            slot.submit(0);
        }
        None => dropped(pid),
    }
}
