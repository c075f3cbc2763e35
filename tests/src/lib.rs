//! Helpers for the end-to-end tests: find the binaries `cargo xtask test` built, start and stop
//! `cudatrace` as a user would, run the stand-in workload, and parse what both printed.
use std::{
    collections::HashMap,
    io::{BufRead, BufReader},
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex, mpsc},
    thread::JoinHandle,
    time::{Duration, Instant},
};

use serde_json::Value;

/// Paths of what the tests run.
pub struct Env {
    /// The cudatrace binary.
    pub bin: PathBuf,
    /// Folder with libcuda.so.1, libpartial.so and cuda-workload.
    pub standin: PathBuf,
}

impl Env {
    /// The stand-in libcuda.
    pub fn libcuda(&self) -> PathBuf {
        self.standin.join("libcuda.so.1")
    }
}

fn has_bpf_privileges() -> Result<(), String> {
    let status = std::fs::read_to_string("/proc/self/status").map_err(|e| e.to_string())?;
    let caps = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|h| u64::from_str_radix(h.trim(), 16).ok())
        .ok_or("no CapEff in /proc/self/status")?;
    let has = |c: u32| caps & (1 << c) != 0;
    if has(21) || (has(38) && has(39)) { Ok(()) } else { Err(format!("capabilities {caps:#x} lack CAP_BPF/CAP_PERFMON")) }
}

/// The test environment, or `None` (after saying why) when BPF is not available outside CI.
/// Under `CI=true` a missing privilege fails the test: CI runs as root and must run these.
pub fn env() -> Option<Env> {
    let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
    if let Err(why) = has_bpf_privileges() {
        if ci {
            panic!("CI=true but BPF is not available to the tests: {why}");
        }
        eprintln!("SKIPPED: privileged end-to-end test needs root or CAP_BPF+CAP_PERFMON ({why})");
        return None;
    }
    let var = |name: &str| {
        std::env::var_os(name)
            .map(PathBuf::from)
            .unwrap_or_else(|| panic!("{name} is not set: run the end-to-end tests with `cargo xtask test`"))
    };
    Some(Env { bin: var("CUDATRACE_BIN"), standin: var("CUDATRACE_STANDIN_DIR") })
}

/// A running `cudatrace trace` (or `run`); a tracer dropped without `stop` (a failed assertion)
/// is stopped, so that it cannot disturb the tests after it.
pub struct Tracer {
    child: Option<Child>,
    stdout: Option<JoinHandle<Vec<String>>>,
    stderr: Arc<Mutex<Vec<String>>>,
    stderr_done: Option<JoinHandle<()>>,
}

impl Drop for Tracer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: plain kill(2).
            unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
            let _ = child.wait();
            wait_for_background_detach();
        }
    }
}

/// What a stopped tracer printed.
pub struct Traced {
    /// Parsed JSON events from stdout.
    pub events: Vec<Value>,
    /// Stderr lines.
    pub stderr: Vec<String>,
    /// Exit status code.
    pub code: Option<i32>,
}

impl Traced {
    /// Events of one process.
    pub fn of_pid(&self, pid: u64) -> Vec<&Value> {
        self.events.iter().filter(|e| e["pid"].as_u64() == Some(pid)).collect()
    }

    /// `key=value` fields of the `summary:` line.
    pub fn summary(&self) -> HashMap<String, u64> {
        let line = self.stderr.iter().find(|l| l.starts_with("summary:")).expect("no summary line");
        line.split_whitespace()
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.parse().expect("numeric summary field")))
            .collect()
    }
}

impl Tracer {
    /// The stderr lines printed so far.
    pub fn stderr_now(&self) -> Vec<String> {
        self.stderr.lock().unwrap().clone()
    }

    /// Waits (up to `limit`) for a stderr line for which `pred` holds; returns it.
    pub fn wait_stderr(&self, limit: Duration, pred: impl Fn(&str) -> bool) -> Option<String> {
        poll(limit, || self.stderr_now().into_iter().find(|l| pred(l)))
    }

    /// Starts `cudatrace trace ARGS` and waits for its `ready:` line (panics after 60 s).
    pub fn start(env: &Env, args: &[&str]) -> Tracer {
        Self::try_start(env, args).unwrap_or_else(|t| {
            panic!("cudatrace did not become ready; stderr:\n{}", t.stderr.join("\n"))
        })
    }

    /// Starts the tracer; on failure to become ready, returns what it printed.
    pub fn try_start(env: &Env, args: &[&str]) -> Result<Tracer, Traced> {
        Self::try_start_command(env, "trace", args, &[])
    }

    /// Starts `cudatrace run ARGS` with extra environment and waits for its `ready:` line.
    pub fn start_daemon(env: &Env, args: &[&str], vars: &[(&str, &str)]) -> Tracer {
        Self::try_start_command(env, "run", args, vars).unwrap_or_else(|t| {
            panic!("cudatrace run did not become ready; stderr:\n{}", t.stderr.join("\n"))
        })
    }

    /// Starts `cudatrace run` on the stand-in libcuda with metrics on a free loopback port, plus
    /// `extra` arguments and `vars`; returns it and its listen address.
    pub fn start_daemon_on_loopback(env: &Env, extra: &[&str], vars: &[(&str, &str)]) -> (Tracer, String) {
        let listen = format!("127.0.0.1:{}", free_port());
        let lib = env.libcuda();
        let mut args = vec!["--lib", lib.to_str().unwrap(), "--listen", &listen];
        args.extend_from_slice(extra);
        let daemon = Self::start_daemon(env, &args, vars);
        (daemon, listen)
    }

    /// Starts `cudatrace COMMAND ARGS`; on failure to become ready, returns what it printed.
    pub fn try_start_command(env: &Env, command: &str, args: &[&str], vars: &[(&str, &str)]) -> Result<Tracer, Traced> {
        let mut child = Command::new(&env.bin)
            .arg(command)
            .args(args)
            .envs(vars.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("cannot start cudatrace");
        let out = child.stdout.take().unwrap();
        let stdout = std::thread::spawn(move || BufReader::new(out).lines().map_while(Result::ok).collect());
        let err = child.stderr.take().unwrap();
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let (ready_tx, ready_rx) = mpsc::channel();
        let lines = stderr.clone();
        let stderr_done = std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                if line.starts_with("ready:") {
                    let _ = ready_tx.send(());
                }
                lines.lock().unwrap().push(line);
            }
        });
        let tracer = Tracer { child: Some(child), stdout: Some(stdout), stderr, stderr_done: Some(stderr_done) };
        match ready_rx.recv_timeout(Duration::from_secs(60)) {
            Ok(()) => Ok(tracer),
            Err(_) => Err(tracer.wait()),
        }
    }

    /// Kills the tracer with SIGKILL, as an OOM killer or `kubectl delete --force` would.
    pub fn kill(self) -> Traced {
        // SAFETY: plain kill(2).
        unsafe { libc::kill(self.child.as_ref().expect("running").id() as i32, libc::SIGKILL) };
        self.wait()
    }

    /// Stops the tracer with SIGINT and collects its output.
    pub fn stop(self) -> Traced {
        // SAFETY: plain kill(2).
        unsafe { libc::kill(self.child.as_ref().expect("running").id() as i32, libc::SIGINT) };
        self.wait()
    }

    /// Waits for the tracer to exit on its own (panics after 60 s).
    pub fn wait(mut self) -> Traced {
        let mut child = self.child.take().expect("running");
        let start = Instant::now();
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if start.elapsed() > Duration::from_secs(60) {
                let _ = child.kill();
                panic!("cudatrace did not exit within 60 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        wait_for_background_detach();
        let lines = self.stdout.take().expect("joined once").join().unwrap();
        self.stderr_done.take().expect("joined once").join().unwrap();
        let events = lines
            .iter()
            .filter(|l| l.starts_with('{'))
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON line {l}: {e}")))
            .collect();
        let stderr = std::mem::take(&mut *self.stderr.lock().unwrap());
        Traced { events, stderr, code: status.code() }
    }
}

/// Waits until no `cudatrace` process is left. A stopped tracer hands the removal of its probes
/// to a forked child, which takes seconds and holds the kernel's probe mutex meanwhile; the next
/// test's attach would wait on it while its workload already runs.
fn wait_for_background_detach() {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(120) {
        let running = std::fs::read_dir("/proc").unwrap().flatten().any(|p| {
            std::fs::read_to_string(p.path().join("comm")).is_ok_and(|c| c.trim_end() == "cudatrace")
                && std::fs::read_to_string(p.path().join("stat")).is_ok_and(|s| !s.contains(") Z "))
        });
        if !running {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("a cudatrace process was still detaching after 120 s");
}

/// Runs the workload to completion and returns its JSON report.
pub fn workload(env: &Env, vars: &[(&str, &str)], args: &[&str]) -> Value {
    let out = Command::new(env.standin.join("cuda-workload"))
        .arg("--lib")
        .arg(env.libcuda())
        .args(args)
        .envs(vars.iter().copied())
        .output()
        .expect("cannot run cuda-workload");
    assert!(out.status.success(), "workload failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    serde_json::from_str(text.lines().last().expect("workload printed nothing")).expect("workload JSON")
}

/// Starts the workload without waiting for it.
pub fn spawn_workload(env: &Env, vars: &[(&str, &str)], args: &[&str]) -> Child {
    spawn_workload_as(env, "cuda-workload", vars, args)
}

/// Starts the workload under another name (its comm), through a symlink, without waiting for it.
pub fn spawn_workload_as(env: &Env, comm: &str, vars: &[(&str, &str)], args: &[&str]) -> Child {
    let exe = if comm == "cuda-workload" {
        env.standin.join("cuda-workload")
    } else {
        let dir = std::env::temp_dir().join(format!("cudatrace-names-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let link = dir.join(comm);
        if !link.exists() {
            std::os::unix::fs::symlink(env.standin.join("cuda-workload"), &link).unwrap();
        }
        link
    };
    Command::new(exe)
        .arg("--lib")
        .arg(env.libcuda())
        .args(args)
        .envs(vars.iter().copied())
        .stdout(Stdio::piped())
        .spawn()
        .expect("cannot run cuda-workload")
}

/// Waits for a spawned workload and returns its JSON report.
pub fn finish_workload(child: Child) -> Value {
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "workload failed");
    let text = String::from_utf8(out.stdout).unwrap();
    serde_json::from_str(text.lines().last().expect("workload printed nothing")).expect("workload JSON")
}

/// A unique shared-device file, so that each test has its own simulated GPU.
pub fn device_file(name: &str) -> String {
    let path = format!("/dev/shm/cudatrace-test-{}-{name}", std::process::id());
    let _ = std::fs::remove_file(&path);
    path
}

/// GET a URL with curl; returns the body.
pub fn http_get(url: &str, accept: Option<&str>) -> String {
    let mut cmd = Command::new("curl");
    cmd.args(["-sf", "--max-time", "10", url]);
    if let Some(a) = accept {
        cmd.args(["-H", &format!("Accept: {a}")]);
    }
    let out = cmd.output().expect("curl is needed (scripts/setup.sh installs it)");
    assert!(out.status.success(), "GET {url} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// A free TCP port on loopback.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A webhook receiver on loopback: answers 200 to every POST and keeps the JSON bodies.
pub struct Webhook {
    /// Its port.
    pub port: u16,
    bodies: Arc<Mutex<Vec<Value>>>,
}

impl Webhook {
    /// Starts listening.
    pub fn start() -> Webhook {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let keep = bodies.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().map_while(Result::ok) {
                let keep = keep.clone();
                std::thread::spawn(move || serve_http(stream, &keep));
            }
        });
        Webhook { port, bodies }
    }

    /// The bodies received so far.
    pub fn received(&self) -> Vec<Value> {
        self.bodies.lock().unwrap().clone()
    }

    /// Waits (up to `limit`) for a body for which `pred` holds.
    pub fn wait_for(&self, limit: Duration, pred: impl Fn(&Value) -> bool) -> Option<Value> {
        poll(limit, || self.received().into_iter().find(|v| pred(v)))
    }
}

/// HTTP/1.1 requests on one connection (keep-alive), each body parsed as JSON.
fn serve_http(stream: std::net::TcpStream, bodies: &Mutex<Vec<Value>>) {
    use std::io::{Read as _, Write as _};
    let mut writer = stream.try_clone().unwrap();
    let mut reader = BufReader::new(stream);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut length = 0usize;
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).unwrap_or(0) == 0 {
                return;
            }
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((k, v)) = header.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    length = v.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let value = serde_json::from_slice(&body).unwrap_or_else(|e| panic!("webhook body is not JSON ({e}): {}", String::from_utf8_lossy(&body)));
        bodies.lock().unwrap().push(value);
        if writer.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").is_err() {
            return;
        }
    }
}

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

/// A server program (Prometheus, Alertmanager) on a free loopback port, with its own temporary
/// folder holding its config file; killed and cleaned up when dropped.
pub struct Server {
    child: Child,
    /// Its port.
    pub port: u16,
    dir: PathBuf,
}

impl Server {
    /// Writes `config` to `config_name` in a new folder and starts `program` with
    /// `args(config path, folder, port)`; `package` names what to install when it is missing.
    pub fn start(
        program: &str,
        package: &str,
        config_name: &str,
        config: &str,
        args: impl Fn(&std::path::Path, &std::path::Path, u16) -> Vec<String>,
    ) -> Server {
        let dir = std::env::temp_dir().join(format!("cudatrace-{program}-{}-{}", std::process::id(), free_port()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(config_name);
        std::fs::write(&path, config).unwrap();
        let port = free_port();
        let child = Command::new(program)
            .args(args(&path, &dir, port))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {program} ({e}): the Debian package {package} is needed; scripts/setup.sh installs it"));
        Server { child, port, dir }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
