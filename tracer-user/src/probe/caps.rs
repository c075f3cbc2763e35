//! The capabilities cudatrace needs, checked before anything is loaded (one line naming what is
//! missing and what it is for), and reduced after start to what is still needed, under
//! no-new-privs.
//!
//! - `CAP_BPF` and `CAP_PERFMON`: load the programs and maps, attach uprobe_multi links and the
//!   exit tracepoint, read the traced calls' arguments (`CAP_SYS_ADMIN` stands for both).
//! - `CAP_SYS_PTRACE`: read other users' `/proc/PID/maps` and open their libraries through
//!   `/proc/PID/root` (discovery), and their `/proc/PID/exe` (identity).
//! - `CAP_DAC_READ_SEARCH`: read other users' `/proc/PID/environ` (`CUDA_VISIBLE_DEVICES`, mode
//!   0400) and libraries under container roots that are not world-readable.
use caps::{CapSet, Capability, CapsHashSet};

/// What discovery needs besides loading the probes, and what for.
pub const DISCOVERY: [(Capability, &str); 2] = [
    (
        Capability::CAP_SYS_PTRACE,
        "to read other users' /proc/PID/maps and open their libraries through /proc/PID/root",
    ),
    (
        Capability::CAP_DAC_READ_SEARCH,
        "to read other users' /proc/PID/environ (CUDA_VISIBLE_DEVICES)",
    ),
];

fn effective() -> CapsHashSet {
    caps::read(None, CapSet::Effective).unwrap_or_default()
}

/// Why tracing is not allowed, as one sentence that says what to do; `None` when it is.
/// `discovering`: no `--lib` was given, so other users' processes are looked through.
pub fn missing_privilege(discovering: bool) -> Option<String> {
    missing_from(&effective(), discovering, is_root())
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn missing_from(caps: &CapsHashSet, discovering: bool, root: bool) -> Option<String> {
    let has = |c| caps.contains(&c);
    let admin = has(Capability::CAP_SYS_ADMIN);
    let mut load = Vec::new();
    if !has(Capability::CAP_BPF) && !admin {
        load.push("CAP_BPF");
    }
    if !has(Capability::CAP_PERFMON) && !admin {
        load.push("CAP_PERFMON");
    }
    if !load.is_empty() {
        let who = if root {
            "root without"
        } else {
            "not root and without"
        };
        return Some(format!(
            "cudatrace needs root or CAP_BPF and CAP_PERFMON to load its probes, and runs as {who} {}: \
             run it with sudo, or grant the capabilities (securityContext.capabilities.add in Kubernetes)",
            load.join(" and ")
        ));
    }
    if !discovering {
        return None;
    }
    let lacking: Vec<String> = DISCOVERY
        .iter()
        .filter(|(c, _)| !has(*c))
        .map(|(c, what)| format!("{c} ({what})"))
        .collect();
    (!lacking.is_empty()).then(|| {
        format!(
            "cudatrace needs {} to find the libcuda of every process without --lib, and runs without: \
             grant it (securityContext.capabilities.add in Kubernetes), or name the libraries with --lib",
            lacking.join(" and ")
        )
    })
}

/// After start: sets no-new-privs and keeps only what is still needed: the discovery
/// capabilities (identity of processes seen later), and while `watching` for new libraries
/// what attaching takes (`CAP_SYS_ADMIN` too with `classic` uprobes). Everything else leaves
/// the effective, permitted, inheritable and ambient sets. Returns the set kept.
pub fn reduce(watching: bool, classic: bool) -> std::io::Result<CapsHashSet> {
    // SAFETY: prctl(PR_SET_NO_NEW_PRIVS) takes plain integers and affects only this process.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut wanted: CapsHashSet = DISCOVERY.iter().map(|(c, _)| *c).collect();
    if watching {
        wanted.extend([Capability::CAP_BPF, Capability::CAP_PERFMON]);
        if classic {
            wanted.insert(Capability::CAP_SYS_ADMIN);
        }
    }
    let permitted = caps::read(None, CapSet::Permitted).map_err(std::io::Error::other)?;
    let keep: CapsHashSet = wanted.intersection(&permitted).copied().collect();
    let io = |e: caps::errors::CapsError| std::io::Error::other(e.to_string());
    caps::clear(None, CapSet::Ambient).map_err(io)?;
    caps::clear(None, CapSet::Inheritable).map_err(io)?;
    caps::set(None, CapSet::Effective, &keep).map_err(io)?;
    caps::set(None, CapSet::Permitted, &keep).map_err(io)?;
    Ok(keep)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(caps: &[Capability]) -> CapsHashSet {
        caps.iter().copied().collect()
    }

    #[test]
    fn names_what_is_missing_and_what_for() {
        use Capability::*;
        let all = set(&[CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE, CAP_DAC_READ_SEARCH]);
        assert_eq!(missing_from(&all, true, false), None);
        assert_eq!(
            missing_from(
                &set(&[CAP_SYS_ADMIN, CAP_SYS_PTRACE, CAP_DAC_READ_SEARCH]),
                true,
                true
            ),
            None
        );
        let no_bpf = missing_from(&set(&[CAP_PERFMON]), false, false).unwrap();
        assert!(no_bpf.contains("not root and without CAP_BPF:"), "{no_bpf}");
        let no_ptrace = missing_from(
            &set(&[CAP_BPF, CAP_PERFMON, CAP_DAC_READ_SEARCH]),
            true,
            false,
        )
        .unwrap();
        assert!(
            no_ptrace
                .starts_with("cudatrace needs CAP_SYS_PTRACE (to read other users' /proc/PID/maps"),
            "{no_ptrace}"
        );
        assert!(!no_ptrace.contains("CAP_DAC_READ_SEARCH"), "{no_ptrace}");
        assert_eq!(
            missing_from(&set(&[CAP_BPF, CAP_PERFMON]), false, false),
            None,
            "--lib needs no discovery rights"
        );
    }
}
