//! What the actuator's tests need: a cgroup with the `cpu` controller (v2 where the unified
//! hierarchy has it, else v1's `cpu`), its cap read back as `cpu.max` writes it, the actuator
//! started on a socket in a temporary folder, and a client that speaks its protocol.
use std::{
    fs,
    io::{BufRead as _, BufReader, Write as _},
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
};

use serde_json::Value;

use crate::{guards::TempDir, Cudatrace, Env};

/// A cgroup with the cpu controller made for a test, removed on drop (its processes first
/// moved to the parent).
pub struct CpuCgroup {
    dir: PathBuf,
    v1: bool,
}

impl CpuCgroup {
    /// Creates `cudatrace-test-PID-NAME` at the top of the cpu hierarchy.
    pub fn new(name: &str) -> CpuCgroup {
        let v2 = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
            .into_iter()
            .map(PathBuf::from)
            .find(|p| {
                fs::read_to_string(p.join("cgroup.controllers"))
                    .is_ok_and(|c| c.split_whitespace().any(|c| c == "cpu"))
            });
        let (root, v1) = match v2 {
            Some(r) => {
                let _ = fs::write(r.join("cgroup.subtree_control"), "+cpu");
                (r, false)
            }
            None => (
                ["/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"]
                    .into_iter()
                    .map(PathBuf::from)
                    .find(|p| p.join("cpu.cfs_quota_us").exists())
                    .expect("no cgroup hierarchy with the cpu controller on this host"),
                true,
            ),
        };
        let dir = root.join(format!("cudatrace-test-{}-{name}", std::process::id()));
        fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        CpuCgroup { dir, v1 }
    }

    /// Its directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Its cap as `cpu.max` says it: `QUOTA PERIOD`, or `max PERIOD` when none.
    pub fn cap(&self) -> String {
        let read = |f: &str| {
            fs::read_to_string(self.dir.join(f))
                .unwrap()
                .trim()
                .to_owned()
        };
        if self.v1 {
            let q = read("cpu.cfs_quota_us");
            let q = if q == "-1" { "max".into() } else { q };
            format!("{q} {}", read("cpu.cfs_period_us"))
        } else {
            read("cpu.max")
        }
    }
}

impl Drop for CpuCgroup {
    fn drop(&mut self) {
        let procs = fs::read_to_string(self.dir.join("cgroup.procs")).unwrap_or_default();
        let parent = self.dir.parent().unwrap().join("cgroup.procs");
        for p in procs.lines() {
            let _ = fs::write(&parent, p);
        }
        let _ = fs::remove_dir(&self.dir);
    }
}

/// `cudatrace actuator` on a socket and journal in `dir`, ready; it serves this test's own
/// executable too when `serve_the_test` (the protocol tests speak to it themselves).
pub fn start_actuator(env: &Env, dir: &TempDir, serve_the_test: bool) -> Cudatrace {
    let sock = dir.join("actuator.sock");
    let journal = dir.join("actuator.json");
    let me = std::env::current_exe().unwrap();
    let mut args = vec![
        "--socket",
        sock.to_str().unwrap(),
        "--journal",
        journal.to_str().unwrap(),
    ];
    if serve_the_test {
        // This test's own process runs as root: served only when asked.
        args.extend(["--allow-exe", me.to_str().unwrap(), "--allow-uid", "0"]);
    }
    Cudatrace::try_start_command(env, "actuator", &args, &[])
        .unwrap_or_else(|t| panic!("the actuator did not start: {:?}", t.stderr))
}

/// A connection to the actuator: one request line, one reply.
pub struct ActuatorClient(BufReader<UnixStream>, UnixStream);

impl ActuatorClient {
    /// Connects to the socket in `dir`.
    pub fn connect(dir: &TempDir) -> ActuatorClient {
        let s = UnixStream::connect(dir.join("actuator.sock")).expect("the actuator's socket");
        ActuatorClient(BufReader::new(s.try_clone().unwrap()), s)
    }

    /// Sends `request`, returns the reply.
    pub fn ask(&mut self, request: &Value) -> Value {
        writeln!(self.1, "{request}").unwrap();
        let mut line = String::new();
        self.0.read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
    }
}
