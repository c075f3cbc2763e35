//! `sys_enter` (a raw tracepoint: no tracefs, no BTF, no ftrace needed), the fallback open hook
//! of discovery where the kernel cannot probe its open path (`opened_path`): an `open`, `openat`
//! or `openat2` whose path's last component is named like libcuda names its process to
//! discovery through `OPENS`, which then reads that process's maps and no other's. Every other
//! system call returns after one comparison of its number, but it does run the program: a tax
//! on every system call of the node.
use aya_ebpf::{
    helpers::{
        bpf_get_current_pid_tgid, bpf_probe_read_kernel, bpf_probe_read_user_str_bytes,
        generated::{bpf_get_current_cgroup_id, bpf_ktime_get_ns},
    },
    macros::raw_tracepoint,
    programs::RawTracePointContext,
};
use tracer_common::{
    opens::{
        ExeKey, OpenEvent, LIBCUDA_PREFIX, OPEN_KIND_OPENED, OPEN_PATH_BYTES, OPEN_REPORT_GAP_NS,
    },
    STAT_OPENS_LOST,
};

use crate::maps::{bump, OPENERS, OPENS};

const BPF_RB_FORCE_WAKEUP: u64 = 2;

/// System call numbers and where the path argument sits in `struct pt_regs` (bytes).
#[cfg(bpf_target_arch = "x86_64")]
mod abi {
    /// `open(path, ...)`: the path in rdi.
    pub const OPEN: i64 = 2;
    /// `openat(dfd, path, ...)` and `openat2(dfd, path, ...)`: the path in rsi.
    pub const OPENAT: i64 = 257;
    pub const OPENAT2: i64 = 437;
    pub const ARG0: usize = 14 * 8;
    pub const ARG1: usize = 13 * 8;
}
#[cfg(bpf_target_arch = "aarch64")]
mod abi {
    /// arm64 has no `open`; `openat` and `openat2` take the path in x1 (`regs[1]`).
    pub const OPEN: i64 = -1;
    pub const OPENAT: i64 = 56;
    pub const OPENAT2: i64 = 437;
    pub const ARG0: usize = 0;
    pub const ARG1: usize = 8;
}

#[raw_tracepoint(tracepoint = "sys_enter")]
pub fn cuda_opened(ctx: RawTracePointContext) -> u32 {
    try_cuda_opened(&ctx);
    0
}

#[inline(always)]
fn try_cuda_opened(ctx: &RawTracePointContext) {
    // The tracepoint's arguments are (struct pt_regs *regs, long id).
    let id: i64 = ctx.arg(1);
    let offset = match id {
        abi::OPENAT | abi::OPENAT2 => abi::ARG1,
        abi::OPEN => abi::ARG0,
        _ => return,
    };
    let regs: u64 = ctx.arg(0);
    // SAFETY: a faulting kernel read is an error, and the open is then not reported.
    let Ok(filename) = (unsafe { bpf_probe_read_kernel((regs + offset as u64) as *const u64) })
    else {
        return;
    };
    report_if_libcuda(filename);
}

/// Names the calling process to discovery when the user-space path at `filename` names a
/// libcuda (at most once per [`OPEN_REPORT_GAP_NS`] per process). Shared by both open hooks.
#[inline(always)]
pub fn report_if_libcuda(filename: u64) {
    let mut path = [0u8; OPEN_PATH_BYTES];
    // SAFETY: a faulting user read is an error, and the open is then not reported.
    let len = match unsafe { bpf_probe_read_user_str_bytes(filename as *const u8, &mut path) } {
        Ok(s) => s.len(),
        Err(_) => return,
    };
    if !names_libcuda(&path, len) {
        return;
    }
    report(OPEN_KIND_OPENED);
}

/// Names the calling process to discovery, saying why (`kind`), at most once per
/// [`OPEN_REPORT_GAP_NS`] per process. Shared by the open hooks and the loader's.
#[inline(always)]
pub fn report(kind: u32) {
    let id = bpf_get_current_pid_tgid();
    let pid = (id >> 32) as u32;
    // SAFETY: bpf_ktime_get_ns has no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    // SAFETY: the value is copied out at once.
    if let Some(last) = unsafe { OPENERS.get(&pid) } {
        if now.wrapping_sub(*last) < OPEN_REPORT_GAP_NS {
            return;
        }
    }
    let _ = OPENERS.insert(&pid, &now, 0);
    // Woken whatever waits before it: an execution's record (`exec`) does not wake the reader,
    // and the ring's adaptive wake-up would not either while one is unread.
    emit(id, kind, ExeKey::default(), BPF_RB_FORCE_WAKEUP);
}

/// Writes the calling thread's process (`id`: pid and tid) to `OPENS` with `kind` and `exe`,
/// submitted with `flags`; false (counted as lost) when the ring is full.
#[inline(always)]
pub fn emit(id: u64, kind: u32, exe: ExeKey, flags: u64) -> bool {
    match OPENS.reserve::<OpenEvent>(0) {
        Some(mut slot) => {
            slot.write(OpenEvent {
                pid: (id >> 32) as u32,
                tid: id as u32,
                // SAFETY: bpf_get_current_cgroup_id has no preconditions.
                cgroup: unsafe { bpf_get_current_cgroup_id() },
                kind,
                pad: 0,
                exe,
            });
            slot.submit(flags);
            true
        }
        None => {
            bump(STAT_OPENS_LOST);
            false
        }
    }
}

/// How far from the path's end a libcuda name may start (`libcuda.so.550.54.15` is 20 bytes).
const NAME_WINDOW: usize = 32;

/// Whether `path` (`len` bytes) ends in a component named like libcuda: `libcuda.so` starting
/// in its last [`NAME_WINDOW`] bytes, after a `/` or at its start, before a `.` or its end. (A
/// name that only looks so, `libcuda.so.d/x`, makes discovery read that one process's maps.)
/// The loop has a constant bound and carries no state, so the verifier walks it once.
#[inline(always)]
pub fn names_libcuda(path: &[u8; OPEN_PATH_BYTES], len: usize) -> bool {
    let n = LIBCUDA_PREFIX.len();
    for k in 0..NAME_WINDOW {
        let Some(i) = len.checked_sub(n + k) else {
            return false;
        };
        if i + n >= OPEN_PATH_BYTES {
            continue;
        }
        let window = LIBCUDA_PREFIX
            .iter()
            .enumerate()
            .all(|(j, want)| path.get(i + j) == Some(want));
        if !window {
            continue;
        }
        let before = i == 0 || path.get(i.wrapping_sub(1)) == Some(&b'/');
        let after = i + n == len || matches!(path.get(i + n), Some(b'.') | Some(0));
        if before && after {
            return true;
        }
    }
    false
}
