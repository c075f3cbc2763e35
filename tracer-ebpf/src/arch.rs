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
