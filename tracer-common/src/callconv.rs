//! Where a probed call's integer arguments are at its first instruction, per architecture, and
//! the launch record built from them. The eBPF programs pick the convention of the architecture
//! they are built for (`bpf_target_arch`); the unit tests below check both on any host.
//!
//! - x86-64 (System V): six arguments in `rdi rsi rdx rcx r8 r9`; the rest on the stack from
//!   `rsp + 8`, since `rsp` points at the return address the `call` pushed.
//! - aarch64 (AAPCS64): eight arguments in `x0`-`x7`; the rest on the stack from `sp`, since the
//!   return address is in the link register `x30`.
use crate::event::pack;

/// A calling convention: how many integer arguments arrive in registers, and where the stack
/// arguments start, in bytes above the stack pointer at the call's first instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallConv {
    /// Integer arguments passed in registers.
    pub register_args: usize,
    /// Offset of the first stack argument from the stack pointer at entry.
    pub stack_offset: u64,
}

/// x86-64 System V.
pub const X86_64: CallConv = CallConv {
    register_args: 6,
    stack_offset: 8,
};

/// aarch64 AAPCS64 (Linux on Arm, NVIDIA Grace).
pub const AARCH64: CallConv = CallConv {
    register_args: 8,
    stack_offset: 0,
};

/// Stack words a launch entry program reads: enough for arguments 6 to 8 (blockZ,
/// sharedMemBytes, hStream) on x86-64. On aarch64 only the first (hStream) is used; the other
/// two are still inside cuLaunchKernel's own stack arguments (kernelParams, extra).
pub const LAUNCH_STACK_WORDS: usize = 3;

// hStream (argument 8), the last one a launch record keeps, is within the stack words read.
const _: () = assert!(8 - X86_64.register_args < LAUNCH_STACK_WORDS);
const _: () = assert!(8 - AARCH64.register_args < LAUNCH_STACK_WORDS);

impl CallConv {
    /// Argument `n` (from 0) given the register arguments and the first stack words.
    #[inline(always)]
    pub fn arg(
        &self,
        n: usize,
        register: impl Fn(usize) -> u64,
        stack: &[u64; LAUNCH_STACK_WORDS],
    ) -> u64 {
        if n < self.register_args {
            register(n)
        } else {
            match stack.get(n - self.register_args) {
                Some(v) => *v,
                None => 0,
            }
        }
    }

    /// The launch record's arguments of a `cuLaunchKernel`-shaped call `(f, gridX, gridY, gridZ,
    /// blockX, blockY, blockZ, sharedMemBytes, hStream, ...)`, laid out as
    /// [`crate::CallEvent`] documents for `Launch`.
    #[inline(always)]
    pub fn launch_args(
        &self,
        register: impl Fn(usize) -> u64,
        stack: &[u64; LAUNCH_STACK_WORDS],
    ) -> [u64; 6] {
        let a = |n| self.arg(n, &register, stack);
        [
            a(0),
            pack(a(1) as u32, a(2) as u32),
            pack(a(3) as u32, a(4) as u32),
            pack(a(5) as u32, a(6) as u32),
            a(7) as u32 as u64,
            a(8),
        ]
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::{vec, vec::Vec};

    use super::*;
    use crate::{CallEvent, EventTag};

    /// cuLaunchKernel's eleven arguments, all distinct.
    const ARGS: [u64; 11] = [
        0x5555_0000_f00d, // f
        7,                // gridX
        8,                // gridY
        9,                // gridZ
        32,               // blockX
        4,                // blockY
        2,                // blockZ
        4096,             // sharedMemBytes
        0x7f00_0000_5000, // hStream
        0x7ffc_0000_0100, // kernelParams
        0,                // extra
    ];

    /// The machine state at cuLaunchKernel's first instruction, as a caller following `abi`
    /// leaves it: the register file and the memory from the stack pointer up.
    fn frame(arch: &str) -> (Vec<u64>, Vec<u64>) {
        match arch {
            // `call` pushed the return address; arguments 6.. follow it.
            "x86_64" => {
                let mut stack = vec![0x4011_2233];
                stack.extend_from_slice(&ARGS[6..]);
                (ARGS[..6].to_vec(), stack)
            }
            // `bl` put the return address in x30; arguments 8.. start at sp.
            "aarch64" => (ARGS[..8].to_vec(), ARGS[8..].to_vec()),
            _ => unreachable!(),
        }
    }

    /// What the entry program does: read the registers, and LAUNCH_STACK_WORDS words at
    /// sp + stack_offset (one user-memory read).
    fn decode(conv: &CallConv, regs: &[u64], memory: &[u64]) -> CallEvent {
        let at = conv.stack_offset as usize / 8;
        let mut stack = [0u64; LAUNCH_STACK_WORDS];
        for (i, w) in stack.iter_mut().enumerate() {
            *w = memory.get(at + i).copied().unwrap_or(0xdead);
        }
        let args = conv.launch_args(|n| regs.get(n).copied().unwrap_or(0xbad), &stack);
        CallEvent {
            tag: EventTag::Call as u32,
            api: 0,
            pid: 1,
            tid: 1,
            start_ns: 0,
            duration_ns: 0,
            result: 0,
            flags: 0,
            args,
            out: 0,
        }
    }

    fn check(conv: &CallConv, arch: &str) {
        let (regs, memory) = frame(arch);
        let ev = decode(conv, &regs, &memory);
        assert_eq!(ev.args[0], ARGS[0], "{arch}: function");
        assert_eq!(ev.grid(), [7, 8, 9], "{arch}: grid");
        assert_eq!(ev.block(), [32, 4, 2], "{arch}: block");
        assert_eq!(ev.args[4], 4096, "{arch}: shared memory");
        assert_eq!(ev.args[5], ARGS[8], "{arch}: stream");
    }

    #[test]
    fn x86_64_reads_block_z_shared_memory_and_stream_above_the_return_address() {
        check(&X86_64, "x86_64");
        // Read at sp without the offset, the return address would pose as blockZ.
        let (regs, memory) = frame("x86_64");
        let wrong = CallConv {
            stack_offset: 0,
            ..X86_64
        };
        assert_eq!(decode(&wrong, &regs, &memory).block()[2], 0x4011_2233);
    }

    #[test]
    fn aarch64_reads_eight_registers_and_the_stream_at_sp() {
        check(&AARCH64, "aarch64");
        // With x86-64's convention on an arm64 frame, blockZ would come from the stack.
        let (regs, memory) = frame("aarch64");
        assert_ne!(decode(&X86_64, &regs, &memory).args[5], ARGS[8]);
    }
}
