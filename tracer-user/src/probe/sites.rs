//! How the running kernel will run each probed instruction: emulated in the kernel (no single
//! step), stepped out of line (copied to the XOL page and single-stepped: the path that can go
//! wrong), or refused (the kernel would reject the probe, or it is known to harm). The rules, as
//! read in `arch/x86/kernel/uprobes.c` and `arch/arm64/kernel/probes/decode-insn.c`, are all
//! here, each with its test in `sites/tests.rs`.
use super::kernels::{emulates_ldr_literal, Arch, Kernel, Version};

/// How one probe site runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SitePath {
    /// The kernel emulates the instruction: no single step.
    Emulated,
    /// The instruction is single-stepped out of line.
    Stepped,
    /// Never attached; the reason says why.
    Refused(&'static str),
}

impl SitePath {
    /// The label value: `emulated`, `stepped` or `refused`.
    pub fn name(self) -> &'static str {
        match self {
            SitePath::Emulated => "emulated",
            SitePath::Stepped => "stepped",
            SitePath::Refused(_) => "refused",
        }
    }
}

/// The path of the instruction whose first bytes are `code`, probed at file offset `offset`.
pub fn classify(kernel: &Kernel, offset: u64, code: &[u8]) -> SitePath {
    match kernel.arch {
        Arch::X86_64 => x86_64(code),
        Arch::Aarch64 => {
            if !offset.is_multiple_of(4) {
                return SitePath::Refused("not 4-byte aligned (arm64 uprobes need it)");
            }
            match code.get(..4) {
                Some(b) => aarch64(kernel, u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
                None => SitePath::Refused("past the end of the file"),
            }
        }
    }
}

/// One-byte opcodes the x86-64 uprobe table rejects (`good_insns_64` zero entries that are not
/// prefixes): invalid in 64-bit mode, in/out, int3/int/into/iret, hlt, cli/sti, icebp, VEX/EVEX.
fn x86_refused_1byte(op: u8) -> bool {
    matches!(op,
        0x06 | 0x07 | 0x0e | 0x16 | 0x17 | 0x1e | 0x1f | 0x27 | 0x2f | 0x37 | 0x3f
        | 0x60..=0x62 | 0x6c..=0x6f | 0x82 | 0xc4 | 0xc5 | 0xcc..=0xcf | 0xd4..=0xd6
        | 0xe4..=0xe7 | 0xec..=0xef | 0xf1 | 0xf4 | 0xfa | 0xfb)
}

/// Second bytes of `0f xx` the table rejects (`good_2byte_insns` zero entries), three-byte
/// escapes included.
fn x86_refused_2byte(op: u8) -> bool {
    matches!(op,
        0x00..=0x0d | 0x18 | 0x24..=0x27 | 0x30 | 0x34..=0x3f | 0x78..=0x7d | 0xa6 | 0xa7
        | 0xae | 0xb8 | 0xd0 | 0xf0 | 0xff)
}

/// x86-64: prefixes, then the emulated branches, nops and pushes; the table's refusals; the rest
/// is stepped.
fn x86_64(code: &[u8]) -> SitePath {
    let mut i = 0;
    let mut operand16 = false;
    let mut others = false;
    while let Some(&b) = code.get(i) {
        match b {
            0x26 | 0x2e | 0x36 | 0x3e | 0xf0 => {
                return SitePath::Refused("segment or lock prefix (uprobes reject it)")
            }
            0x66 => operand16 = true,
            0x67 | 0xf2 | 0xf3 | 0x64 | 0x65 => others = true,
            _ => break,
        }
        i += 1;
    }
    let rex = code.get(i).copied().filter(|b| (0x40..=0x4f).contains(b));
    if rex.is_some() {
        i += 1;
    }
    let Some(&op) = code.get(i) else {
        return SitePath::Refused("past the end of the file");
    };
    let branch = matches!(op, 0xe8 | 0xe9 | 0xeb | 0x70..=0x7f);
    if op == 0x0f {
        let Some(&op2) = code.get(i + 1) else {
            return SitePath::Refused("past the end of the file");
        };
        if x86_refused_2byte(op2) {
            return SitePath::Refused("a two-byte opcode uprobes reject");
        }
        if (0x80..=0x8f).contains(&op2) {
            return if operand16 {
                SitePath::Refused("a branch with a 0x66 prefix (uprobes reject it)")
            } else {
                SitePath::Emulated
            };
        }
        return SitePath::Stepped;
    }
    if x86_refused_1byte(op) {
        return SitePath::Refused("an opcode uprobes reject");
    }
    if branch {
        return if operand16 {
            SitePath::Refused("a branch with a 0x66 prefix (uprobes reject it)")
        } else {
            SitePath::Emulated
        };
    }
    // "prefix* + nop": 0x90 after only 0x66 prefixes, without REX.
    if op == 0x90 && rex.is_none() && !others {
        return SitePath::Emulated;
    }
    // push reg: one byte, or REX 0x41 and one byte (r8-r15), nothing else.
    if (0x50..=0x57).contains(&op) && !operand16 && !others && matches!(rex, None | Some(0x41)) {
        return SitePath::Emulated;
    }
    SitePath::Stepped
}

const fn masked(insn: u32, mask: u32, value: u32) -> bool {
    insn & mask == value
}

/// HINT immediates (CRm:op2) arm64 single-steps: NOP, XPACLRI, PACIA1716, PACIB1716, PACIAZ,
/// PACIASP, PACIBZ, PACIBSP and the BTIs; other hints are refused.
fn steppable_hint(imm: u32) -> bool {
    matches!(imm, 0 | 7 | 8 | 10 | 24..=27 | 32 | 34 | 36 | 38)
}

/// aarch64, in `arm_probe_decode_insn`'s order: steppable, else one of the emulated branches,
/// else refused; NOP emulated from 6.13; LDR (literal) emulated (and harmful) before
/// CVE-2024-50099's fix.
fn aarch64(kernel: &Kernel, insn: u32) -> SitePath {
    let ldr_literal =
        masked(insn, 0xbf00_0000, 0x1800_0000) || masked(insn, 0xff00_0000, 0x9800_0000);
    if ldr_literal {
        return if emulates_ldr_literal(kernel) {
            SitePath::Refused("LDR (literal): this kernel emulates it with a user access it BUGs on under PAN (CVE-2024-50099)")
        } else {
            SitePath::Refused("LDR (literal): uprobes reject it (since CVE-2024-50099's fix)")
        };
    }
    if insn == 0xd503_201f && kernel.at_least(Version(6, 13, 0)) {
        return SitePath::Emulated;
    }
    // Branches, exception generation and system instructions.
    if masked(insn, 0x1c00_0000, 0x1400_0000) {
        let emulated = masked(insn, 0xff00_0010, 0x5400_0000) // B.cond
            || masked(insn, 0x7e00_0000, 0x3400_0000) // CBZ, CBNZ
            || masked(insn, 0x7e00_0000, 0x3600_0000) // TBZ, TBNZ
            || masked(insn, 0x7c00_0000, 0x1400_0000) // B, BL
            || masked(insn, 0xffdf_fc1f, 0xd61f_0000) // BR, BLR
            || masked(insn, 0xffff_fc1f, 0xd65f_0000); // RET
        if emulated {
            return SitePath::Emulated;
        }
        let branch_like = masked(insn, 0xfe00_0000, 0xd600_0000) // other register branches
            || masked(insn, 0xff00_0000, 0xd400_0000) // SVC, HVC, SMC, BRK, HLT
            || masked(insn, 0xfff8_f01f, 0xd500_401f) // MSR (immediate)
            || masked(insn, 0xfff0_0000, 0xd510_0000); // MSR (register)
        if branch_like {
            return SitePath::Refused("a branch, exception or MSR arm64 uprobes reject");
        }
        if masked(insn, 0xfff0_0000, 0xd530_0000) {
            let daif = (insn & 0x1f_ffe0) >> 5 == 0xda11;
            return if daif {
                SitePath::Stepped
            } else {
                SitePath::Refused("MRS of a register other than DAIF (arm64 uprobes reject it)")
            };
        }
        if masked(insn, 0xffff_f01f, 0xd503_201f) {
            return if steppable_hint((insn >> 5) & 0x7f) {
                SitePath::Stepped
            } else {
                SitePath::Refused("a hint arm64 uprobes reject (AUT*, WFE, WFI, ...)")
            };
        }
        return SitePath::Stepped;
    }
    if masked(insn, 0x1f00_0000, 0x1000_0000) {
        return SitePath::Emulated; // ADR, ADRP
    }
    if masked(insn, 0xff00_0000, 0xd800_0000) {
        return SitePath::Refused("PRFM (literal): arm64 uprobes reject PC-relative loads");
    }
    if masked(insn, 0x3f00_0000, 0x1c00_0000) {
        // The kernel steps it, from the XOL page: it would load from the wrong address.
        return SitePath::Refused(
            "LDR (literal, SIMD&FP): stepped out of line it would load the wrong address",
        );
    }
    if masked(insn, 0x3f00_0000, 0x0800_0000) {
        return SitePath::Refused("an exclusive load or store (arm64 uprobes reject it)");
    }
    SitePath::Stepped
}

/// Sites by path, for one library or all.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SiteCounts {
    /// Sites the kernel emulates.
    pub emulated: u64,
    /// Sites single-stepped out of line.
    pub stepped: u64,
    /// Sites not attached.
    pub refused: u64,
}

impl SiteCounts {
    /// Counts one site.
    pub fn add(&mut self, path: SitePath) {
        match path {
            SitePath::Emulated => self.emulated += 1,
            SitePath::Stepped => self.stepped += 1,
            SitePath::Refused(_) => self.refused += 1,
        }
    }
}

#[cfg(test)]
#[path = "sites/tests.rs"]
mod tests;
