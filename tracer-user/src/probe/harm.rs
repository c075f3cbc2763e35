//! Suspects itself first: a synchronous fault (SIGILL, SIGTRAP, SIGBUS, SIGSEGV) of a thread
//! within [`WINDOW_NS`] of its last probe hit, whose PC is at the probed address, within
//! [`PAST_ENTRY`] bytes past it, in the uprobe XOL page, or outside any executable mapping (a
//! corrupted return), is the probe's harm, not the workload's crash. A fault anywhere else is the
//! workload's own, and so is one the process made itself ([`self_made`]: a signal sent from user
//! space, a jump below `mmap_min_addr`, an instruction fetched from a page it made
//! non-executable), wherever its PC.
use tracer_common::{api::COOKIE_API_MASK, Api, FaultEvent};

/// How soon after a probe hit a fault counts against the probe.
pub const WINDOW_NS: u64 = 10_000_000;
/// How far past a probed entry a fault counts against the probe: the first instructions, where
/// a stepped instruction's wrong resume lands.
pub const PAST_ENTRY: u64 = 32;

/// A probe's harm, with its evidence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Harm {
    /// The harmed process.
    pub pid: u32,
    /// Its faulting thread.
    pub tid: u32,
    /// SIGILL, SIGTRAP, SIGBUS or SIGSEGV.
    pub signal: &'static str,
    /// The library whose probe it was (`unknown` when it cannot be told).
    pub library: String,
    /// The entry point whose probe the thread hit last.
    pub symbol: &'static str,
    /// Where it faulted, against the probe.
    pub place: Place,
    /// The faulting PC.
    pub pc: u64,
    /// The probed address.
    pub site: u64,
    /// The probed instruction's first bytes, from the file (hex); for a kernel-log harm, the
    /// kernel's line.
    pub instruction: String,
    /// The running kernel's release.
    pub kernel: String,
    /// Microseconds from the probe hit to the fault.
    pub after_us: u64,
    /// The faulting process's tenant (`identity::Tenant::unit`).
    pub tenant: String,
    /// Why the breaker opened; `None`: suspected only (`CudatraceProbeHarmSuspected`), the
    /// probes kept.
    pub basis: Option<Basis>,
}

/// What corroborated a harm enough to open the node's breaker (`probe::scope`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Basis {
    /// No other tenant uses the library.
    OnlyTenant,
    /// Another tenant faulted the same way at this library before.
    SecondTenant {
        /// That tenant.
        first: String,
        /// Its fault, in a line.
        evidence: String,
    },
    /// The kernel's own uprobe log line names the process.
    KernelLog,
    /// The breaker was half-open (opened on another kernel).
    HalfOpen,
}

impl Basis {
    /// In words, for the evidence.
    pub fn describe(&self) -> String {
        match self {
            Basis::OnlyTenant => "no other tenant uses this library".into(),
            Basis::SecondTenant { first, evidence } => {
                format!("a second tenant faulted the same way (first tenant {first}: {evidence})")
            }
            Basis::KernelLog => "the kernel's uprobe log names the process".into(),
            Basis::HalfOpen => "the breaker was half-open after a kernel change".into(),
        }
    }
}

impl Harm {
    /// The evidence in a line.
    pub fn line(&self) -> String {
        let tenant = if self.tenant.is_empty() {
            String::new()
        } else {
            format!(", tenant {}", self.tenant)
        };
        if self.place == Place::KernelLog {
            return format!(
                "the kernel logged for pid {} (library {}): {:?}, kernel {}{tenant}",
                self.pid, self.library, self.instruction, self.kernel
            );
        }
        format!(
            "{} in pid {} (tid {}) {} of {} in {} (pc {:#x}, site {:#x}: {}), {} µs after the probe hit, kernel {}{tenant}",
            self.signal,
            self.pid,
            self.tid,
            self.place.describe(),
            self.symbol,
            self.library,
            self.pc,
            self.site,
            self.instruction,
            self.after_us,
            self.kernel
        )
    }
}

/// Where the fault was, against the probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// At the probed address itself.
    AtSite,
    /// This many bytes past the probed entry.
    PastEntry(u64),
    /// In the uprobe XOL page (`[uprobes]`).
    Xol,
    /// In no executable mapping: a corrupted return or jump.
    Outside,
    /// The kernel logged a failure in its uprobe single-step path for this process.
    KernelLog,
}

impl Place {
    /// In words, for the evidence.
    pub fn describe(self) -> String {
        match self {
            Place::AtSite => "at the probed address".into(),
            Place::PastEntry(n) => format!("{n} bytes past the probed entry"),
            Place::Xol => "in the uprobe XOL page".into(),
            Place::Outside => "outside any executable mapping".into(),
            Place::KernelLog => "in the kernel's uprobe path (its log)".into(),
        }
    }
}

/// A mapping of the faulting process, as far as the check needs: its range, whether it is
/// executable, and its name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Region {
    /// First address.
    pub start: u64,
    /// One past the last.
    pub end: u64,
    /// Executable.
    pub exec: bool,
    /// The path or `[name]` (empty for anonymous).
    pub name: String,
}

/// The regions of `/proc/PID/maps` text (at most 4 MiB of it read; `None`: gone).
pub fn regions(pid: u32) -> Option<Vec<Region>> {
    use std::io::Read as _;
    let mut text = String::new();
    std::fs::File::open(format!("/proc/{pid}/maps"))
        .ok()?
        .take(4 << 20)
        .read_to_string(&mut text)
        .ok()?;
    Some(
        text.lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                let (s, e) = f.next()?.split_once('-')?;
                let perms = f.next()?;
                let name = f.nth(3).unwrap_or("").to_owned();
                Some(Region {
                    start: u64::from_str_radix(s, 16).ok()?,
                    end: u64::from_str_radix(e, 16).ok()?,
                    exec: perms.contains('x'),
                    name,
                })
            })
            .collect(),
    )
}

/// `SIGSEGV`.
const SIGSEGV: u32 = 11;
/// `si_code` of a SIGSEGV on a mapped page without the access asked for.
const SEGV_ACCERR: i32 = 2;
/// `si_code` of `kill()`; what user space sends is this or below (`SI_QUEUE`, `SI_TKILL`...).
const SI_USER: i32 = 0;

/// Why a fault is the process's own doing even where it looks like a probe's harm; `None` when
/// nothing says so. `mmap_min_addr` is the lowest address a process may map.
pub fn self_made(f: &FaultEvent, mmap_min_addr: u64) -> Option<&'static str> {
    if f.code <= SI_USER {
        return Some("a signal sent from user space (kill, tgkill, raise), not a fault");
    }
    if f.pc < mmap_min_addr {
        return Some("a jump below mmap_min_addr (a null or tiny function pointer)");
    }
    if f.sig == SIGSEGV && f.code == SEGV_ACCERR && f.addr == f.pc {
        return Some("an instruction fetched from a page the process made non-executable (SEGV_ACCERR at the PC); a probe changes no page's protection");
    }
    None
}

/// The lowest address a process may map (`vm.mmap_min_addr`; 4096 when unreadable).
pub fn mmap_min_addr() -> u64 {
    std::fs::read_to_string("/proc/sys/vm/mmap_min_addr")
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(4096)
        .max(4096)
}

/// The api of the thread's last probed call.
pub fn api(f: &FaultEvent) -> Option<Api> {
    Api::from_id((f.cookie & COOKIE_API_MASK) as u32)
}

/// The signal's name.
pub fn signal_name(sig: u32) -> &'static str {
    match sig {
        4 => "SIGILL",
        5 => "SIGTRAP",
        7 => "SIGBUS",
        11 => "SIGSEGV",
        _ => "other",
    }
}

/// Whether `f` is a probe's harm, and where; `regions` is the process's maps when it could
/// still be read.
pub fn judge(f: &FaultEvent, regions: Option<&[Region]>) -> Option<Place> {
    if f.since_hit_ns > WINDOW_NS || f.entry_ip == 0 || f.pc == 0 {
        return None;
    }
    if f.pc == f.entry_ip {
        return Some(Place::AtSite);
    }
    let past = f.pc.wrapping_sub(f.entry_ip);
    if past < PAST_ENTRY {
        return Some(Place::PastEntry(past));
    }
    // A process whose memory is already gone (it is dying) shows no mappings: unknown.
    let regions = regions.filter(|r| !r.is_empty())?;
    match regions.iter().find(|r| (r.start..r.end).contains(&f.pc)) {
        Some(r) if r.name == "[uprobes]" => Some(Place::Xol),
        Some(r) if r.exec => None,
        _ => Some(Place::Outside),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fault(pc: u64, since_hit_ns: u64) -> FaultEvent {
        FaultEvent {
            tag: 5,
            sig: 4,
            pid: 7,
            tid: 7,
            code: 2,
            in_call: 1,
            pc,
            addr: pc,
            entry_ip: 0x7f00_0000_3a00,
            cookie: Api::CtxSynchronize.cookie(),
            since_hit_ns,
        }
    }

    fn maps() -> Vec<Region> {
        let r = |start, end, exec, name: &str| Region {
            start,
            end,
            exec,
            name: name.into(),
        };
        vec![
            r(0x5500_0000_0000, 0x5500_0001_0000, true, "/usr/bin/python3"),
            r(
                0x7f00_0000_0000,
                0x7f00_0010_0000,
                true,
                "/usr/lib/libcuda.so.1",
            ),
            r(
                0x7f00_0020_0000,
                0x7f00_0030_0000,
                false,
                "/usr/lib/libcuda.so.1",
            ),
            r(0x7fff_f000_0000, 0x7fff_f000_1000, true, "[uprobes]"),
        ]
    }

    #[test]
    fn a_fault_at_or_just_past_the_probed_entry_soon_after_the_hit_is_harm() {
        let m = maps();
        assert_eq!(
            judge(&fault(0x7f00_0000_3a00, 1_000), Some(&m)),
            Some(Place::AtSite)
        );
        assert_eq!(
            judge(&fault(0x7f00_0000_3a0c, 1_000), None),
            Some(Place::PastEntry(12))
        );
        assert_eq!(
            judge(&fault(0x7f00_0000_3a1f, 1_000), Some(&m)),
            Some(Place::PastEntry(31))
        );
        assert_eq!(api(&fault(0, 0)), Some(Api::CtxSynchronize));
    }

    #[test]
    fn a_fault_in_the_xol_page_or_outside_executable_code_is_harm() {
        let m = maps();
        assert_eq!(
            judge(&fault(0x7fff_f000_0080, 5_000), Some(&m)),
            Some(Place::Xol)
        );
        assert_eq!(
            judge(&fault(0x7f00_0020_0010, 5_000), Some(&m)),
            Some(Place::Outside)
        );
        assert_eq!(judge(&fault(0x1234, 5_000), Some(&m)), Some(Place::Outside));
    }

    use tracer_common::SI_CODE_UNKNOWN;

    #[test]
    fn faults_the_process_made_itself_are_its_own_wherever_the_pc() {
        let at_site = 0x7f00_0000_3a00;
        let mut f = fault(at_site, 1_000);
        assert_eq!(
            self_made(&f, 65536),
            None,
            "ILL_ILLOPN at the site: not its own"
        );
        // raise(SIGILL) right after a call: SI_TKILL.
        f.code = -6;
        assert!(self_made(&f, 65536).unwrap().contains("user space"));
        f.code = 0;
        assert!(self_made(&f, 65536).unwrap().contains("user space"));
        // The library's page made non-executable, then called: SEGV_ACCERR at the PC.
        let mut f = fault(at_site, 1_000);
        (f.sig, f.code, f.addr) = (11, 2, at_site);
        assert!(self_made(&f, 65536).unwrap().contains("non-executable"));
        // The same si_code on a data access (the address is not the PC): not said to be its own.
        f.addr = 0x1000_0000;
        assert_eq!(self_made(&f, 65536), None);
        // A tiny function pointer.
        let mut f = fault(0x10, 1_000);
        (f.sig, f.code, f.addr) = (11, 1, 0x10);
        assert!(self_made(&f, 65536).unwrap().contains("mmap_min_addr"));
        // An unreadable siginfo is never taken for a signal from user space.
        let mut f = fault(at_site, 1_000);
        f.code = SI_CODE_UNKNOWN;
        assert_eq!(self_made(&f, 65536), None);
        assert!(mmap_min_addr() >= 4096);
    }

    #[test]
    fn the_workloads_own_fault_or_a_late_one_is_not() {
        let m = maps();
        // In the workload's own code, or deep in the library's: the workload's crash.
        assert_eq!(judge(&fault(0x5500_0000_1000, 1_000), Some(&m)), None);
        assert_eq!(judge(&fault(0x7f00_0000_3a20, 1_000), Some(&m)), None);
        // Long after the last hit: not the probe's.
        assert_eq!(
            judge(&fault(0x7f00_0000_3a00, WINDOW_NS + 1), Some(&m)),
            None
        );
        // A process gone before its maps were read, or dying with none left: only the PC
        // against the entry decides.
        assert_eq!(judge(&fault(0x1234, 1_000), None), None);
        assert_eq!(judge(&fault(0x1234, 1_000), Some(&[])), None);
    }
}
