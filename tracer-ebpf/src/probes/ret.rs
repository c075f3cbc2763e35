//! The one return program, attached to every probed symbol: pairs the return with the thread's
//! saved entry, counts a launch in-kernel when aggregating (`crate::aggregate`), and writes a
//! record to the ring buffer unless the launch was counted and not sampled, counting it as
//! dropped when the buffer is full. Records are built whole before they reach the ring buffer,
//! never field by field through a reference into its uninitialised memory.
use core::ptr::addr_of_mut;

use aya_ebpf::{
    helpers::{
        bpf_get_current_pid_tgid, bpf_probe_read_user,
        generated::{bpf_ktime_get_ns, bpf_probe_read_user_str},
    },
    macros::uretprobe,
    programs::RetProbeContext,
    EbpfContext,
};
use aya_log_ebpf::{debug, warn};
use tracer_common::{
    api::{
        COOKIE_API_MASK, COOKIE_CAPTURE_BEGIN, COOKIE_CAPTURE_END, COOKIE_CLOSES_ALL,
        COOKIE_CLOSES_ARG_STREAM, COOKIE_CLOSES_DEFAULT_STREAM, COOKIE_CLOSES_EVENT, COOKIE_LAUNCH,
        COOKIE_NAME_ARG0, COOKIE_POLL, COOKIE_READ_NAME, COOKIE_READ_OUT, COOKIE_READ_OUT_16,
        COOKIE_READ_OUT_ARG1, COOKIE_READ_PROP_LOCATION, CUDA_ERROR_ILLEGAL_STATE,
        CUDA_ERROR_NOT_READY, PROP_LOCATION_OFFSET,
    },
    launches::{FLAG_AFTER_NOT_READY, FLAG_COUNTED, POLLS_SHIFT},
    CallEvent, Entry, EventTag, LongLookupEvent, LookupEvent, CONFIG_AGGREGATE, LONG_NAME_MAX,
    NAME_MAX, STAT_ORPHAN_RETURNS, STAT_POLLS_NOT_READY,
};

use crate::{
    aggregate,
    maps::{
        bump, config, dropped, enabled, over_rate, rate_limited, submit_flags, ENTRIES, EVENTS,
    },
};

/// Cookie flags of the calls that close stream batches.
const CLOSES: u64 = COOKIE_CLOSES_ALL
    | COOKIE_CLOSES_ARG_STREAM
    | COOKIE_CLOSES_DEFAULT_STREAM
    | COOKIE_CLOSES_EVENT;
/// The most `CUDA_ERROR_NOT_READY` answers one poll's record reports.
const MAX_POLLS: u64 = (u32::MAX >> POLLS_SHIFT) as u64;

#[uretprobe]
pub fn cuda_ret(ctx: RetProbeContext) -> u32 {
    try_cuda_ret(&ctx);
    0
}

/// The return half: also a session program's (`super::session`), on the calls its entry asked
/// to see return.
#[inline(always)]
pub fn try_cuda_ret(ctx: &RetProbeContext) {
    // SAFETY: bpf_ktime_get_ns has no preconditions.
    let end = unsafe { bpf_ktime_get_ns() };
    let id = bpf_get_current_pid_tgid();
    let (slot, entry) = match ENTRIES.get_ptr_mut(&id) {
        // SAFETY: this thread's own slot (see `entry::save`), valid while this program runs.
        Some(slot) if unsafe { (*slot).start_ns } != 0 =>
        // SAFETY: as above: copied out, then marked idle.
        unsafe {
            let e = *slot;
            (*slot).start_ns = 0;
            (*slot).session = 0;
            (*slot).ended_ns = end;
            (slot, e)
        },
        // A launch its entry counted outside a window, whose return probe was attached
        // meanwhile: counted already.
        // SAFETY: as above.
        Some(slot) if unsafe { (*slot).session } == crate::window::COUNTED_AT_ENTRY => return,
        _ => {
            // Recording off (stopping): the entry saved nothing, and that is no orphan.
            if !enabled() {
                return;
            }
            // A thread its share left without a slot: counted against its process at entry.
            // SAFETY: only tested for presence.
            if unsafe { crate::maps::UNSLOTTED.get(&((id >> 32) as u32)) }.is_some() {
                return;
            }
            bump(STAT_ORPHAN_RETURNS);
            warn!(
                ctx,
                "orphan return in tid {}: no entry state (attached mid-call, or evicted)",
                id as u32
            );
            return;
        }
    };
    let pid = (id >> 32) as u32;
    let result = ctx.ret::<u64>() as i32;
    let duration = end.wrapping_sub(entry.start_ns);
    let mut flags = 0;
    if entry.cookie & COOKIE_POLL != 0 {
        // Polling is filtered here: a NOT_READY answer costs the probe, never a record.
        if result == CUDA_ERROR_NOT_READY {
            // SAFETY: the thread's own slot, as above.
            unsafe { (*slot).polls = (*slot).polls.saturating_add(1) };
            bump(STAT_POLLS_NOT_READY);
            return;
        }
        if entry.polls != 0 {
            let polls = if entry.polls > MAX_POLLS {
                MAX_POLLS
            } else {
                entry.polls
            };
            flags |= FLAG_AFTER_NOT_READY | ((polls as u32) << POLLS_SHIFT);
            // SAFETY: as above.
            unsafe { (*slot).polls = 0 };
        }
    }
    // A begin counts when it succeeded; an end whatever its result (an invalidated capture
    // ends too), except on a stream that was not capturing.
    if entry.cookie & (COOKIE_CAPTURE_BEGIN | COOKIE_CAPTURE_END) != 0
        && (result == 0
            || (entry.cookie & COOKIE_CAPTURE_END != 0 && result != CUDA_ERROR_ILLEGAL_STATE))
    {
        aggregate::capture(pid, end, entry.cookie & COOKIE_CAPTURE_BEGIN != 0);
    }
    if entry.cookie & COOKIE_LAUNCH != 0 {
        // SAFETY: as above.
        unsafe { (*slot).last_launch_ns = end };
    }
    if entry.cookie & (COOKIE_LAUNCH | CLOSES) != 0 && config(CONFIG_AGGREGATE) == 1 {
        if entry.cookie & COOKIE_LAUNCH != 0 {
            // One lookup of the process's window serves the capture check and the sampling.
            let window = aggregate::window(pid);
            if !aggregate::capturing(window) && aggregate::count(pid, &entry, duration, result) {
                if entry.session != 0 {
                    // A session's entry chose to write this one (and counted it in the window).
                    aggregate::note_stream(window, slot, &entry);
                } else if !aggregate::wanted(pid, window, slot, &entry, end, duration, result) {
                    return;
                }
                flags = FLAG_COUNTED;
            }
        } else if result == 0 {
            aggregate::close(pid);
        }
    }
    if over_rate(pid, end) {
        rate_limited(pid);
        return;
    }
    let tag = if entry.cookie & COOKIE_READ_NAME != 0 {
        EventTag::Lookup
    } else {
        EventTag::Call
    };
    let mut call = record(ctx, tag, &entry, id, duration, result, flags);
    if entry.cookie & (CLOSES | COOKIE_READ_OUT | COOKIE_READ_OUT_ARG1) == CLOSES {
        // A wait's record carries when its thread's last launch returned (see `Entry`).
        call.out = entry.last_launch_ns;
    }
    match tag {
        EventTag::Lookup => {
            let name = if entry.cookie & COOKIE_NAME_ARG0 != 0 {
                entry.args[0]
            } else {
                entry.args[2]
            };
            emit_lookup(ctx, call, name)
        }
        _ => emit_call(call),
    }
}

/// The call's record, built on the stack.
#[inline(always)]
pub fn record<C: EbpfContext>(
    ctx: &C,
    tag: EventTag,
    entry: &Entry,
    id: u64,
    duration_ns: u64,
    result: i32,
    flags: u32,
) -> CallEvent {
    // Out-parameters hold their value only after a successful return.
    let at = if entry.cookie & COOKIE_READ_OUT_ARG1 != 0 {
        entry.args[1]
    } else {
        entry.args[0]
    };
    let out = if entry.cookie & (COOKIE_READ_OUT | COOKIE_READ_OUT_ARG1) != 0
        && result == 0
        && at != 0
    {
        // SAFETY: a faulting user read is an error, not a fault; the value is then 0.
        match unsafe { bpf_probe_read_user(at as *const u64) } {
            Ok(v) => v,
            Err(e) => {
                warn!(ctx, "cannot read the out-parameter at {:x} after a successful call ({}); recorded as 0", at, e);
                0
            }
        }
    } else {
        0
    };
    let mut args = entry.args;
    if entry.cookie & COOKIE_READ_OUT_16 != 0 && result == 0 && at != 0 {
        // The second half of a 16-byte out-parameter (a `CUuuid`), in place of the third
        // argument (no such argument: `(CUuuid *, CUdevice)`).
        // SAFETY: as above.
        args[2] = unsafe { bpf_probe_read_user((at + 8) as *const u64) }.unwrap_or(0);
    }
    if entry.cookie & COOKIE_READ_PROP_LOCATION != 0 && result == 0 && entry.args[2] != 0 {
        // `cuMemCreate`'s device: the location of the properties it was given (still the
        // caller's memory at return), in place of the flags.
        // SAFETY: as above.
        args[3] =
            unsafe { bpf_probe_read_user((entry.args[2] + PROP_LOCATION_OFFSET) as *const u64) }
                .unwrap_or(0);
    }
    CallEvent {
        tag: tag as u32,
        api: (entry.cookie & COOKIE_API_MASK) as u32,
        pid: (id >> 32) as u32,
        tid: id as u32,
        start_ns: entry.start_ns,
        duration_ns,
        result,
        flags,
        args,
        out,
    }
}

/// Writes `call` to the ring buffer, or counts it dropped for its process.
#[inline(always)]
pub fn emit_call(call: CallEvent) {
    let Some(mut slot) = EVENTS.reserve::<CallEvent>(0) else {
        dropped(call.pid);
        return;
    };
    slot.write(call);
    slot.submit(submit_flags());
}

#[inline(always)]
fn emit_lookup<C: EbpfContext>(ctx: &C, call: CallEvent, name_ptr: u64) {
    let Some(mut slot) = EVENTS.reserve::<LookupEvent>(0) else {
        dropped(call.pid);
        return;
    };
    let p: *mut LookupEvent = slot.as_mut_ptr();
    // SAFETY: `p` points at a reservation sized and aligned for a LookupEvent. Each part is
    // written through a raw pointer (no reference to uninitialised memory): the call whole,
    // then the name's first byte (an empty name if the read below fails), then the name by the
    // kernel's string read, which writes at most NAME_MAX bytes into the field.
    let read = unsafe {
        addr_of_mut!((*p).call).write(call);
        let name = addr_of_mut!((*p).name).cast::<u8>();
        name.write(0);
        if name_ptr == 0 {
            0
        } else {
            bpf_probe_read_user_str(name.cast(), NAME_MAX as u32, name_ptr as *const _)
        }
    };
    if read < 0 {
        debug!(
            ctx,
            "cannot read the kernel name at {:x}; recorded as empty", name_ptr
        );
    }
    if read == NAME_MAX as i64 {
        // The name filled the record (it may go on): read again, whole up to LONG_NAME_MAX.
        slot.discard(0);
        emit_long_lookup(call, name_ptr);
        return;
    }
    slot.submit(submit_flags());
}

/// A lookup whose name did not fit a [`LookupEvent`], as a [`LongLookupEvent`].
#[inline(always)]
fn emit_long_lookup(mut call: CallEvent, name_ptr: u64) {
    let Some(mut slot) = EVENTS.reserve::<LongLookupEvent>(0) else {
        dropped(call.pid);
        return;
    };
    call.tag = EventTag::LongLookup as u32;
    let p: *mut LongLookupEvent = slot.as_mut_ptr();
    // SAFETY: as in `emit_lookup`, for a LongLookupEvent: the string read writes at most
    // LONG_NAME_MAX bytes into the field (an empty name if it fails).
    unsafe {
        addr_of_mut!((*p).call).write(call);
        let name = addr_of_mut!((*p).name).cast::<u8>();
        name.write(0);
        bpf_probe_read_user_str(name.cast(), LONG_NAME_MAX as u32, name_ptr as *const _);
    }
    slot.submit(submit_flags());
}
