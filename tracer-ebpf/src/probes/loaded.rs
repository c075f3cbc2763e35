//! Discovery's hook in each dynamic loader: a uprobe_multi link per loader file on
//! `_dl_debug_state`, the empty function glibc's and musl's loaders call after every change of
//! the loaded objects (for debuggers). Only loads and unloads run it, so on a kernel whose open
//! path cannot be probed, no other system call of the node pays for discovery.
//!
//! Once the list is consistent again (`r_state` is `RT_CONSISTENT`: everything loaded is
//! mapped), the main namespace's object list (`_r_debug.r_map`, reached from the probed address
//! by the distance in the link's cookie) is walked to its end, and the names of the objects added
//! since the last check, newest first, are compared with libcuda's. A process is named to
//! discovery when one matches (`OPEN_KIND_LOADED`), or, unsure, when more were added than are
//! looked at or the list cannot be read (`OPEN_KIND_LOADED_UNSURE`): user space then reads its
//! maps.
use aya_ebpf::{
    helpers::{
        bpf_get_current_pid_tgid, bpf_probe_read_user, bpf_probe_read_user_str_bytes,
        generated::{bpf_get_attach_cookie, bpf_get_func_ip},
    },
    macros::uprobe,
    programs::ProbeContext,
    EbpfContext,
};
use tracer_common::opens::{
    LoadedState, LINK_MAP_NAME, LINK_MAP_NEXT, LINK_MAP_PREV, LOADER_MAX_OBJECTS,
    LOADER_NEW_CHECKED, OPEN_KIND_LOADED, OPEN_KIND_LOADED_UNSURE, OPEN_PATH_BYTES, RT_CONSISTENT,
    R_DEBUG_MAP, R_DEBUG_STATE,
};

use super::opened::{names_libcuda, report};
use crate::maps::LOADED;

#[uprobe]
pub fn cuda_loaded(ctx: ProbeContext) -> u32 {
    try_cuda_loaded(&ctx);
    0
}

/// A pointer-sized word of the traced process at `at`.
#[inline(always)]
fn word(at: u64) -> Option<u64> {
    // SAFETY: a faulting user read is an error, returned as None.
    unsafe { bpf_probe_read_user(at as *const u64) }.ok()
}

/// Whether the object name at `name` (a user-space string) names a libcuda.
#[inline(always)]
fn is_libcuda_at(name: u64) -> bool {
    let mut path = [0u8; OPEN_PATH_BYTES];
    // SAFETY: a faulting user read is an error, and the name is then not matched.
    match unsafe { bpf_probe_read_user_str_bytes(name as *const u8, &mut path) } {
        Ok(s) => {
            let len = s.len();
            names_libcuda(&path, len)
        }
        Err(_) => false,
    }
}

#[inline(always)]
fn try_cuda_loaded(ctx: &ProbeContext) {
    // SAFETY: the context pointer is the program's own, as both helpers require.
    let (cookie, ip) = unsafe {
        (
            bpf_get_attach_cookie(ctx.as_ptr()),
            bpf_get_func_ip(ctx.as_ptr()),
        )
    };
    let debug = ip.wrapping_add(cookie);
    // SAFETY: a faulting user read is an error, and nothing is reported.
    let Ok(state) = (unsafe { bpf_probe_read_user((debug + R_DEBUG_STATE) as *const u32) }) else {
        return;
    };
    if state != RT_CONSISTENT {
        return;
    }
    let Some(mut at) = word(debug + R_DEBUG_MAP) else {
        return;
    };
    let (mut count, mut tail) = (0u32, 0u64);
    for _ in 0..LOADER_MAX_OBJECTS {
        if at == 0 {
            break;
        }
        tail = at;
        count += 1;
        match word(at + LINK_MAP_NEXT) {
            Some(next) => at = next,
            None => {
                report(OPEN_KIND_LOADED_UNSURE);
                return;
            }
        }
    }
    if at != 0 {
        // Longer than walked: its maps say.
        report(OPEN_KIND_LOADED_UNSURE);
        return;
    }
    let pid = (bpf_get_current_pid_tgid() >> 32) as u32;
    // SAFETY: the value is copied out at once.
    let new = match unsafe { LOADED.get(&pid) }.copied() {
        Some(before) if before.tail == tail && before.count == count => return,
        Some(before) if count > before.count => count - before.count,
        // First seen since its execution (or a fork), or objects unloaded: all are new.
        _ => count,
    };
    let _ = LOADED.insert(
        &pid,
        &LoadedState {
            count,
            pad: 0,
            tail,
        },
        0,
    );
    if new > LOADER_NEW_CHECKED {
        report(OPEN_KIND_LOADED_UNSURE);
        return;
    }
    let mut object = tail;
    for i in 0..LOADER_NEW_CHECKED {
        if i >= new || object == 0 {
            return;
        }
        if word(object + LINK_MAP_NAME).is_some_and(is_libcuda_at) {
            report(OPEN_KIND_LOADED);
            return;
        }
        match word(object + LINK_MAP_PREV) {
            Some(prev) => object = prev,
            None => return,
        }
    }
}
