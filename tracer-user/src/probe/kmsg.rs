//! The kernel log's word on the uprobe single-step path, where `/dev/kmsg` is readable: the
//! "uprobe: COMM:PID failed to ..." warning (for instance "failed to execute the probed insn,
//! sending SIGILL") and a WARN from the uprobe code name a process the kernel itself says a
//! probe failed in. Only records of the kernel's own facility count (a process writing to
//! /dev/kmsg gets the user facility), so no tenant can open a breaker with a forged line.
use std::{
    fs::File,
    io::{ErrorKind, Read as _, Seek as _, SeekFrom},
    os::unix::fs::OpenOptionsExt as _,
};

/// Records read per poll at most (the log of a busy node cannot hold the loop).
const MAX_RECORDS: usize = 256;

/// A kernel-log record that names a process harmed in the uprobe path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelHarm {
    /// The process (thread group id where the line gives a task id, it is that task's).
    pub pid: u32,
    /// The message.
    pub message: String,
}

/// `/dev/kmsg`, read from its end, without blocking.
pub struct Kmsg(File);

impl Kmsg {
    /// Opens the kernel log at its end; `None` where it cannot be read (no CAP_SYSLOG, a
    /// container without /dev/kmsg): the breaker then goes by faults alone.
    pub fn open() -> Option<Kmsg> {
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open("/dev/kmsg")
            .ok()?;
        f.seek(SeekFrom::End(0)).ok()?;
        Some(Kmsg(f))
    }

    /// The harm records logged since the last poll.
    pub fn poll(&mut self) -> Vec<KernelHarm> {
        let mut out = Vec::new();
        let mut buf = [0u8; 8192];
        for _ in 0..MAX_RECORDS {
            match self.0.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    if let Some(h) = parse(&String::from_utf8_lossy(&buf[..n])) {
                        out.push(h);
                    }
                }
                // EPIPE: records were overwritten before being read; go on from the next.
                Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(_) => break,
            }
        }
        out
    }
}

/// One `/dev/kmsg` record (`PRIORITY,SEQ,TIME,FLAGS;MESSAGE`): a harm record of the kernel's
/// own facility, or `None`.
pub fn parse(record: &str) -> Option<KernelHarm> {
    let (head, message) = record.split_once(';')?;
    let message = message.lines().next()?.trim();
    let prio: u32 = head.split(',').next()?.parse().ok()?;
    if prio >> 3 != 0 {
        return None;
    }
    // "uprobe: python3:4242 failed to execute the probed insn, sending SIGILL."
    if let Some(rest) = message.strip_prefix("uprobe: ") {
        if !rest.contains(" failed to ") {
            return None;
        }
        // "%s:%d failed to %s": the comm is the tenant's and may hold " failed to " and ':'
        // itself, the kernel's message holds neither; so the pid is read from the right.
        let who = rest.rsplit_once(" failed to ")?.0;
        let pid = who.rsplit_once(':')?.1.parse().ok()?;
        return Some(KernelHarm {
            pid,
            message: message.to_owned(),
        });
    }
    // "WARNING: CPU: 3 PID: 4242 at arch/arm64/kernel/probes/uprobes.c:118 uprobe_single_step_handler+0x..."
    let warning = message.strip_prefix("WARNING: ")?;
    let in_uprobes = [
        "kernel/events/uprobes.c",
        "kernel/probes/uprobes.c",
        "x86/kernel/uprobes.c",
    ]
    .iter()
    .any(|f| warning.contains(f));
    if !in_uprobes {
        return None;
    }
    let pid = warning
        .split("PID: ")
        .nth(1)?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(KernelHarm {
        pid,
        message: message.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sigill_warning_of_the_single_step_path_names_its_process() {
        let r = "4,1893,81234567,-;uprobe: python3:4242 failed to execute the probed insn, sending SIGILL.";
        assert_eq!(parse(r).map(|h| h.pid), Some(4242));
        // A comm with a colon in it.
        let r = "4,1894,81234568,-;uprobe: vllm:worker:77 failed to execute the probed insn, sending SIGILL.";
        assert_eq!(parse(r).map(|h| h.pid), Some(77));
        // A comm made to look like the start of the line (15 bytes: "xx:1 failed to ").
        let r = "4,1895,81234569,-;uprobe: xx:1 failed to :4242 failed to execute the probed insn, sending SIGILL.";
        assert_eq!(parse(r).map(|h| h.pid), Some(4242));
        let r =
            "4,1896,81234570,-;uprobe: a failed to x:9 failed to handle uprobe, sending SIGILL.";
        assert_eq!(parse(r).map(|h| h.pid), Some(9));
    }

    #[test]
    fn a_warn_in_the_uprobe_code_names_its_process() {
        let r = "4,2000,91234567,-;WARNING: CPU: 3 PID: 5151 at arch/arm64/kernel/probes/uprobes.c:118 uprobe_single_step_handler+0x50/0x68";
        assert_eq!(parse(r).map(|h| h.pid), Some(5151));
        let r = "4,2001,91234568,-;WARNING: CPU: 0 PID: 6161 at kernel/events/uprobes.c:2380 handle_singlestep+0x1c/0x60";
        assert_eq!(parse(r).map(|h| h.pid), Some(6161));
    }

    #[test]
    fn other_lines_and_forged_user_lines_are_not_harm() {
        // Another subsystem's WARN, an unrelated uprobe line, and the same text from a process
        // writing to /dev/kmsg (user facility: priority 12 = LOG_USER | warning).
        let other =
            "4,2002,91234569,-;WARNING: CPU: 0 PID: 1 at mm/page_alloc.c:4000 __alloc_pages+0x1";
        assert_eq!(parse(other), None);
        assert_eq!(parse("6,2003,1,-;uprobe: register_for_each_vma: ok"), None);
        let forged = "12,2004,91234570,-;uprobe: python3:4242 failed to execute the probed insn, sending SIGILL.";
        assert_eq!(parse(forged), None);
        assert_eq!(parse("garbage"), None);
    }
}
