//! What a uprobe session's entry does after saving a launch (`probes::session`): count it here
//! and skip its return, or ask for the return. The return is asked for when the launch is
//! sampled (`aggregate::sample_at_random`), may open a stream batch (the GPU-time estimate needs
//! every batch's first launch), is captured into a graph, when aggregation is off (`trace`
//! writes every launch), or when its cell cannot be made. Everything else is counted in its
//! kernel's untimed cell: exactly, without its duration or result.
use aya_ebpf::helpers::{bpf_get_current_pid_tgid, generated::bpf_ktime_get_ns};
use tracer_common::{Entry, CONFIG_AGGREGATE};

use crate::{aggregate, maps::config};

/// Run the return half.
const RETURN: u32 = 0;
/// Skip it (the kernel's `UPROBE_HANDLER_IGNORE` for any non-zero answer).
const SKIP: u32 = 1;

/// The entry's answer for a launch; `slot` is the thread's slot `entry::save` filled (looked up
/// there once, not again here).
#[inline(always)]
pub fn decide(slot: Option<*mut Entry>) -> u32 {
    let Some(slot) = slot else {
        // Nothing to pair with: recording off, filtered out, or no slot (counted at entry).
        return SKIP;
    };
    if config(CONFIG_AGGREGATE) != 1 {
        return RETURN;
    }
    let id = bpf_get_current_pid_tgid();
    // SAFETY: this thread's own slot (see `entry::save`), valid while this program runs.
    let entry = unsafe { *slot };
    let pid = (id >> 32) as u32;
    let window = aggregate::window(pid);
    if aggregate::capturing(window) {
        return RETURN;
    }
    // SAFETY: bpf_ktime_get_ns has no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    let (sampled, epoch) = aggregate::sample_at_random(pid, window, now);
    let stream = aggregate::stream_of(entry.cookie, entry.args[5]);
    let opens = entry.last_stream != stream || entry.last_epoch != epoch;
    if sampled || opens || !aggregate::count_untimed(pid, &entry) {
        // SAFETY: as above.
        unsafe { (*slot).session = 1 };
        return RETURN;
    }
    // Counted: the slot is idle again, and the launch's end is taken as now (a wait's record
    // carries it as its thread's last launch).
    // SAFETY: as above.
    unsafe {
        (*slot).start_ns = 0;
        (*slot).last_launch_ns = now;
        (*slot).ended_ns = now;
    }
    SKIP
}
