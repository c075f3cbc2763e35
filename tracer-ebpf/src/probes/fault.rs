//! `signal_generate`: a synchronous fault signal (SIGILL, SIGTRAP, SIGBUS, SIGSEGV) generated
//! for a thread that hit a probe is written with the faulting PC and the thread's last probe
//! hit, so that user space can tell a probe's harm from the workload's own crash.
use aya_ebpf::{
    helpers::{
        bpf_get_current_pid_tgid, bpf_get_current_task, bpf_probe_read_kernel,
        generated::{bpf_get_current_task_btf, bpf_ktime_get_ns, bpf_task_pt_regs},
    },
    macros::raw_tracepoint,
    programs::RawTracePointContext,
};
use tracer_common::{EventTag, FaultEvent, SI_CODE_UNKNOWN};

use crate::{
    arch::PT_REGS_PC,
    maps::{dropped, ENTRIES, EVENTS},
};

const SIGILL: u64 = 4;
const SIGTRAP: u64 = 5;
const SIGBUS: u64 = 7;
const SIGSEGV: u64 = 11;
/// `si_code` of a signal from `kill()`.
const SI_USER: i32 = 0;
/// `si_code` of a signal the kernel sends itself.
const SI_KERNEL: i32 = 0x80;

#[raw_tracepoint(tracepoint = "signal_generate")]
pub fn cuda_fault(ctx: RawTracePointContext) -> u32 {
    try_cuda_fault(&ctx);
    0
}

#[inline(always)]
fn try_cuda_fault(ctx: &RawTracePointContext) {
    // TP_PROTO(int sig, struct kernel_siginfo *info, struct task_struct *task, int group, int result)
    let (sig, info, task) = (ctx.arg::<u64>(0), ctx.arg::<u64>(1), ctx.arg::<u64>(2));
    if !matches!(sig & 0xffff_ffff, SIGILL | SIGTRAP | SIGBUS | SIGSEGV) {
        return;
    }
    // Synchronous: the faulting thread signals itself.
    // SAFETY: the helper takes no arguments.
    if task != unsafe { bpf_get_current_task() } {
        return;
    }
    let id = bpf_get_current_pid_tgid();
    // Only threads that hit a probe have a slot.
    let Some(entry) = ENTRIES.get_ptr(&id) else {
        return;
    };
    // SAFETY: the map's value, valid while this program runs; copied out.
    let entry = unsafe { *entry };
    // SAFETY: no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    let (in_call, hit) = if entry.start_ns != 0 {
        (1, entry.start_ns)
    } else {
        (0, entry.ended_ns)
    };
    // kernel_siginfo: si_signo, si_errno, si_code (i32 each), then the union at offset 16,
    // whose first field for these signals is si_addr. The kernel passes SEND_SIG_NOINFO (0) for
    // a signal from user space and SEND_SIG_PRIV (1) for its own, instead of a siginfo.
    let (code, addr) = match info {
        0 => (SI_USER, 0),
        1 => (SI_KERNEL, 0),
        _ => {
            let info = info as *const u8;
            // SAFETY: reads through the helper, which fails rather than faults. Unread: not
            // known, which user space never takes for a signal sent from user space.
            let code = unsafe { bpf_probe_read_kernel(info.add(8).cast::<i32>()) }
                .unwrap_or(SI_CODE_UNKNOWN);
            // SAFETY: as above.
            let addr = unsafe { bpf_probe_read_kernel(info.add(16).cast::<u64>()) }.unwrap_or(0);
            (code, addr)
        }
    };
    // SAFETY: the current task as a BTF pointer, and its user registers: both helpers check
    // their argument; the read goes through the helper.
    let pc = unsafe {
        let regs = bpf_task_pt_regs(bpf_get_current_task_btf()) as *const u8;
        if regs.is_null() {
            0
        } else {
            bpf_probe_read_kernel(regs.add(PT_REGS_PC).cast::<u64>()).unwrap_or(0)
        }
    };
    let pid = (id >> 32) as u32;
    match EVENTS.reserve::<FaultEvent>(0) {
        Some(mut slot) => {
            slot.write(FaultEvent {
                tag: EventTag::Fault as u32,
                sig: sig as u32,
                pid,
                tid: id as u32,
                code,
                in_call,
                pc,
                addr,
                entry_ip: entry.entry_ip,
                cookie: entry.cookie,
                since_hit_ns: now.wrapping_sub(hit),
            });
            slot.submit(0);
        }
        None => dropped(pid),
    }
}
