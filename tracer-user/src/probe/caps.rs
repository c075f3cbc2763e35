//! Checks, before anything is loaded, that this process may load BPF programs and open uprobes,
//! so that a missing privilege is reported as one line saying what to do.
use tracer_common::caps::{CAP_BPF, CAP_PERFMON, can_trace, effective_from_status, has};

/// Why tracing is not allowed, as a sentence that says what to do; `None` when it is.
pub fn missing_privilege() -> Option<String> {
    let caps = effective_from_status(&std::fs::read_to_string("/proc/self/status").ok()?)?;
    if can_trace(caps) {
        return None;
    }
    let mut missing = Vec::new();
    if !has(caps, CAP_BPF) {
        missing.push("CAP_BPF");
    }
    if !has(caps, CAP_PERFMON) {
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
