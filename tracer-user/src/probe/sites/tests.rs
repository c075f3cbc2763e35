//! One test per rule of `sites`, on real encodings.
use super::*;

fn x86() -> Kernel {
    Kernel::from_fixture("6.18.44", "", "", "", Arch::X86_64)
}

fn arm(release: &str) -> Kernel {
    Kernel::from_fixture(release, "", "", "", Arch::Aarch64)
}

fn a64(k: &Kernel, insn: u32) -> SitePath {
    classify(k, 0x1000, &insn.to_le_bytes())
}

fn refused(p: SitePath) -> bool {
    matches!(p, SitePath::Refused(_))
}

#[test]
fn x86_push_of_a_register_is_emulated_but_not_with_other_prefixes() {
    let k = x86();
    assert_eq!(
        classify(&k, 1, &[0x55, 0x48, 0x89, 0xe5]),
        SitePath::Emulated
    );
    assert_eq!(classify(&k, 1, &[0x41, 0x57]), SitePath::Emulated);
    assert_eq!(classify(&k, 1, &[0x66, 0x55]), SitePath::Stepped);
    assert_eq!(classify(&k, 1, &[0x48, 0x55]), SitePath::Stepped);
}

#[test]
fn x86_relative_calls_jumps_and_conditional_jumps_are_emulated_without_0x66() {
    let k = x86();
    for code in [
        &[0xe8, 1, 0, 0, 0][..],
        &[0xe9, 1, 0, 0, 0],
        &[0xeb, 2],
        &[0x74, 2],
        &[0x0f, 0x84, 1, 0, 0, 0],
    ] {
        assert_eq!(classify(&k, 1, code), SitePath::Emulated, "{code:x?}");
    }
    assert!(refused(classify(&k, 1, &[0x66, 0xe8, 1, 0])));
    assert!(refused(classify(&k, 1, &[0x66, 0x0f, 0x84, 1, 0])));
}

#[test]
fn x86_nop_after_only_0x66_prefixes_is_emulated() {
    let k = x86();
    assert_eq!(classify(&k, 1, &[0x90]), SitePath::Emulated);
    assert_eq!(classify(&k, 1, &[0x66, 0x66, 0x90]), SitePath::Emulated);
    // xchg %r8,%rax and a multi-byte nopl are not that rule's.
    assert_eq!(classify(&k, 1, &[0x41, 0x90]), SitePath::Stepped);
    assert_eq!(
        classify(&k, 1, &[0x0f, 0x1f, 0x44, 0, 0]),
        SitePath::Stepped
    );
}

#[test]
fn x86_what_function_entries_start_with_is_stepped() {
    let k = x86();
    for code in [
        &[0xf3, 0x0f, 0x1e, 0xfa][..], // endbr64
        &[0x48, 0x83, 0xec, 0x08],     // sub $8,%rsp
        &[0x48, 0x89, 0xe5],           // mov %rsp,%rbp
        &[0x8b, 0x05, 0, 0, 0, 0],     // mov 0(%rip),%eax
        &[0x31, 0xc0],                 // xor %eax,%eax
    ] {
        assert_eq!(classify(&k, 1, code), SitePath::Stepped, "{code:x?}");
    }
}

#[test]
fn x86_segment_and_lock_prefixes_are_refused() {
    let k = x86();
    for p in [0x26, 0x2e, 0x36, 0x3e, 0xf0] {
        assert!(refused(classify(&k, 1, &[p, 0x01, 0x07])), "{p:x}");
    }
}

#[test]
fn x86_opcodes_the_table_rejects_are_refused() {
    let k = x86();
    for code in [
        &[0xcc][..],         // int3
        &[0xcd, 0x80],       // int
        &[0xf4],             // hlt
        &[0xfa],             // cli
        &[0xe4, 0x60],       // in
        &[0xc5, 0xf8, 0x77], // VEX vzeroupper
        &[0x62, 0xf1],       // EVEX
        &[0x0f, 0x05],       // syscall
        &[0x0f, 0x0b],       // ud2
        &[0x0f, 0x38, 0x00], // three-byte escape
        &[],                 // nothing to read
    ] {
        assert!(refused(classify(&k, 1, code)), "{code:x?}");
    }
}

#[test]
fn arm64_branches_and_adr_are_emulated() {
    let k = arm("6.12.57");
    for insn in [
        0x1400_0010u32, // b
        0x9400_0010,    // bl
        0x5400_0040,    // b.eq
        0xb400_0040,    // cbz x0
        0x3500_0040,    // cbnz w0
        0x3700_0040,    // tbnz
        0x1000_0000,    // adr x0
        0x9000_0000,    // adrp x0
        0xd61f_0200,    // br x16
        0xd63f_0100,    // blr x8
        0xd65f_03c0,    // ret
    ] {
        assert_eq!(a64(&k, insn), SitePath::Emulated, "{insn:08x}");
    }
}

#[test]
fn arm64_what_function_entries_start_with_is_stepped() {
    let k = arm("6.12.57");
    for insn in [
        0xd503_233fu32, // paciasp
        0xd503_245f,    // bti c
        0xa9bf_7bfd,    // stp x29, x30, [sp, #-16]!
        0xd100_43ff,    // sub sp, sp, #16
        0x9100_03fd,    // mov x29, sp
        0xd53b_4220,    // mrs x0, daif
    ] {
        assert_eq!(a64(&k, insn), SitePath::Stepped, "{insn:08x}");
    }
}

#[test]
fn arm64_nop_is_emulated_from_6_13_and_stepped_before() {
    assert_eq!(a64(&arm("6.12.57"), 0xd503_201f), SitePath::Stepped);
    assert_eq!(a64(&arm("6.13.0"), 0xd503_201f), SitePath::Emulated);
}

#[test]
fn arm64_exceptions_msr_mrs_auth_and_hints_are_refused() {
    let k = arm("6.12.57");
    for insn in [
        0xd65f_0bffu32, // retaa
        0xd400_0001,    // svc #0
        0xd420_0000,    // brk #0
        0xd51b_4220,    // msr daif, x0
        0xd53b_d040,    // mrs x0, tpidr_el0
        0xd503_23bf,    // autiasp
        0xd503_205f,    // wfe
        0xd503_207f,    // wfi
    ] {
        assert!(refused(a64(&k, insn)), "{insn:08x}");
    }
}

#[test]
fn arm64_literal_loads_and_exclusives_are_refused_with_the_cve_said_where_it_applies() {
    let old = arm("6.1.100");
    let fixed = arm("6.12.57");
    for insn in [0x5800_0040u32, 0x9800_0040] {
        let (SitePath::Refused(a), SitePath::Refused(b)) = (a64(&old, insn), a64(&fixed, insn))
        else {
            panic!("{insn:08x} not refused");
        };
        assert!(a.contains("BUGs") && !b.contains("BUGs"), "{a} / {b}");
    }
    for insn in [
        0xd800_0040u32, // prfm (literal)
        0x9c00_0040,    // ldr q0, literal
        0xc85f_7c00,    // ldxr
        0xc800_7c20,    // stxr
        0xc8df_fc00,    // ldar
    ] {
        assert!(refused(a64(&fixed, insn)), "{insn:08x}");
    }
}

#[test]
fn arm64_a_misaligned_or_truncated_site_is_refused() {
    let k = arm("6.12.57");
    assert!(refused(classify(&k, 0x1002, &0xd503_233fu32.to_le_bytes())));
    assert!(refused(classify(&k, 0x1000, &[0x3f, 0x23])));
}
