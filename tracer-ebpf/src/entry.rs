//! Entry state saved by the entry programs and consumed by the return program.
use aya_ebpf::{
    EbpfContext,
    helpers::{bpf_get_current_pid_tgid, generated::{bpf_get_attach_cookie, bpf_ktime_get_ns}},
    programs::ProbeContext,
};

use crate::maps::{ENTRIES, enabled};

/// What the return probe needs from the entry: when, which api (cookie), and the arguments.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Entry {
    pub start_ns: u64,
    pub cookie: u64,
    pub args: [u64; 6],
}

/// Register argument `n` as a raw 64-bit value (0 when out of range).
#[inline(always)]
pub fn arg(ctx: &ProbeContext, n: usize) -> u64 {
    ctx.arg::<u64>(n).unwrap_or(0)
}

/// Saves the entry state of the calling thread; the timestamp is taken last so that the work of
/// the probe itself is not counted in the call's duration.
#[inline(always)]
pub fn save(ctx: &ProbeContext, args: [u64; 6]) {
    if !enabled() {
        return;
    }
    // SAFETY: helpers valid in uprobe context.
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    let mut entry = Entry { start_ns: 0, cookie, args };
    entry.start_ns = unsafe { bpf_ktime_get_ns() };
    let _ = ENTRIES.insert(&bpf_get_current_pid_tgid(), &entry, 0);
}
