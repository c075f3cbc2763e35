//! Leaving uid 0. Once the capability check has passed and the operator's own libraries are
//! attached (those named with `--lib`, or the host's in the loader's directories), and before
//! anything a tenant controls is read (other processes' `/proc` and libraries, the pod list),
//! cudatrace started as root switches every thread to an unprivileged uid and gid (`run_as`,
//! 65534 by default; `--keep-uid` opts out): supplementary groups cleared, then the gid, then
//! the uid (real, effective, saved; the filesystem ids follow), keeping the permitted
//! capabilities across the switch (`PR_SET_KEEPCAPS`) but not `CAP_SETUID`, `CAP_SETGID` or
//! `CAP_SETPCAP`, so it can never come back. `caps::reduce` then narrows them to what tracing
//! still needs, as without the switch.
//!
//! What that uid can do: read what `CAP_DAC_READ_SEARCH` lets it read, look into other
//! processes as `CAP_SYS_PTRACE` lets it, load and attach probes (`CAP_BPF`, `CAP_PERFMON`).
//! What it cannot: own or write the host's root-owned files, whatever path reaches them
//! (`/proc/1/root/etc/...` included). Files it writes are opened before the switch.
use caps::{CapSet, Capability};
use thiserror::Error;

/// The uid and gid `run_as` defaults to: `nobody`.
pub const DEFAULT_RUN_AS: u32 = 65534;

/// The unprivileged ids to switch to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunAs {
    /// The uid (never 0).
    pub uid: u32,
    /// The gid.
    pub gid: u32,
}

impl Default for RunAs {
    fn default() -> RunAs {
        RunAs {
            uid: DEFAULT_RUN_AS,
            gid: DEFAULT_RUN_AS,
        }
    }
}

/// Why the switch failed; displays as the one line the user reads.
#[derive(Debug, Error)]
pub enum RunAsError {
    /// The switch needs CAP_SETUID and CAP_SETGID, which the process lacks.
    #[error(
        "cannot leave uid 0 for uid {uid}: it needs {missing}, which this process lacks: grant \
         them (securityContext.capabilities.add in Kubernetes; they are dropped once switched), \
         or pass --keep-uid"
    )]
    Missing {
        /// The uid it would switch to.
        uid: u32,
        /// The capabilities lacking.
        missing: String,
    },
    /// A system call refused.
    #[error("cannot leave uid 0 for uid {uid}: {call} failed ({why}); pass --keep-uid to stay")]
    Call {
        /// The uid it would switch to.
        uid: u32,
        /// Which call.
        call: &'static str,
        /// The error.
        why: std::io::Error,
    },
}

/// Capabilities that would let the process become root again: never kept.
const SWITCHING: [Capability; 3] = [
    Capability::CAP_SETUID,
    Capability::CAP_SETGID,
    Capability::CAP_SETPCAP,
];

/// Every capability tracing can use (`caps::reduce` narrows them further once attached): the
/// rest (`CAP_DAC_OVERRIDE`, `CAP_FOWNER`, `CAP_CHOWN`, ...) leave with uid 0.
const USEFUL: [Capability; 6] = [
    Capability::CAP_BPF,
    Capability::CAP_PERFMON,
    // Classic uprobes, on kernels without uprobe_multi.
    Capability::CAP_SYS_ADMIN,
    Capability::CAP_SYS_PTRACE,
    Capability::CAP_DAC_READ_SEARCH,
    // A deleted library's mapping, through /proc/PID/map_files.
    Capability::CAP_CHECKPOINT_RESTORE,
];

/// Whether this process runs with effective uid 0.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn check(ret: libc::c_int, uid: u32, call: &'static str) -> Result<(), RunAsError> {
    if ret == 0 {
        Ok(())
    } else {
        Err(RunAsError::Call {
            uid,
            call,
            why: std::io::Error::last_os_error(),
        })
    }
}

/// Switches every thread to `to` as the module says; `Ok(false)` when not root (nothing to do).
pub fn switch(to: RunAs) -> Result<bool, RunAsError> {
    if !is_root() || to.uid == 0 {
        return Ok(false);
    }
    let uid = to.uid;
    let effective = caps::read(None, CapSet::Effective).unwrap_or_default();
    let missing: Vec<String> = [Capability::CAP_SETUID, Capability::CAP_SETGID]
        .into_iter()
        .filter(|c| !effective.contains(c))
        .map(|c| c.to_string())
        .collect();
    if !missing.is_empty() {
        return Err(RunAsError::Missing {
            uid,
            missing: missing.join(" and "),
        });
    }
    // glibc applies each of these to every thread of the process.
    // SAFETY: setgroups with an empty list; setresgid/setresuid and prctl take plain integers.
    unsafe {
        check(libc::setgroups(0, std::ptr::null()), uid, "setgroups")?;
        check(libc::setresgid(to.gid, to.gid, to.gid), uid, "setresgid")?;
        check(
            libc::prctl(libc::PR_SET_KEEPCAPS, 1, 0, 0, 0),
            uid,
            "prctl(PR_SET_KEEPCAPS)",
        )?;
        check(libc::setresuid(uid, uid, uid), uid, "setresuid")?;
        check(
            libc::prctl(libc::PR_SET_KEEPCAPS, 0, 0, 0, 0),
            uid,
            "prctl(PR_SET_KEEPCAPS)",
        )?;
    }
    // The permitted set survived; the effective set was emptied by the switch.
    let capset = |why: caps::errors::CapsError| RunAsError::Call {
        uid,
        call: "capset",
        why: std::io::Error::other(why.to_string()),
    };
    let mut keep = caps::read(None, CapSet::Permitted).map_err(capset)?;
    keep.retain(|c| USEFUL.contains(c) && !SWITCHING.contains(c));
    caps::set(None, CapSet::Permitted, &keep).map_err(capset)?;
    caps::set(None, CapSet::Effective, &keep).map_err(capset)?;
    caps::clear(None, CapSet::Inheritable).map_err(capset)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use std::{io::Write as _, os::unix::fs::PermissionsExt as _};

    use super::*;

    /// In a child process (the switch is for the whole process), as root: switched to 65534
    /// with the discovery capabilities, a root-owned host file cannot be opened for writing,
    /// not even through a root process's `/proc/PID/root` (the parent's: pid 1's is closed even
    /// to root in some sandboxes, this one included), while it can still be read.
    #[test]
    fn once_switched_the_hosts_root_files_cannot_be_written() {
        if !is_root() {
            // Not root: nothing to switch (the privileged tests run as root).
            assert!(matches!(switch(RunAs::default()), Ok(false)));
            return;
        }
        let path = std::env::temp_dir().join(format!("cudatrace-run-as-{}", std::process::id()));
        std::fs::write(&path, "root's\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let through_root = format!("/proc/{}/root{}", std::process::id(), path.display());
        // SAFETY: fork; the child only switches, tries the opens and exits.
        let child = unsafe { libc::fork() };
        if child == 0 {
            let code = (|| {
                if !matches!(switch(RunAs::default()), Ok(true)) {
                    return 10;
                }
                // SAFETY: getuid/getgid have no preconditions.
                if unsafe { (libc::getuid(), libc::getgid()) } != (65534, 65534) {
                    return 11;
                }
                let effective = caps::read(None, CapSet::Effective).unwrap_or_default();
                if effective.iter().any(|c| !USEFUL.contains(c)) {
                    return 12;
                }
                for p in [path.to_str().unwrap(), through_root.as_str()] {
                    match std::fs::OpenOptions::new().append(true).open(p) {
                        Ok(mut f) => {
                            let _ = f.write_all(b"written\n");
                            return 13;
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {}
                        Err(_) => return 14,
                    }
                }
                // Reading is what it keeps (CAP_DAC_READ_SEARCH, when held).
                if effective.contains(&Capability::CAP_DAC_READ_SEARCH)
                    && std::fs::read_to_string(&through_root).is_err()
                {
                    return 15;
                }
                // SAFETY: setuid(0) must fail: nothing lets it come back.
                if unsafe { libc::setuid(0) } == 0 {
                    return 16;
                }
                0
            })();
            // SAFETY: _exit in the forked child.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waitpid on our own child.
        unsafe { libc::waitpid(child, &mut status, 0) };
        let contents = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        assert!(libc::WIFEXITED(status), "child status {status:#x}");
        assert_eq!(libc::WEXITSTATUS(status), 0, "child's check that failed");
        assert_eq!(contents, "root's\n", "nothing was written");
    }
}
