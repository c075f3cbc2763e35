//! Checks, before anything is loaded, that this process may load BPF programs and open uprobes,
//! so that a missing privilege is reported as one line saying what to do.
use std::fs;

const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// Effective capability set of this process, from /proc/self/status.
fn effective() -> Option<u64> {
    let status = fs::read_to_string("/proc/self/status").ok()?;
    let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?.trim();
    u64::from_str_radix(hex, 16).ok()
}

/// Why tracing is not allowed, as a sentence that says what to do; `None` when it is.
pub fn missing_privilege() -> Option<String> {
    let caps = effective()?;
    let has = |cap: u32| caps & (1u64 << cap) != 0;
    if has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON)) {
        return None;
    }
    let mut missing = Vec::new();
    if !has(CAP_BPF) {
        missing.push("CAP_BPF");
    }
    if !has(CAP_PERFMON) {
        missing.push("CAP_PERFMON");
    }
    // SAFETY: geteuid has no preconditions.
    let who = if unsafe { libc::geteuid() } == 0 { "root without" } else { "not root and without" };
    Some(format!(
        "cudatrace needs root or CAP_BPF and CAP_PERFMON to load its probes, and runs as {who} {}: \
         run it with sudo, or grant the capabilities (securityContext.capabilities.add in Kubernetes)",
        missing.join(" and ")
    ))
}
