//! The daemon's own fence, raised before it starts a thread (every later thread inherits it),
//! so that a bug a tenant could exploit in it does not reach other processes: a seccomp filter
//! under which the system calls cudatrace never makes fail with EPERM (ptrace, the cross-process
//! memory calls, `pidfd_getfd`, module and kexec loading, mounts, namespaces, keyrings, ...).
//! Writing another process's memory through `/proc/PID/mem` is fenced by who it is instead: it
//! runs as a uid of its own without `CAP_DAC_OVERRIDE`, and that file is its owner's, mode 0600.
//! Landlock, which would confine its writes, also confines its reads of other processes' `/proc`
//! (a Landlock domain may not inspect processes outside it), which discovery is made of: so it
//! is not used. Once it runs as that uid, [`check`] proves both: `ptrace` on itself must fail
//! with EPERM (the kernel would say ESRCH), and opening `/proc/1/mem` for writing must fail.

/// Calls of x86-64 alone that cudatrace never makes.
#[cfg(target_arch = "x86_64")]
const ARCH_ONLY: &[(&str, i64)] = &[
    ("iopl", libc::SYS_iopl),
    ("ioperm", libc::SYS_ioperm),
    ("modify_ldt", libc::SYS_modify_ldt),
    ("uselib", libc::SYS_uselib),
    ("mknod", libc::SYS_mknod),
];
/// aarch64 has none of those calls.
#[cfg(not(target_arch = "x86_64"))]
const ARCH_ONLY: &[(&str, i64)] = &[];

/// System calls cudatrace never makes, denied with EPERM (name, number).
pub fn denied() -> Vec<(&'static str, i64)> {
    let mut calls = vec![
        ("ptrace", libc::SYS_ptrace),
        ("process_vm_readv", libc::SYS_process_vm_readv),
        ("process_vm_writev", libc::SYS_process_vm_writev),
        ("pidfd_getfd", libc::SYS_pidfd_getfd),
        ("kcmp", libc::SYS_kcmp),
        ("kexec_load", libc::SYS_kexec_load),
        ("kexec_file_load", libc::SYS_kexec_file_load),
        ("init_module", libc::SYS_init_module),
        ("finit_module", libc::SYS_finit_module),
        ("delete_module", libc::SYS_delete_module),
        ("mount", libc::SYS_mount),
        ("umount2", libc::SYS_umount2),
        ("pivot_root", libc::SYS_pivot_root),
        ("chroot", libc::SYS_chroot),
        ("fsopen", libc::SYS_fsopen),
        ("fsmount", libc::SYS_fsmount),
        ("move_mount", libc::SYS_move_mount),
        ("open_tree", libc::SYS_open_tree),
        ("setns", libc::SYS_setns),
        ("unshare", libc::SYS_unshare),
        ("swapon", libc::SYS_swapon),
        ("swapoff", libc::SYS_swapoff),
        ("reboot", libc::SYS_reboot),
        ("acct", libc::SYS_acct),
        ("settimeofday", libc::SYS_settimeofday),
        ("clock_settime", libc::SYS_clock_settime),
        ("clock_adjtime", libc::SYS_clock_adjtime),
        ("adjtimex", libc::SYS_adjtimex),
        ("sethostname", libc::SYS_sethostname),
        ("setdomainname", libc::SYS_setdomainname),
        ("userfaultfd", libc::SYS_userfaultfd),
        ("open_by_handle_at", libc::SYS_open_by_handle_at),
        ("keyctl", libc::SYS_keyctl),
        ("add_key", libc::SYS_add_key),
        ("request_key", libc::SYS_request_key),
        ("quotactl", libc::SYS_quotactl),
        ("mknodat", libc::SYS_mknodat),
        ("vhangup", libc::SYS_vhangup),
    ];
    calls.extend_from_slice(ARCH_ONLY);
    calls
}

/// What the checks saw, once it runs as its own uid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checks {
    /// What `ptrace` on itself answered (`EPERM`: the filter; anything else: it reached the
    /// kernel).
    pub ptrace: String,
    /// What opening `/proc/1/mem` for writing answered (never written: closed at once).
    pub proc_mem: String,
}

impl Checks {
    /// Whether both failed as they must.
    pub fn hold(&self) -> bool {
        self.ptrace == "EPERM" && self.proc_mem != "opened"
    }
}

/// Raises the seccomp filter on every thread: how many calls it denies, or why it is off.
pub fn raise() -> Result<usize, String> {
    seccomp()
}

/// Tries what the fence must stop (run once it is its own uid).
pub fn check() -> Checks {
    Checks {
        ptrace: check_ptrace(),
        proc_mem: check_proc_mem(),
    }
}

fn seccomp() -> Result<usize, String> {
    use seccompiler::{BpfProgram, SeccompAction, SeccompFilter, TargetArch};
    #[cfg(target_arch = "x86_64")]
    let arch = TargetArch::x86_64;
    #[cfg(target_arch = "aarch64")]
    let arch = TargetArch::aarch64;
    let calls = denied();
    let rules = calls.iter().map(|(_, nr)| (*nr, Vec::new())).collect();
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .map_err(|e| e.to_string())?;
    let program: BpfProgram = filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| e.to_string())?;
    seccompiler::apply_filter_all_threads(&program).map_err(|e| e.to_string())?;
    Ok(calls.len())
}

/// `ptrace(PTRACE_PEEKUSER)` of itself: the kernel answers ESRCH (it is not its own tracer); the
/// filter answers EPERM before the kernel looks.
fn check_ptrace() -> String {
    // SAFETY: PEEKUSER of offset 0 of the calling process, which is not traced by itself: the
    // call reads nothing and changes nothing.
    let rc = unsafe {
        libc::ptrace(
            libc::PTRACE_PEEKUSER,
            libc::getpid(),
            std::ptr::null_mut::<libc::c_void>(),
            std::ptr::null_mut::<libc::c_void>(),
        )
    };
    if rc == -1 {
        errno_name(std::io::Error::last_os_error())
    } else {
        "answered".into()
    }
}

/// Opens `/proc/1/mem` for writing (and closes it at once, never writing): it must fail.
fn check_proc_mem() -> String {
    match std::fs::OpenOptions::new().write(true).open("/proc/1/mem") {
        Ok(_) => "opened".into(),
        Err(e) => errno_name(e),
    }
}

fn errno_name(e: std::io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::EPERM) => "EPERM".into(),
        Some(libc::EACCES) => "EACCES".into(),
        Some(libc::ESRCH) => "ESRCH".into(),
        Some(n) => format!("errno {n}"),
        None => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_denied_calls_are_none_cudatrace_makes() {
        let names: Vec<&str> = super::denied().iter().map(|(n, _)| *n).collect();
        for needed in [
            "bpf",
            "perf_event_open",
            "setresuid",
            "capset",
            "openat2",
            "setgroups",
        ] {
            assert!(!names.contains(&needed), "{needed}");
        }
        for fenced in ["ptrace", "process_vm_writev", "pidfd_getfd"] {
            assert!(names.contains(&fenced), "{fenced}");
        }
    }
}
