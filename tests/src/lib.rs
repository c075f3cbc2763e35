//! Helpers for the end-to-end tests: the environment `cargo xtask test` sets up ([`env`]), a
//! running `cudatrace` ([`Cudatrace`]), the stand-in workload with typed options ([`Workload`]),
//! guards that clean up after a failed test ([`guards`]), the real servers the tests talk to
//! ([`servers`]), plain HTTP ([`http`]) and the one exposition-format parser ([`exposition`]).
pub mod alerting;
pub mod breaker;
pub mod chart;
pub mod container;
pub mod cpucap;
mod cudatrace;
pub mod dashboard;
mod env;
pub mod exposition;
pub mod guards;
pub mod hostile;
pub mod http;
pub mod kube;
pub mod otlp;
pub mod servers;
pub mod sites;
pub mod tls;
mod workload;

use std::time::{Duration, Instant};

pub use cudatrace::{cudatrace_processes, wait_for_background_detach, Cudatrace, Traced};
pub use env::{device_file, env, Env};
pub use workload::{report, Running, Scenario, Workload};

/// Detection fast enough for a test (a `[detect]` table): 1 s windows, a baseline after 5,
/// pending after 2 breaching windows, firing after 3 s, resolved after 5 s without a breach.
pub const FAST_DETECTION: &str = "[detect]\nwindow_s = 1\nwarmup_windows = 5\npending_windows = 2\nfiring_after_s = 3\nresolve_after_s = 5\n";

/// Calls `f` every 100 ms until it returns something or `limit` passes.
pub fn poll<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if start.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A free TCP port on loopback.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A process's peak resident memory (VmHWM), KiB.
pub fn vm_hwm_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/PID/status")
}

/// User plus system CPU seconds a process has used, from /proc/PID/stat.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap()) / hz
}

/// What a tenant's 5-second loop (`python3 -c SCRIPT` under `timeout 5`) cost the daemon
/// `daemon_pid` listening on `listen`.
pub struct Flood {
    /// `timeout`'s exit code (124: the loop ran its 5 s).
    pub code: Option<i32>,
    /// The daemon's CPU seconds meanwhile.
    pub cpu: f64,
    /// Maps discovery read meanwhile.
    pub read: f64,
    /// How long a scrape right after took.
    pub scrape: std::time::Duration,
}

impl Flood {
    /// Prints what the loop cost as test `test`'s e2e line, and asserts that it ran its 5 s,
    /// cost the daemon under 0.5 s of CPU, and that a scrape after took under 1 s.
    pub fn print_and_check(&self, test: &str, what: &str) {
        eprintln!(
            "e2e {test}: 5 s of {what} (exit {:?}): daemon CPU {:.2} s, maps read {}, a scrape after in {:?}",
            self.code, self.cpu, self.read, self.scrape
        );
        assert_eq!(self.code, Some(124), "the loop ran its 5 s");
        assert!(self.cpu < 0.5, "{} s of CPU in 5 s", self.cpu);
        assert!(self.scrape < std::time::Duration::from_secs(1));
    }
}

/// Runs `script` in python3 for 5 s beside the daemon and measures what it cost ([`Flood`]).
pub fn flood(daemon_pid: u32, listen: &str, script: &str) -> Flood {
    let read = || {
        exposition::sum(
            &exposition::parse(&http::scrape(listen)),
            "cudatrace_discovery_maps_read_total",
            &[],
        )
    };
    let before = read();
    let cpu = cpu_seconds(daemon_pid);
    let status = std::process::Command::new("timeout")
        .args(["5", "python3", "-c", script])
        .status()
        .unwrap();
    let cpu = cpu_seconds(daemon_pid) - cpu;
    let t = std::time::Instant::now();
    let after = read();
    Flood {
        code: status.code(),
        cpu,
        read: after - before,
        scrape: t.elapsed(),
    }
}
