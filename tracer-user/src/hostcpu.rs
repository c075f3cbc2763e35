//! The host's CPU, as the causal verdicts need it: how long a traced process's threads waited
//! for a CPU (run-queue delay, the second field of `/proc/PID/task/TID/schedstat`), and how
//! much CPU each cgroup used (`cpu.stat`'s `usage_usec`, and `nr_throttled` for a quota's
//! throttling). Read once a detection window; every read is bounded (threads per process,
//! cgroups, depth), so a tenant's thousand threads or cgroups cost a bounded pass.
use std::{fs, path::Path, path::PathBuf};

/// Where the cgroup v2 hierarchy is mounted: `/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` on
/// a hybrid host (the host's own, for the DaemonSet: see docs/deploy.md).
pub fn cgroup_root() -> PathBuf {
    ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.join("cgroup.procs").exists())
        .unwrap_or_else(|| PathBuf::from("/sys/fs/cgroup"))
}
/// Threads read per process at most.
pub const MAX_THREADS: usize = 512;
/// Cgroups read per pass at most.
pub const MAX_CGROUPS: usize = 2048;
/// How deep below the cgroup root the pass looks.
const MAX_DEPTH: usize = 8;

/// The run-queue delay of every thread of `pid` (at most [`MAX_THREADS`]) added up, ns; `None`
/// when the process or its schedstat cannot be read (a kernel without `CONFIG_SCHEDSTATS`).
pub fn run_delay_ns(pid: u32) -> Option<u64> {
    let dir = fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut total = 0u64;
    let mut read = false;
    for entry in dir.flatten().take(MAX_THREADS) {
        let Ok(text) = fs::read_to_string(entry.path().join("schedstat")) else {
            continue;
        };
        if let Some(d) = parse_schedstat(&text) {
            total = total.saturating_add(d);
            read = true;
        }
    }
    read.then_some(total)
}

/// The run-queue delay (second field) of one schedstat line.
pub fn parse_schedstat(text: &str) -> Option<u64> {
    text.split_whitespace().nth(1)?.parse().ok()
}

/// One cgroup's CPU counters.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CgroupCpu {
    /// Its path below the cgroup root, `/`-separated and starting with `/`.
    pub path: String,
    /// CPU time used, microseconds, ever.
    pub usage_usec: u64,
    /// Periods its quota throttled it, ever.
    pub nr_throttled: u64,
    /// Microseconds some of its tasks waited for a CPU, ever (`cpu.pressure`, PSI), when the
    /// kernel keeps it: the run-queue delay of the cgroup where a thread's own is not kept.
    pub pressure_usec: Option<u64>,
    /// A process in it (its first), to name it by.
    pub pid: Option<u32>,
}

/// `usage_usec` and `nr_throttled` of a `cpu.stat`.
pub fn parse_cpu_stat(text: &str) -> (u64, u64) {
    let mut out = (0, 0);
    for line in text.lines() {
        let mut it = line.split_whitespace();
        match (it.next(), it.next().and_then(|v| v.parse().ok())) {
            (Some("usage_usec"), Some(v)) => out.0 = v,
            (Some("nr_throttled"), Some(v)) => out.1 = v,
            _ => {}
        }
    }
    out
}

/// The `some` line's `total=` of a `cpu.pressure`, microseconds.
pub fn parse_pressure(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("some "))?;
    line.split_whitespace()
        .find_map(|f| f.strip_prefix("total="))?
        .parse()
        .ok()
}

/// Every cgroup below `root` that holds processes, with its CPU counters: at most
/// [`MAX_CGROUPS`], depth first, [`MAX_DEPTH`] levels down. Cgroup v1 hosts give none.
pub fn cgroups(root: &Path) -> Vec<CgroupCpu> {
    let mut out = Vec::new();
    let mut stack: Vec<(PathBuf, usize)> = vec![(root.to_path_buf(), 0)];
    let mut visited = 0usize;
    while let Some((dir, depth)) = stack.pop() {
        visited += 1;
        if visited > MAX_CGROUPS * 4 || out.len() >= MAX_CGROUPS {
            break;
        }
        let pid = fs::read_to_string(dir.join("cgroup.procs"))
            .ok()
            .and_then(|t| t.lines().next().and_then(|l| l.trim().parse().ok()));
        if pid.is_some() {
            if let Ok(stat) = fs::read_to_string(dir.join("cpu.stat")) {
                let (usage_usec, nr_throttled) = parse_cpu_stat(&stat);
                let rel = dir.strip_prefix(root).unwrap_or(&dir);
                let pressure_usec = fs::read_to_string(dir.join("cpu.pressure"))
                    .ok()
                    .and_then(|t| parse_pressure(&t));
                out.push(CgroupCpu {
                    path: format!("/{}", rel.to_string_lossy()),
                    usage_usec,
                    nr_throttled,
                    pressure_usec,
                    pid,
                });
            }
        }
        if depth >= MAX_DEPTH {
            continue;
        }
        let Ok(children) = fs::read_dir(&dir) else {
            continue;
        };
        for c in children.flatten() {
            if c.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push((c.path(), depth + 1));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_schedstat_and_cpu_stat() {
        assert_eq!(parse_schedstat("123 456 7\n"), Some(456));
        assert_eq!(parse_schedstat("123"), None);
        assert_eq!(
            parse_cpu_stat("usage_usec 9000\nuser_usec 1\nnr_periods 4\nnr_throttled 3\n"),
            (9000, 3)
        );
        assert_eq!(parse_cpu_stat("garbage\nusage_usec x\n"), (0, 0));
        assert_eq!(
            parse_pressure("some avg10=0.09 avg60=0.54 avg300=1.34 total=20554295\nfull total=0\n"),
            Some(20_554_295)
        );
        assert_eq!(parse_pressure("full total=3\n"), None);
    }

    #[test]
    fn this_process_has_a_run_delay_and_the_walk_is_bounded() {
        // Linux with schedstats: our own threads' delays add up (0 or more).
        if Path::new("/proc/self/schedstat").exists() {
            assert!(run_delay_ns(std::process::id()).is_some());
        }
        let dir = std::env::temp_dir().join(format!("cudatrace-cg-{}", std::process::id()));
        let mut d = dir.clone();
        for i in 0..20 {
            d = d.join(format!("l{i}"));
            fs::create_dir_all(&d).unwrap();
            fs::write(d.join("cgroup.procs"), format!("{}\n", 100 + i)).unwrap();
            fs::write(d.join("cpu.stat"), format!("usage_usec {i}\n")).unwrap();
        }
        let got = cgroups(&dir);
        // The root holds no processes; levels 1 to 8 are read, deeper ones are not.
        assert_eq!(got.len(), MAX_DEPTH);
        assert_eq!((got[0].path.as_str(), got[0].pid), ("/l0", Some(100)));
        fs::remove_dir_all(&dir).unwrap();
    }
}
