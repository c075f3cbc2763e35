//! The one return program, attached to every probed symbol: pairs the return with the thread's
//! saved entry and writes a record to the ring buffer, counting it as dropped when the buffer is
//! full.
use aya_ebpf::{
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_probe_read_user,
        bpf_probe_read_user_str_bytes, generated::bpf_ktime_get_ns,
    },
    macros::uretprobe,
    programs::RetProbeContext,
};
use tracer_common::{
    CallEvent, EventTag, LookupEvent, STAT_DROPPED, STAT_ORPHAN_RETURNS,
    api::{COOKIE_API_MASK, COOKIE_READ_NAME, COOKIE_READ_OUT},
};

use crate::{
    entry::Entry,
    maps::{ENTRIES, EVENTS, bump, submit_flags},
};

#[uretprobe]
pub fn cuda_ret(ctx: RetProbeContext) -> u32 {
    let end = unsafe { bpf_ktime_get_ns() };
    let id = bpf_get_current_pid_tgid();
    // SAFETY: the value is copied out before the entry is removed.
    let entry = match unsafe { ENTRIES.get(&id) } {
        Some(e) => *e,
        None => {
            bump(STAT_ORPHAN_RETURNS);
            return 0;
        }
    };
    let _ = ENTRIES.remove(&id);
    let result = ctx.ret::<u64>() as i32;
    if entry.cookie & COOKIE_READ_NAME != 0 {
        emit_lookup(&entry, id, end, result);
    } else {
        emit_call(&entry, id, end, result);
    }
    0
}

#[inline(always)]
fn fill(ev: &mut CallEvent, tag: EventTag, entry: &Entry, id: u64, end: u64, result: i32) {
    ev.tag = tag as u32;
    ev.api = (entry.cookie & COOKIE_API_MASK) as u32;
    ev.pid = (id >> 32) as u32;
    ev.tid = id as u32;
    ev.start_ns = entry.start_ns;
    ev.duration_ns = end.wrapping_sub(entry.start_ns);
    ev.result = result;
    ev._pad = 0;
    ev.args = entry.args;
    // Out-parameters hold their value only after a successful return.
    ev.out = if entry.cookie & COOKIE_READ_OUT != 0 && result == 0 && entry.args[0] != 0 {
        unsafe { bpf_probe_read_user(entry.args[0] as *const u64) }.unwrap_or(0)
    } else {
        0
    };
    ev.comm = bpf_get_current_comm().unwrap_or([0; 16]);
}

#[inline(always)]
fn emit_call(entry: &Entry, id: u64, end: u64, result: i32) {
    let Some(mut slot) = EVENTS.reserve::<CallEvent>(0) else {
        bump(STAT_DROPPED);
        return;
    };
    // SAFETY: the reservation is sized for CallEvent and every field is written below.
    let ev = unsafe { &mut *slot.as_mut_ptr() };
    fill(ev, EventTag::Call, entry, id, end, result);
    slot.submit(submit_flags());
}

#[inline(always)]
fn emit_lookup(entry: &Entry, id: u64, end: u64, result: i32) {
    let Some(mut slot) = EVENTS.reserve::<LookupEvent>(0) else {
        bump(STAT_DROPPED);
        return;
    };
    // SAFETY: the reservation is sized for LookupEvent; the name is NUL-padded at its start.
    let ev = unsafe { &mut *slot.as_mut_ptr() };
    fill(&mut ev.call, EventTag::Lookup, entry, id, end, result);
    ev.name[0] = 0;
    let name_ptr = entry.args[2] as *const u8;
    if !name_ptr.is_null() {
        let _ = unsafe { bpf_probe_read_user_str_bytes(name_ptr, &mut ev.name) };
    }
    slot.submit(submit_flags());
}
