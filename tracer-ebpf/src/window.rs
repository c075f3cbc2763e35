//! Outside a window of the pair (`CONFIG_RETURNS_CLOSED`): where uprobe sessions are missing,
//! user space detaches the launches' return probes part of the time, and a launch's entry then
//! does what a session's entry does for a launch it skips. It counts the launch in its kernel's
//! untimed cell and leaves the thread's slot idle; what needs a record (a launch that may open
//! a stream batch, one made while its process captures a graph, one no cell can count) is
//! written here, with its start and `FLAG_UNTIMED`: no duration, no result.
use aya_ebpf::{helpers::bpf_get_current_pid_tgid, EbpfContext};
use tracer_common::{
    launches::{FLAG_COUNTED, FLAG_UNTIMED},
    Entry, EventTag, CONFIG_RETURNS_CLOSED,
};

use crate::{
    aggregate,
    maps::{config, over_rate, rate_limited},
    probes::ret::{emit_call, record},
};

/// `Entry::session` of a launch counted at entry: a return that still comes (its probe was
/// attached while the entry ran) is left alone.
pub const COUNTED_AT_ENTRY: u64 = 2;

/// Whether the launches' return probes are detached now.
#[inline(always)]
pub fn closed() -> bool {
    config(CONFIG_RETURNS_CLOSED) == 1
}

/// Counts the launch whose entry `entry::save` put in `slot`, and writes it when it must be.
#[inline(always)]
pub fn outside<C: EbpfContext>(ctx: &C, slot: Option<*mut Entry>) {
    let Some(slot) = slot else {
        return;
    };
    let id = bpf_get_current_pid_tgid();
    let pid = (id >> 32) as u32;
    // SAFETY: this thread's own slot (see `entry::save`), valid while this program runs.
    let entry = unsafe { *slot };
    // The entry's clock reading serves as the launch's end too: one reading fewer.
    let now = entry.start_ns;
    let window = aggregate::window(pid);
    let mut flags = FLAG_UNTIMED;
    let write = if aggregate::capturing(window) {
        // Never counted in a cell: user space tells captured launches by their records.
        true
    } else {
        let epoch = aggregate::tick(pid, window, now).1;
        let stream = aggregate::stream_of(entry.cookie, entry.args[5]);
        let opens = entry.last_stream != stream || entry.last_epoch != epoch;
        if opens {
            // SAFETY: as above.
            unsafe {
                (*slot).last_stream = stream;
                (*slot).last_epoch = epoch;
            }
        }
        let counted = aggregate::count_untimed(pid, &entry);
        if counted {
            flags |= FLAG_COUNTED;
        }
        opens || !counted
    };
    // SAFETY: as above: the slot is idle again, the launch's end taken as its start.
    unsafe {
        (*slot).start_ns = 0;
        (*slot).session = COUNTED_AT_ENTRY;
        (*slot).last_launch_ns = now;
        (*slot).ended_ns = now;
    }
    if !write {
        return;
    }
    if over_rate(pid, now) {
        rate_limited(pid);
        return;
    }
    emit_call(record(ctx, EventTag::Call, &entry, id, 0, 0, flags));
}
