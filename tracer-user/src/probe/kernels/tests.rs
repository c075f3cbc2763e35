//! Each row of the known-bad table against recorded `uname -r`, `uname -v`,
//! `/proc/version_signature` and `/proc/cmdline` fixtures, and the version parsing.
use super::*;

/// This build machine (Firecracker guest, x86-64).
const HERE: (&str, &str, &str) = (
    "6.18.44-fc-v1252",
    "#1 SMP PREEMPT_DYNAMIC @0",
    "mitigations=auto,no_guest_host,no_guest_guest console=ttyS0 quiet reboot=k panic=1",
);
/// Debian bookworm's arm64 6.1 kernel, as the VM test boots it.
const DEBIAN_61: (&str, &str, &str) = (
    "6.1.0-57-arm64",
    "#1 SMP Debian 6.1.192-3 (2026-11-02)",
    "console=ttyAMA0 rdinit=/init panic=-1",
);
/// An old Debian 6.1 (before CVE-2024-50099's fix, 6.1.114).
const DEBIAN_61_OLD: (&str, &str, &str) = (
    "6.1.0-25-arm64",
    "#1 SMP Debian 6.1.106-3 (2024-08-26)",
    "BOOT_IMAGE=/boot/vmlinuz-6.1.0-25-arm64 root=UUID=0b0c ro quiet",
);
/// Debian bookworm-security's arm64 6.12, booted with pseudo-NMIs.
const DEBIAN_612_NMI: (&str, &str, &str) = (
    "6.12.57+deb12-arm64",
    "#1 SMP Debian 6.12.57-1~deb12u1 (2026-10-20)",
    "console=ttyAMA0 rdinit=/init irqchip.gicv3_pseudo_nmi=1",
);
/// A Grace machine on a 6.17 kernel with pseudo-NMIs (Ubuntu's nvidia-64k flavour).
const UBUNTU_617_NMI: (&str, &str, &str, &str) = (
    "6.17.0-1004-nvidia-64k",
    "#4-Ubuntu SMP PREEMPT_DYNAMIC Tue Oct 14 2025",
    "Ubuntu 6.17.0-1004.4-nvidia-64k 6.17.1",
    "BOOT_IMAGE=/vmlinuz-6.17.0-1004-nvidia-64k root=UUID=ab12 ro irqchip.gicv3_pseudo_nmi=1",
);
/// The same 6.17 without pseudo-NMIs.
const UBUNTU_617: (&str, &str, &str, &str) = (
    "6.17.0-1004-nvidia-64k",
    "#4-Ubuntu SMP PREEMPT_DYNAMIC Tue Oct 14 2025",
    "Ubuntu 6.17.0-1004.4-nvidia-64k 6.17.1",
    "BOOT_IMAGE=/vmlinuz-6.17.0-1004-nvidia-64k root=UUID=ab12 ro",
);
/// Ubuntu 24.04's x86-64 6.8.
const UBUNTU_68: (&str, &str, &str, &str) = (
    "6.8.0-45-generic",
    "#45-Ubuntu SMP PREEMPT_DYNAMIC Fri Aug 30 12:02:04 UTC 2024",
    "Ubuntu 6.8.0-45.45-generic 6.8.12",
    "BOOT_IMAGE=/boot/vmlinuz-6.8.0-45-generic root=UUID=1 ro quiet splash",
);

fn debian(f: (&str, &str, &str), arch: Arch) -> Kernel {
    Kernel::from_fixture(f.0, f.1, "", f.2, arch)
}

fn ubuntu(f: (&str, &str, &str, &str), arch: Arch) -> Kernel {
    Kernel::from_fixture(f.0, f.1, f.2, f.3, arch)
}

fn ids(k: &Kernel) -> Vec<&'static str> {
    applying(k).iter().map(|r| r.id).collect()
}

#[test]
fn versions_come_from_where_each_distribution_says_them() {
    let here = debian(HERE, Arch::X86_64);
    assert_eq!(
        (here.version, here.exact, here.pseudo_nmi),
        (Version(6, 18, 44), true, false)
    );
    let d = debian(DEBIAN_61, Arch::Aarch64);
    assert_eq!((d.version, d.exact), (Version(6, 1, 192), true));
    let u = ubuntu(UBUNTU_68, Arch::X86_64);
    assert_eq!((u.version, u.exact), (Version(6, 8, 12), true));
    // An ABI name alone does not say the stable level.
    let bare = Kernel::from_fixture("6.1.0-57-arm64", "#1 SMP", "", "", Arch::Aarch64);
    assert_eq!((bare.version, bare.exact), (Version(6, 1, 0), false));
    assert!(debian(DEBIAN_612_NMI, Arch::Aarch64).pseudo_nmi);
    let off = Kernel::from_fixture(
        "6.12.57",
        "",
        "",
        "irqchip.gicv3_pseudo_nmi=0",
        Arch::Aarch64,
    );
    assert!(!off.pseudo_nmi);
}

#[test]
fn arm64_sstep_irqs_masked_refuses_stepped_sites_on_617_with_pseudo_nmi_only() {
    let row = "arm64-sstep-irqs-masked";
    assert!(ids(&ubuntu(UBUNTU_617_NMI, Arch::Aarch64)).contains(&row));
    assert!(!ids(&ubuntu(UBUNTU_617, Arch::Aarch64)).contains(&row));
    assert!(!ids(&ubuntu(UBUNTU_617_NMI, Arch::X86_64)).contains(&row));
    assert!(!ids(&debian(DEBIAN_612_NMI, Arch::Aarch64)).contains(&row));
    let fixed = Kernel::from_fixture(
        "6.18.1",
        "",
        "",
        "irqchip.gicv3_pseudo_nmi=1",
        Arch::Aarch64,
    );
    assert!(!ids(&fixed).contains(&row));
    let r = KNOWN_BAD.iter().find(|r| r.id == row).unwrap();
    assert_eq!(r.action, Action::RefuseStepped);
    assert!(r.source.contains("ea0d55ae4b32"));
}

#[test]
fn arm64_sstep_rework_backport_warns_on_612_with_pseudo_nmi_only() {
    let row = "arm64-sstep-rework-backport";
    assert!(ids(&debian(DEBIAN_612_NMI, Arch::Aarch64)).contains(&row));
    let plain = Kernel::from_fixture("6.12.57+deb12-arm64", "", "", "quiet", Arch::Aarch64);
    assert!(!ids(&plain).contains(&row));
    assert!(!ids(&debian(DEBIAN_61, Arch::Aarch64)).contains(&row));
    let r = KNOWN_BAD.iter().find(|r| r.id == row).unwrap();
    assert_eq!(r.action, Action::Warn);
}

#[test]
fn arm64_ldr_literal_applies_before_each_series_fix() {
    let row = "arm64-ldr-literal";
    assert!(ids(&debian(DEBIAN_61_OLD, Arch::Aarch64)).contains(&row));
    assert!(!ids(&debian(DEBIAN_61, Arch::Aarch64)).contains(&row));
    assert!(!ids(&debian(DEBIAN_612_NMI, Arch::Aarch64)).contains(&row));
    let at = |r: &str| Kernel::from_fixture(r, "", "", "", Arch::Aarch64);
    assert!(emulates_ldr_literal(&at("6.6.57")) && !emulates_ldr_literal(&at("6.6.58")));
    assert!(emulates_ldr_literal(&at("6.11.4")) && !emulates_ldr_literal(&at("6.11.5")));
    assert!(emulates_ldr_literal(&at("6.1.113")) && !emulates_ldr_literal(&at("6.1.114")));
    // A series without a backport (6.8) counts as not fixed; x86-64 never emulates it.
    assert!(emulates_ldr_literal(&at("6.8.12")));
    assert!(!emulates_ldr_literal(&Kernel::from_fixture(
        "6.1.100",
        "",
        "",
        "",
        Arch::X86_64
    )));
    // An unknown stable level counts as the series' first release: not fixed.
    assert!(emulates_ldr_literal(&at("6.1.0-57-arm64")));
    let r = KNOWN_BAD.iter().find(|r| r.id == row).unwrap();
    assert_eq!(r.action, Action::RefuseSites);
}

#[test]
fn orphaned_breakpoint_warns_before_616_on_both_architectures() {
    let row = "orphaned-breakpoint";
    assert!(ids(&ubuntu(UBUNTU_68, Arch::X86_64)).contains(&row));
    assert!(ids(&debian(DEBIAN_612_NMI, Arch::Aarch64)).contains(&row));
    assert!(!ids(&debian(HERE, Arch::X86_64)).contains(&row));
    assert!(!ids(&ubuntu(UBUNTU_617, Arch::Aarch64)).contains(&row));
    let r = KNOWN_BAD.iter().find(|r| r.id == row).unwrap();
    assert_eq!(
        (r.action, r.source),
        (Action::Warn, "CVE-2025-38207 (fixed in 6.16)")
    );
}

#[test]
fn arm64_wrong_pc_resume_warns_on_every_arm64_kernel_only() {
    let row = "arm64-wrong-pc-resume";
    assert!(ids(&ubuntu(UBUNTU_617, Arch::Aarch64)).contains(&row));
    assert!(ids(&debian(DEBIAN_61, Arch::Aarch64)).contains(&row));
    assert!(!ids(&ubuntu(UBUNTU_68, Arch::X86_64)).contains(&row));
    assert_eq!(ids(&debian(HERE, Arch::X86_64)), Vec::<&str>::new());
}
