//! A running `cudatrace`, started as a user would, and what it printed once stopped.
use std::{
    collections::HashMap,
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
    sync::{mpsc, Arc, Mutex},
    thread::JoinHandle,
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::{env::Env, free_port, poll};

/// A running `cudatrace trace` (or `run`); one dropped without `stop` (a failed assertion) is
/// stopped, so that it cannot disturb the tests after it.
pub struct Cudatrace {
    child: Option<Child>,
    stdout: Option<JoinHandle<Vec<String>>>,
    stderr: Arc<Mutex<Vec<String>>>,
    log: Arc<Mutex<Vec<Value>>>,
    stderr_done: Option<JoinHandle<()>>,
}

/// The environment variable that makes cudatrace write its stderr lines as JSON (its
/// `--log-format json`); the harness sets it on every cudatrace it starts, and reads the lines
/// as typed events.
pub const LOG_FORMAT_VAR: &str = "CUDATRACE_LOG_FORMAT";

/// One stderr line: a JSON log record (its `msg` and the record) or, from a cudatrace that did
/// not get the variable (inside a container), the text line alone.
fn parse_log_line(line: String) -> (String, Option<Value>) {
    match serde_json::from_str::<Value>(&line) {
        Ok(v) if v.get("msg").is_some_and(Value::is_string) && v.get("ts").is_some() => {
            (v["msg"].as_str().unwrap_or_default().to_owned(), Some(v))
        }
        _ => (line, None),
    }
}

/// Whether a stderr line (or its record) says the tracer is ready.
fn is_ready(text: &str, record: Option<&Value>) -> bool {
    match record {
        Some(r) => r["event"] == "ready",
        None => text.starts_with("ready:"),
    }
}

impl Drop for Cudatrace {
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
    /// Stdout, as lines.
    pub stdout: Vec<String>,
    /// Stderr lines (the `msg` of each JSON record, as a person would read them).
    pub stderr: Vec<String>,
    /// Stderr's JSON records, typed: `event`, `level`, `msg` and the event's fields.
    pub log: Vec<Value>,
    /// Exit status code.
    pub code: Option<i32>,
}

impl Traced {
    /// `(batches, batch_span_ns, host_wait_ns)` of the `device time:` line of `pid`'s `stream`.
    pub fn device_time(&self, pid: u64, stream: u64) -> (u64, u64, u64) {
        let prefix = format!("device time: pid={pid} stream={stream:#x} ");
        let line = self
            .stderr
            .iter()
            .find(|l| l.starts_with(&prefix))
            .unwrap_or_else(|| panic!("no line {prefix:?} in {:?}", self.stderr));
        let field = |name: &str| -> u64 {
            line.split_whitespace()
                .find_map(|f| f.strip_prefix(&format!("{name}=")))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no {name} in {line}"))
        };
        (
            field("batches"),
            field("batch_span_ns"),
            field("host_wait_ns"),
        )
    }

    /// Events of one process.
    pub fn of_pid(&self, pid: u64) -> Vec<&Value> {
        self.events
            .iter()
            .filter(|e| e["pid"].as_u64() == Some(pid))
            .collect()
    }

    /// The records of one event (`ready`, `summary`, `discovered`, `baseline`, ...).
    pub fn log_events(&self, event: &str) -> Vec<&Value> {
        self.log.iter().filter(|r| r["event"] == event).collect()
    }

    /// The fields of the `summary` event.
    pub fn summary(&self) -> HashMap<String, u64> {
        let record = self
            .log_events("summary")
            .into_iter()
            .next_back()
            .unwrap_or_else(|| panic!("no summary record: {:?}", self.stderr));
        record
            .as_object()
            .expect("a record is an object")
            .iter()
            .filter_map(|(k, v)| Some((k.clone(), v.as_u64()?)))
            .collect()
    }
}

impl Cudatrace {
    /// The stderr lines printed so far.
    pub fn stderr_now(&self) -> Vec<String> {
        self.stderr.lock().unwrap().clone()
    }

    /// The JSON records printed so far.
    pub fn log_now(&self) -> Vec<Value> {
        self.log.lock().unwrap().clone()
    }

    /// Waits (up to `limit`) for a record of `event` for which `pred` holds; returns it.
    pub fn wait_event(
        &self,
        limit: Duration,
        event: &str,
        pred: impl Fn(&Value) -> bool,
    ) -> Option<Value> {
        poll(limit, || {
            self.log_now()
                .into_iter()
                .find(|r| r["event"] == event && pred(r))
        })
    }

    /// Waits (up to `limit`) for a stderr line for which `pred` holds; returns it.
    pub fn wait_stderr(&self, limit: Duration, pred: impl Fn(&str) -> bool) -> Option<String> {
        poll(limit, || self.stderr_now().into_iter().find(|l| pred(l)))
    }

    /// Starts `cudatrace trace ARGS` and waits for its `ready:` line (panics after 60 s).
    pub fn start(env: &Env, args: &[&str]) -> Cudatrace {
        Self::try_start(env, args).unwrap_or_else(|t| {
            panic!(
                "cudatrace did not become ready; stderr:\n{}",
                t.stderr.join("\n")
            )
        })
    }

    /// Starts the tracer; on failure to become ready, returns what it printed.
    pub fn try_start(env: &Env, args: &[&str]) -> Result<Cudatrace, Traced> {
        Self::try_start_command(env, "trace", args, &[])
    }

    /// Starts `cudatrace trace ARGS` with extra environment and waits for its `ready:` line.
    pub fn start_with(env: &Env, args: &[&str], vars: &[(&str, &str)]) -> Cudatrace {
        Self::try_start_command(env, "trace", args, vars).unwrap_or_else(|t| {
            panic!(
                "cudatrace did not become ready; stderr:\n{}",
                t.stderr.join("\n")
            )
        })
    }

    /// Starts `WRAPPER ARGS` (a program that execs cudatrace, such as setpriv; ARGS name the
    /// binary and its command) and waits for the `ready:` line.
    pub fn start_wrapped(
        _env: &Env,
        wrapper: &str,
        args: &[String],
        vars: &[(&str, &str)],
    ) -> Cudatrace {
        let mut cmd = Command::new(wrapper);
        cmd.args(args).envs(vars.iter().copied());
        Self::spawn(cmd).unwrap_or_else(|t| {
            panic!(
                "cudatrace under {wrapper} did not become ready; stderr:\n{}",
                t.stderr.join("\n")
            )
        })
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// Starts `cudatrace run ARGS` with extra environment and waits for its `ready:` line.
    pub fn start_daemon(env: &Env, args: &[&str], vars: &[(&str, &str)]) -> Cudatrace {
        Self::try_start_command(env, "run", args, vars).unwrap_or_else(|t| {
            panic!(
                "cudatrace run did not become ready; stderr:\n{}",
                t.stderr.join("\n")
            )
        })
    }

    /// Starts `cudatrace run` on the stand-in libcuda with metrics on a free loopback port, plus
    /// `extra` arguments and `vars`; returns it and its listen address.
    pub fn start_daemon_on_loopback(
        env: &Env,
        extra: &[&str],
        vars: &[(&str, &str)],
    ) -> (Cudatrace, String) {
        let listen = format!("127.0.0.1:{}", free_port());
        let lib = env.libcuda();
        let mut args = vec!["--lib", lib.to_str().unwrap(), "--listen", &listen];
        args.extend_from_slice(extra);
        let daemon = Self::start_daemon(env, &args, vars);
        (daemon, listen)
    }

    /// Starts `cudatrace COMMAND ARGS`; on failure to become ready, returns what it printed.
    pub fn try_start_command(
        env: &Env,
        command: &str,
        args: &[&str],
        vars: &[(&str, &str)],
    ) -> Result<Cudatrace, Traced> {
        let mut cmd = Command::new(&env.bin);
        cmd.arg(command).args(args).envs(vars.iter().copied());
        Self::spawn(cmd)
    }

    /// Runs `cmd` (cudatrace, or a wrapper that execs it); on failure to become ready, returns
    /// what it printed.
    fn spawn(mut cmd: Command) -> Result<Cudatrace, Traced> {
        let mut child = cmd
            .env(LOG_FORMAT_VAR, "json")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("cannot start cudatrace");
        let out = child.stdout.take().unwrap();
        let stdout =
            std::thread::spawn(move || BufReader::new(out).lines().map_while(Result::ok).collect());
        let err = child.stderr.take().unwrap();
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let (ready_tx, ready_rx) = mpsc::channel();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (lines, records) = (stderr.clone(), log.clone());
        let stderr_done = std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                let (text, record) = parse_log_line(line);
                let ready = is_ready(&text, record.as_ref());
                // The text first: a test that waits for `ready` may read the lines at once.
                lines.lock().unwrap().push(text);
                if let Some(r) = record {
                    records.lock().unwrap().push(r);
                }
                if ready {
                    let _ = ready_tx.send(());
                }
            }
        });
        let tracer = Cudatrace {
            child: Some(child),
            stdout: Some(stdout),
            stderr,
            log,
            stderr_done: Some(stderr_done),
        };
        match ready_rx.recv_timeout(Duration::from_secs(60)) {
            Ok(()) => Ok(tracer),
            Err(_) => Err(tracer.wait()),
        }
    }

    /// Kills the tracer with SIGKILL, as an OOM killer or `kubectl delete --force` would.
    pub fn kill(self) -> Traced {
        // SAFETY: plain kill(2).
        unsafe {
            libc::kill(
                self.child.as_ref().expect("running").id() as i32,
                libc::SIGKILL,
            )
        };
        self.wait()
    }

    /// Stops the tracer with SIGINT and collects its output, without waiting for probes that a
    /// background process may still be removing (see [`cudatrace_processes`]).
    pub fn stop_without_waiting(self) -> Traced {
        // SAFETY: plain kill(2).
        unsafe {
            libc::kill(
                self.child.as_ref().expect("running").id() as i32,
                libc::SIGINT,
            )
        };
        self.collect(false)
    }

    /// Stops the tracer with SIGINT and collects its output.
    pub fn stop(self) -> Traced {
        // SAFETY: plain kill(2).
        unsafe {
            libc::kill(
                self.child.as_ref().expect("running").id() as i32,
                libc::SIGINT,
            )
        };
        self.wait()
    }

    /// Waits for the tracer to exit on its own (panics after 60 s).
    pub fn wait(self) -> Traced {
        self.collect(true)
    }

    fn collect(mut self, wait_detach: bool) -> Traced {
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
        if wait_detach {
            wait_for_background_detach();
        }
        let lines = self.stdout.take().expect("joined once").join().unwrap();
        self.stderr_done
            .take()
            .expect("joined once")
            .join()
            .unwrap();
        // A tracer killed by SIGKILL may have written part of its last line: only that one may be
        // cut short.
        let last = lines.len().saturating_sub(1);
        let events = lines
            .iter()
            .enumerate()
            .filter(|(_, l)| l.starts_with('{'))
            .filter_map(|(i, l)| match serde_json::from_str(l) {
                Ok(v) => Some(v),
                Err(_) if i == last && status.code().is_none() => None,
                Err(e) => panic!("bad JSON line {l}: {e}"),
            })
            .collect();
        let stderr = std::mem::take(&mut *self.stderr.lock().unwrap());
        let log = std::mem::take(&mut *self.log.lock().unwrap());
        Traced {
            events,
            stdout: lines,
            stderr,
            log,
            code: status.code(),
        }
    }
}

/// Waits until no `cudatrace` process is left. A stopped tracer hands the removal of its probes
/// to a forked child, which takes seconds and holds the kernel's probe mutex meanwhile; the next
/// test's attach would wait on it while its workload already runs.
pub fn wait_for_background_detach() {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(120) {
        if cudatrace_processes() == 0 {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("a cudatrace process was still detaching after 120 s");
}

/// Running (not zombie) processes named `cudatrace`.
pub fn cudatrace_processes() -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|p| {
            std::fs::read_to_string(p.path().join("comm"))
                .is_ok_and(|c| c.trim_end() == "cudatrace")
                && std::fs::read_to_string(p.path().join("stat")).is_ok_and(|s| !s.contains(") Z "))
        })
        .count()
}
