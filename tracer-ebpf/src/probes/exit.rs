//! `sched_process_exit`: drops the entry state of a thread that dies inside a driver call (a
//! launch it was in is counted, untimed), and
//! tells user space when a process it tracks exits, so that its tables die with it.
use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_get_current_task, bpf_probe_read_kernel},
    macros::raw_tracepoint,
    programs::RawTracePointContext,
};
use aya_log_ebpf::debug;
use tracer_common::{EventTag, ExitEvent, CONFIG_EXIT_CODE_OFFSET, EXIT_STATUS_KNOWN};

use crate::{
    maps::{config, dropped, ENTRIES, EVENTS, TRACKED},
    slots,
};

#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn cuda_exit(ctx: RawTracePointContext) -> u32 {
    try_cuda_exit(&ctx);
    0
}

#[inline(always)]
fn try_cuda_exit(ctx: &RawTracePointContext) {
    let id = bpf_get_current_pid_tgid();
    let (pid, tid) = ((id >> 32) as u32, id as u32);
    // SAFETY: the thread's own slot, read while this program runs; a launch it was in is
    // counted (untimed: its return will never come). The slot goes back to the cgroup it was
    // taken from, wherever the thread is now.
    if let Some(entry) = unsafe { ENTRIES.get(&id) } {
        if entry.start_ns != 0 {
            crate::entry::counted_late(id, entry);
        }
        let cgroup = entry.cgroup;
        if ENTRIES.remove(&id).is_ok() {
            slots::give_back(pid, cgroup);
        }
    }
    if pid == tid {
        slots::forget(pid);
    }
    // The leader's exit stands for the process's: reported once, for tracked processes only.
    // SAFETY: the value is only tested for presence, never read through the reference.
    if pid != tid || unsafe { TRACKED.get(&pid) }.is_none() {
        return;
    }
    let _ = TRACKED.remove(&pid);
    debug!(ctx, "tracked process {} exited", pid);
    // The exit status, set before this tracepoint: at the offset user space found in the
    // kernel's BTF (bounded: a task_struct is a few KiB).
    let offset = config(CONFIG_EXIT_CODE_OFFSET);
    let (status, flags) = if offset != 0 && offset < 16384 {
        // SAFETY: the helper takes no arguments and returns the current task's address.
        let task = unsafe { bpf_get_current_task() } as *const u8;
        // SAFETY: a read of the current task's memory through the helper, which fails rather
        // than faults; the offset comes from the running kernel's own BTF.
        match unsafe { bpf_probe_read_kernel(task.add(offset as usize).cast::<i32>()) } {
            Ok(status) => (status, EXIT_STATUS_KNOWN),
            Err(_) => (0, 0),
        }
    } else {
        (0, 0)
    };
    match EVENTS.reserve::<ExitEvent>(0) {
        Some(mut slot) => {
            slot.write(ExitEvent {
                tag: EventTag::Exit as u32,
                pid,
                status,
                flags,
            });
            slot.submit(0);
        }
        None => dropped(pid),
    }
}
