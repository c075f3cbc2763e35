//! Entry state saved by the entry programs and consumed by the return program.
use aya_ebpf::{
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid,
        generated::{bpf_get_attach_cookie, bpf_get_current_cgroup_id, bpf_ktime_get_ns},
    },
    programs::ProbeContext,
    EbpfContext,
};

use aya_log_ebpf::warn;
use tracer_common::{api::COOKIE_LAUNCH, Entry, CONFIG_AGGREGATE, FILTER_CGROUP, FILTER_COMM};

use crate::{
    arch::entry_ip,
    maps::{emit_name, enabled, ENTRIES, FILTER},
    slots,
};

/// Register argument `n` as a raw 64-bit value (0 when out of range).
#[inline(always)]
pub fn arg(ctx: &ProbeContext, n: usize) -> u64 {
    ctx.arg::<u64>(n).unwrap_or(0)
}

/// Whether the in-kernel filter lets this thread's calls through.
#[inline(always)]
fn wanted() -> bool {
    let Some(filter) = FILTER.get(0) else {
        return true;
    };
    if filter.flags == 0 {
        return true;
    }
    if filter.flags & FILTER_CGROUP != 0
        // SAFETY: bpf_get_current_cgroup_id has no preconditions.
        && unsafe { bpf_get_current_cgroup_id() } != filter.cgroup_id
    {
        return false;
    }
    if filter.flags & FILTER_COMM != 0 && !bpf_get_current_comm().is_ok_and(|c| c == filter.comm) {
        return false;
    }
    true
}

/// Counts the launch in `stale`, a slot still busy whose return will never come (cut off by a
/// window's end, see `crate::window`, or its thread exiting), when aggregating: whether it was
/// a launch.
#[inline(always)]
pub fn counted_late(id: u64, stale: &Entry) -> bool {
    if stale.cookie & COOKIE_LAUNCH == 0 || crate::maps::config(CONFIG_AGGREGATE) != 1 {
        return false;
    }
    if crate::aggregate::count_untimed((id >> 32) as u32, stale) {
        crate::maps::bump(tracer_common::STAT_COUNTED_LATE);
    }
    true
}

/// A launch of a thread that has no slot (its process's or cgroup's share is used, or the map
/// is full): counted all the same, untimed, in its kernel's cell when aggregating, so that a
/// process's launches are never hidden by the slots it holds (a launch while its process
/// captures a graph runs nothing, and is not counted).
#[inline(always)]
fn count_unslotted(pid: u32, entry: &Entry) {
    if entry.cookie & COOKIE_LAUNCH == 0 || crate::maps::config(CONFIG_AGGREGATE) != 1 {
        return;
    }
    if crate::aggregate::capturing(crate::aggregate::window(pid)) {
        return;
    }
    if crate::aggregate::count_untimed(pid, entry) {
        crate::maps::bump(tracer_common::STAT_COUNTED_UNSLOTTED);
    }
}

/// Saves the entry state of the calling thread in its slot, made on its first call and reused
/// after (an in-place write: no map insert or delete per call); the timestamp is taken last so
/// that the work of the probe itself is not counted in the call's duration. The thread's slot
/// when it holds the call.
#[inline(always)]
pub fn save(ctx: &ProbeContext, args: [u64; 6]) -> Option<*mut Entry> {
    save_with(ctx, cookie(ctx), args)
}

/// The probe's attach cookie: the api id and its flags.
#[inline(always)]
pub fn cookie(ctx: &ProbeContext) -> u64 {
    // SAFETY: the context pointer is the program's own, as bpf_get_attach_cookie requires.
    unsafe { bpf_get_attach_cookie(ctx.as_ptr()) }
}

/// [`save`], for a caller that has read the cookie already.
#[inline(always)]
pub fn save_with(ctx: &ProbeContext, cookie: u64, args: [u64; 6]) -> Option<*mut Entry> {
    if !enabled() || !wanted() {
        return None;
    }
    let id = bpf_get_current_pid_tgid();
    match ENTRIES.get_ptr_mut(&id) {
        // SAFETY: this thread's own slot: only its own calls (on whichever CPU) write it, one at
        // a time, and the pointer is not kept past this program.
        Some(slot) => unsafe {
            // A slot still busy: a call whose return was never seen (a longjmp out of the
            // driver, a nested probed call). Rare; said once each through aya-log, and the
            // newer call wins.
            // A launch's return cut off by the end of a window of the pair (its probe
            // detached while the call ran) is counted now, untimed, and is no fault.
            if (*slot).start_ns != 0 && !counted_late(id, &*slot) {
                warn!(
                    ctx,
                    "entry state of tid {} replaced: its previous driver call never returned",
                    id as u32
                );
            }
            (*slot).cookie = cookie;
            (*slot).args = args;
            (*slot).entry_ip = entry_ip(ctx);
            (*slot).session = 0;
            (*slot).start_ns = bpf_ktime_get_ns();
            Some(slot)
        },
        None => {
            // The thread's first traced call (or the first since its share let it have a
            // slot): a slot if its process and cgroup are under their shares.
            let pid = (id >> 32) as u32;
            // SAFETY: bpf_get_current_cgroup_id has no preconditions.
            let cgroup = unsafe { bpf_get_current_cgroup_id() };
            let mut entry = Entry {
                start_ns: 0,
                cookie,
                args,
                last_stream: u64::MAX,
                last_epoch: 0,
                polls: 0,
                last_launch_ns: 0,
                entry_ip: entry_ip(ctx),
                ended_ns: 0,
                session: 0,
                cgroup,
            };
            if !slots::take(pid, cgroup) {
                count_unslotted(pid, &entry);
                return None;
            }
            // Its name, once (records carry none).
            emit_name(
                (id >> 32) as u32,
                id as u32,
                false,
                bpf_get_current_comm().unwrap_or([0; 16]),
            );
            // SAFETY: bpf_ktime_get_ns has no preconditions.
            entry.start_ns = unsafe { bpf_ktime_get_ns() };
            // BPF_NOEXIST; a full map (every slot a live thread's) refuses it: given back.
            if ENTRIES.insert(&id, &entry, 1).is_err() {
                slots::give_back(pid, cgroup);
                crate::maps::count_for(&crate::maps::UNSLOTTED, pid);
                count_unslotted(pid, &entry);
                return None;
            }
            // The thread's first call only: its slot looked up once more.
            ENTRIES.get_ptr_mut(&id)
        }
    }
}
