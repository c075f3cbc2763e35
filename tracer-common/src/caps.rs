//! Linux capabilities cudatrace needs, and the one parser of `CapEff` from /proc/PID/status
//! (the binary's start check and the tests' privilege check both use it).

/// `CAP_SYS_ADMIN`.
pub const CAP_SYS_ADMIN: u32 = 21;
/// `CAP_PERFMON`.
pub const CAP_PERFMON: u32 = 38;
/// `CAP_BPF`.
pub const CAP_BPF: u32 = 39;

/// The effective capability set from the text of /proc/PID/status.
pub fn effective_from_status(status: &str) -> Option<u64> {
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))?
        .trim();
    u64::from_str_radix(hex, 16).ok()
}

/// Whether `caps` holds capability `cap`.
pub const fn has(caps: u64, cap: u32) -> bool {
    cap < 64 && caps & (1u64 << cap) != 0
}

/// Whether `caps` may load the probes: CAP_SYS_ADMIN, or CAP_BPF with CAP_PERFMON.
pub const fn can_trace(caps: u64) -> bool {
    has(caps, CAP_SYS_ADMIN) || (has(caps, CAP_BPF) && has(caps, CAP_PERFMON))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cap_eff() {
        let status = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t000000c000000000\n";
        let caps = effective_from_status(status).unwrap();
        assert!(has(caps, CAP_BPF) && has(caps, CAP_PERFMON) && !has(caps, CAP_SYS_ADMIN));
        assert!(can_trace(caps) && !can_trace(1 << CAP_BPF) && can_trace(1 << CAP_SYS_ADMIN));
        assert_eq!(effective_from_status("Name:\tx\n"), None);
    }
}
