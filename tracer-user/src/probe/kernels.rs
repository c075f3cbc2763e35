//! The running kernel as uprobes see it: its release (with the stable level a distribution's
//! `uname -r` hides), whether pseudo-NMIs are on, and the table of kernels known to harm a
//! probed process, each row with its source and what cudatrace does about it.
use std::fmt;

/// A kernel version, `major.minor.patch` (the stable level, where known).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version(pub u32, pub u32, pub u32);

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.0, self.1, self.2)
    }
}

/// The leading `X.Y[.Z]` of `s`.
fn leading_version(s: &str) -> Option<Version> {
    let head: String = s
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    let mut parts = head.split('.').filter(|p| !p.is_empty());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    let patch = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    Some(Version(major, minor, patch))
}

/// The CPU architecture whose uprobe rules apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// x86-64: int3 breakpoints, most instructions stepped out of line.
    X86_64,
    /// aarch64: BRK breakpoints, branches emulated, the rest stepped out of line.
    Aarch64,
}

impl Arch {
    /// The architecture this binary runs on.
    pub const HOST: Arch = if cfg!(target_arch = "aarch64") {
        Arch::Aarch64
    } else {
        Arch::X86_64
    };

    /// The label value: `x86_64` or `aarch64`.
    pub fn name(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64",
            Arch::Aarch64 => "aarch64",
        }
    }
}

/// What the uprobe rules depend on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kernel {
    /// `uname -r` as the kernel says it.
    pub release: String,
    /// The version, the stable level included where the distribution says it elsewhere.
    pub version: Version,
    /// Whether the stable level is known (a distribution's `6.1.0-28-arm64` alone does not say it).
    pub exact: bool,
    /// The architecture.
    pub arch: Arch,
    /// `irqchip.gicv3_pseudo_nmi=1` on the kernel's command line.
    pub pseudo_nmi: bool,
}

impl Kernel {
    /// Reads the running kernel: `uname`, `/proc/version_signature` (Ubuntu) and `/proc/cmdline`.
    pub fn running() -> Kernel {
        // SAFETY: uname fills the zeroed struct it is given; nothing else is touched.
        let mut u: libc::utsname = unsafe { std::mem::zeroed() };
        // SAFETY: `u` is a valid, writable utsname.
        let ok = unsafe { libc::uname(&mut u) } == 0;
        let field = |f: &[libc::c_char]| {
            // SAFETY: uname NUL-terminates each field within its array.
            let c = unsafe { std::ffi::CStr::from_ptr(f.as_ptr()) };
            c.to_string_lossy().into_owned()
        };
        let (release, build) = if ok {
            (field(&u.release), field(&u.version))
        } else {
            (String::new(), String::new())
        };
        let signature = std::fs::read_to_string("/proc/version_signature").unwrap_or_default();
        let cmdline = std::fs::read_to_string("/proc/cmdline").unwrap_or_default();
        Kernel::from_fixture(&release, &build, &signature, &cmdline, Arch::HOST)
    }

    /// The kernel these recorded strings describe: `uname -r`, `uname -v`,
    /// `/proc/version_signature` (empty where absent) and `/proc/cmdline`.
    pub fn from_fixture(
        release: &str,
        build: &str,
        signature: &str,
        cmdline: &str,
        arch: Arch,
    ) -> Kernel {
        let base = leading_version(release).unwrap_or(Version(0, 0, 0));
        // Ubuntu: "Ubuntu 6.8.0-45.45-generic 6.8.12", the upstream version last.
        let ubuntu = signature
            .split_whitespace()
            .last()
            .and_then(leading_version)
            .filter(|v| (v.0, v.1) == (base.0, base.1));
        // Debian: "#1 SMP PREEMPT_DYNAMIC Debian 6.1.119-1 (2024-11-22)".
        let debian = build
            .split_whitespace()
            .skip_while(|w| *w != "Debian")
            .nth(1)
            .and_then(leading_version)
            .filter(|v| (v.0, v.1) == (base.0, base.1));
        // A release "6.1.0-28-arm64" with patch 0 and a suffix is a distribution's ABI name.
        let abi_name = base.2 == 0 && release.contains('-');
        let (version, exact) = match ubuntu.or(debian) {
            Some(v) => (v, true),
            None => (base, !abi_name),
        };
        let pseudo_nmi = cmdline.split_whitespace().any(|w| {
            w.strip_prefix("irqchip.gicv3_pseudo_nmi=")
                .is_some_and(|v| matches!(v, "1" | "y" | "Y" | "on"))
        });
        Kernel {
            release: release.to_owned(),
            version,
            exact,
            arch,
            pseudo_nmi,
        }
    }

    /// Whether the kernel is at least `v` (a distribution kernel whose stable level is unknown
    /// counts as the series' first release: the cautious answer for a fix).
    pub fn at_least(&self, v: Version) -> bool {
        self.version >= v
    }
}

/// What cudatrace does on a known-bad kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Stepped sites are not attached unless `--allow-stepped-probes`.
    RefuseStepped,
    /// Sites whose instruction the row names are never attached.
    RefuseSites,
    /// Attach, and say why to take care.
    Warn,
}

/// One known-bad kernel: where it is known from, when it applies, what cudatrace does.
pub struct KnownBad {
    /// A short name, used in lines and tests.
    pub id: &'static str,
    /// The commit or CVE (or report) it comes from.
    pub source: &'static str,
    /// What goes wrong.
    pub harm: &'static str,
    /// Whether it applies to this kernel.
    pub applies: fn(&Kernel) -> bool,
    /// What cudatrace does.
    pub action: Action,
}

/// Whether an arm64 kernel still emulates LDR (literal) in uprobes, which hit a kernel BUG under
/// PAN (CVE-2024-50099): fixed in 6.1.114, 6.6.58, 6.11.5 and 6.12; other series count as not.
pub fn emulates_ldr_literal(k: &Kernel) -> bool {
    let Version(major, minor, _) = k.version;
    let fixed = match (major, minor) {
        (6, 1) => Version(6, 1, 114),
        (6, 6) => Version(6, 6, 58),
        (6, 11) => Version(6, 11, 5),
        _ => Version(6, 12, 0),
    };
    k.arch == Arch::Aarch64 && !k.at_least(fixed)
}

/// The known-bad kernels, in the order they are checked.
pub static KNOWN_BAD: &[KnownBad] = &[
    KnownBad {
        id: "arm64-sstep-irqs-masked",
        source: "v6.17 arm64 debug-exception rework; fixed by ea0d55ae4b32 (v6.18-rc2)",
        harm: "after a user single step, interrupts stay masked when pseudo-NMIs are on: \
               a stepped probe can hang the CPU",
        applies: |k| {
            k.arch == Arch::Aarch64
                && k.pseudo_nmi
                && k.at_least(Version(6, 17, 0))
                && !k.at_least(Version(6, 18, 0))
        },
        action: Action::RefuseStepped,
    },
    KnownBad {
        id: "arm64-sstep-rework-backport",
        source: "backport of the v6.17 debug-exception rework to 6.12 stable (proposed 2026); \
                 the fix is ea0d55ae4b32",
        harm: "a 6.12 kernel carrying the rework without its fix leaves interrupts masked after \
               a user single step when pseudo-NMIs are on",
        applies: |k| {
            k.arch == Arch::Aarch64 && k.pseudo_nmi && (k.version.0, k.version.1) == (6, 12)
        },
        action: Action::Warn,
    },
    KnownBad {
        id: "arm64-ldr-literal",
        source: "CVE-2024-50099 (fixed in 6.1.114, 6.6.58, 6.11.5, 6.12)",
        harm: "uprobes emulate LDR (literal) with a user access the kernel BUGs on under PAN",
        applies: emulates_ldr_literal,
        action: Action::RefuseSites,
    },
    KnownBad {
        id: "orphaned-breakpoint",
        source: "CVE-2025-38207 (fixed in 6.16)",
        harm: "after mremap and a VMA merge a breakpoint can stay behind detach and SIGTRAP the \
               process",
        applies: |k| !k.at_least(Version(6, 16, 0)),
        action: Action::Warn,
    },
    KnownBad {
        id: "arm64-wrong-pc-resume",
        source: "datadog-agent PR #54291 (GPU uprobes withdrawn after GB300 cases; root cause \
                 not public)",
        harm: "the arm64 single-step handler intermittently resumed a probed process at the \
               wrong PC",
        applies: |k| k.arch == Arch::Aarch64,
        action: Action::Warn,
    },
];

/// The rows of [`KNOWN_BAD`] that apply to `k`.
pub fn applying(k: &Kernel) -> Vec<&'static KnownBad> {
    KNOWN_BAD.iter().filter(|r| (r.applies)(k)).collect()
}

#[cfg(test)]
#[path = "kernels/tests.rs"]
mod tests;
