//! The architecture the programs are built for (`bpf_target_arch`, set by aya-build from the
//! target of the `cudatrace` being built): its calling convention and its stack pointer.
use aya_ebpf::programs::ProbeContext;
use tracer_common::callconv::CallConv;

/// The calling convention of the probed library's functions.
#[cfg(bpf_target_arch = "x86_64")]
pub const CONV: CallConv = tracer_common::callconv::X86_64;
/// The calling convention of the probed library's functions.
#[cfg(bpf_target_arch = "aarch64")]
pub const CONV: CallConv = tracer_common::callconv::AARCH64;

/// The probed thread's stack pointer at the call's first instruction.
#[inline(always)]
pub fn stack_pointer(ctx: &ProbeContext) -> u64 {
    // SAFETY: `ctx.regs` points at the probed thread's saved registers, valid (and only read)
    // for the duration of the program.
    #[cfg(bpf_target_arch = "x86_64")]
    let sp = unsafe { (*ctx.regs).rsp };
    // SAFETY: as above.
    #[cfg(bpf_target_arch = "aarch64")]
    let sp = unsafe { (*ctx.regs).sp };
    sp
}

/// The probed address: the instruction pointer when the entry probe fires (uprobes report the
/// breakpoint's address).
#[inline(always)]
pub fn entry_ip(ctx: &ProbeContext) -> u64 {
    // SAFETY: as in `stack_pointer`.
    #[cfg(bpf_target_arch = "x86_64")]
    let ip = unsafe { (*ctx.regs).rip };
    // SAFETY: as above.
    #[cfg(bpf_target_arch = "aarch64")]
    let ip = unsafe { (*ctx.regs).pc };
    ip
}

/// Offset of the program counter in the kernel's `struct pt_regs` of a user thread: `ip` after
/// fifteen registers and `orig_ax` on x86-64; `pc` after `regs[31]` and `sp` on arm64.
#[cfg(bpf_target_arch = "x86_64")]
pub const PT_REGS_PC: usize = 16 * 8;
/// Offset of the program counter in the kernel's `struct pt_regs` of a user thread.
#[cfg(bpf_target_arch = "aarch64")]
pub const PT_REGS_PC: usize = 32 * 8;
