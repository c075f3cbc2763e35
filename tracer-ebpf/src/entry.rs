//! Entry state saved by the entry programs and consumed by the return program.
use aya_ebpf::{
    EbpfContext,
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid,
        generated::{bpf_get_attach_cookie, bpf_get_current_cgroup_id, bpf_ktime_get_ns},
    },
    programs::ProbeContext,
};

use aya_log_ebpf::warn;
use tracer_common::{Entry, FILTER_CGROUP, FILTER_COMM};

use crate::maps::{ENTRIES, FILTER, enabled};

/// Register argument `n` as a raw 64-bit value (0 when out of range).
#[inline(always)]
pub fn arg(ctx: &ProbeContext, n: usize) -> u64 {
    ctx.arg::<u64>(n).unwrap_or(0)
}

/// Whether the in-kernel filter lets this thread's calls through.
#[inline(always)]
fn wanted() -> bool {
    let Some(filter) = FILTER.get(0) else { return true };
    if filter.flags == 0 {
        return true;
    }
    // SAFETY: bpf_get_current_cgroup_id has no preconditions.
    if filter.flags & FILTER_CGROUP != 0 && unsafe { bpf_get_current_cgroup_id() } != filter.cgroup_id {
        return false;
    }
    if filter.flags & FILTER_COMM != 0 && bpf_get_current_comm().map_or(true, |c| c != filter.comm) {
        return false;
    }
    true
}

/// Saves the entry state of the calling thread; the timestamp is taken last so that the work of
/// the probe itself is not counted in the call's duration.
#[inline(always)]
pub fn save(ctx: &ProbeContext, args: [u64; 6]) {
    if !enabled() || !wanted() {
        return;
    }
    // SAFETY: the context pointer is the program's own, as bpf_get_attach_cookie requires.
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    let mut entry = Entry { start_ns: 0, cookie, args };
    // SAFETY: bpf_ktime_get_ns has no preconditions.
    entry.start_ns = unsafe { bpf_ktime_get_ns() };
    let id = bpf_get_current_pid_tgid();
    // BPF_NOEXIST costs nothing more than a plain insert, and tells when this thread still had
    // an entry: a call whose return was never seen (a longjmp out of the driver, a nested probed
    // call). Rare; said once each through aya-log, and the newer call wins.
    const BPF_NOEXIST: u64 = 1;
    if ENTRIES.insert(&id, &entry, BPF_NOEXIST).is_err() {
        warn!(ctx, "entry state of tid {} replaced: its previous driver call never returned", id as u32);
        let _ = ENTRIES.insert(&id, &entry, 0);
    }
}
