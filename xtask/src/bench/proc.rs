//! What the bench reads of a process in /proc: its CPU time and its wake-ups, every thread's
//! added up.
use anyhow::Result;

/// CPU seconds of a process so far, every thread's time on a CPU added up (the scheduler's
/// nanoseconds, /proc/PID/task/*/schedstat: /proc/PID/stat's clock ticks are 10 ms each, too
/// coarse for an idle daemon).
pub(super) fn cpu_seconds(pid: u32) -> Result<f64> {
    Ok(threads_sum(pid, "schedstat", |s| {
        s.split_whitespace().next()?.parse().ok()
    })? as f64
        / 1e9)
}

/// Context switches of every thread of a process so far (each wake-up of a sleeping thread
/// is one).
pub(super) fn switches(pid: u32) -> Result<u64> {
    threads_sum(pid, "status", |s| {
        Some(
            s.lines()
                .filter(|l| l.contains("voluntary_ctxt_switches"))
                .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .sum(),
        )
    })
}

/// `read` of /proc/PID/task/TID/`file`, added up over the threads.
fn threads_sum(pid: u32, file: &str, read: impl Fn(&str) -> Option<u64>) -> Result<u64> {
    let mut sum = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))?.flatten() {
        // A thread that ended meanwhile counts for nothing.
        if let Ok(text) = std::fs::read_to_string(task.path().join(file)) {
            sum += read(&text).unwrap_or(0);
        }
    }
    Ok(sum)
}
