//! The process a cap is for, held by a pidfd and checked by its start time: a pid the verdict
//! named, reused since by another process (whatever it calls itself), is refused, and so is one
//! that ends while its cgroup is read.
use std::os::fd::{FromRawFd as _, OwnedFd};

/// A pidfd of a process whose start time was checked.
#[derive(Debug)]
pub struct Pidfd {
    fd: OwnedFd,
    pid: u32,
}

impl Pidfd {
    /// Opens a pidfd of `pid`, then checks that the process started at `start_time` (clock
    /// ticks since boot, `/proc/PID/stat` field 22); the refusal in words otherwise.
    pub fn open(pid: u32, start_time: u64) -> Result<Pidfd, String> {
        if start_time == 0 {
            return Err(format!(
                "give pid {pid}'s start time (/proc/PID/stat field 22): without it a reused pid cannot be told"
            ));
        }
        // SAFETY: pidfd_open(2) takes a pid and flags and returns a new descriptor or -1.
        let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        if raw < 0 {
            return Err(format!(
                "pid {pid}: {}: it ended",
                std::io::Error::last_os_error()
            ));
        }
        // SAFETY: a descriptor pidfd_open just returned, owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw as i32) };
        let now = crate::identity::start_time(pid);
        if now != Some(start_time) {
            return Err(format!(
                "pid {pid} is not the process the verdict named (started at {}, not {start_time}): it ended and its pid was reused",
                now.map_or("unknown".to_owned(), |t| t.to_string())
            ));
        }
        Ok(Pidfd { fd, pid })
    }

    /// Whether the process is still there (the pidfd's, not merely its pid's).
    pub fn still_there(&self) -> Result<(), String> {
        use std::os::fd::AsRawFd as _;
        // SAFETY: pidfd_send_signal(2) with signal 0 checks only; the descriptor is ours.
        let r = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.fd.as_raw_fd(),
                0,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        if r == 0 {
            Ok(())
        } else {
            Err(format!(
                "pid {} ended while its cgroup was read: nothing capped",
                self.pid
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_is_held_by_its_pidfd_and_its_start_time() {
        let me = std::process::id();
        let start = crate::identity::start_time(me).unwrap();
        let fd = Pidfd::open(me, start).unwrap();
        assert!(fd.still_there().is_ok());
        assert!(Pidfd::open(me, start + 1)
            .unwrap_err()
            .contains("its pid was reused"));
        assert!(Pidfd::open(me, 0).unwrap_err().contains("start time"));
        // A child that has exited and been reaped: its pidfd cannot be opened.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        let child_start = crate::identity::start_time(pid);
        child.wait().unwrap();
        assert!(Pidfd::open(pid, child_start.unwrap_or(1)).is_err());
    }

    #[test]
    fn a_process_that_ends_after_its_pidfd_is_opened_is_not_there() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        let start = crate::identity::start_time(pid).unwrap();
        let fd = Pidfd::open(pid, start).unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(fd.still_there().unwrap_err().contains("ended"));
    }
}
