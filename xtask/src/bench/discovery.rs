//! Discovery's cost on a crowded node, polling against event-driven, side by side: whole-process
//! idle CPU of `cudatrace run` (no `--lib`) beside 1, 100 and 1,000 processes of 200 mappings
//! each; the time from a `dlopen` of a new library file to its `discovered` line in the crowd
//! of 1,000; and what event-driven discovery's hook adds to every system call of the node (the
//! open path's kprobe: nothing; the `sys_enter` fallback: every call runs it).
use std::{
    io::{BufRead, BufReader},
    path::Path,
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};
use serde_json::{json, Value};

use super::{cpu_seconds, median, switches, Paths};

/// Idle CPU is measured over this long.
const IDLE: Duration = Duration::from_secs(10);
/// New library files loaded per mode, for the latency.
const LOADS: usize = 15;
/// Interleaved rounds of the system-call cost.
const SYSCALL_ROUNDS: usize = 5;

/// A `cudatrace run` without `--lib`, its stderr lines kept.
struct Daemon {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Daemon {
    fn start(p: &Paths, mode: &str) -> Result<Daemon> {
        Daemon::start_with(p, mode, &[])
    }

    /// As [`Daemon::start`], with environment `vars` (one that keeps a hook off).
    fn start_with(p: &Paths, mode: &str, vars: &[(&str, &str)]) -> Result<Daemon> {
        let mut child = Command::new(&p.cudatrace)
            .args(["run", "--listen", "127.0.0.1:0", "--discovery", mode])
            .envs(vars.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (kept, err) = (lines.clone(), child.stderr.take().context("stderr")?);
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                kept.lock().unwrap().push(line);
            }
        });
        let started = Instant::now();
        while !lines
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.starts_with("ready:"))
        {
            if started.elapsed() > Duration::from_secs(60) {
                bail!(
                    "cudatrace run --discovery {mode} not ready: {:?}",
                    lines.lock().unwrap()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(Daemon { child, lines })
    }

    /// When the library of process `pid` was discovered (CLOCK_MONOTONIC ns).
    fn discovered(&self, pid: u64) -> Option<u64> {
        let needle = format!("discovered: /proc/{pid}/");
        self.lines.lock().unwrap().iter().find_map(|l| {
            l.starts_with(&needle)
                .then(|| l.rsplit_once("at_ns=")?.1.parse().ok())
                .flatten()
        })
    }

    /// The open hook its `discovery` line names (`kprobe:...`, `uprobe:...` or
    /// `raw_tracepoint:...`).
    fn hook(&self) -> String {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .find_map(|l| {
                let l = l.strip_prefix(
                    "discovery: the kernel names each process that opens or loads a libcuda (",
                )?;
                Some(l.split_once(')')?.0.to_owned())
            })
            .unwrap_or_else(|| "none".into())
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // SAFETY: plain kill(2).
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let _ = self.child.wait();
        integration_tests::wait_for_background_detach();
    }
}

/// `n` processes of 200 mappings, asleep.
fn crowd(p: &Paths, n: usize) -> Result<Vec<Child>> {
    let kids = (0..n)
        .map(|_| {
            Command::new(&p.workload)
                .args(["crowd", "200", "3600"])
                .stdout(Stdio::null())
                .spawn()
        })
        .collect::<std::io::Result<Vec<_>>>()?;
    std::thread::sleep(Duration::from_millis(500 + n as u64 * 2));
    Ok(kids)
}

fn end(kids: Vec<Child>) {
    for mut k in kids {
        let _ = k.kill();
        let _ = k.wait();
    }
}

/// The workload's `syscalls` scenario: ns per getppid().
fn syscall_ns(p: &Paths) -> Result<f64> {
    let out = Command::new(&p.workload)
        .args(["syscalls", "5000000"])
        .output()?;
    let v: Value = serde_json::from_slice(out.stdout.trim_ascii())?;
    v["ns_per_call"].as_f64().context("ns_per_call")
}

/// Runs the discovery benchmark: its JSON and its Markdown section.
pub fn measure(p: &Paths, dir: &Path) -> Result<(Value, String)> {
    let modes = ["poll", "events"];
    let mut idle = serde_json::Map::new();
    let mut md = "\n## Discovery on a crowded node\n\n| processes of 200 mappings | poll: idle CPU ms/s | events: idle CPU ms/s | events: wake-ups/s |\n|---|---|---|---|\n".to_owned();
    let mut latency = serde_json::Map::new();
    for n in [1usize, 100, 1000] {
        eprintln!("bench: discovery, idle beside {n} crowded processes, poll then events");
        let kids = crowd(p, n)?;
        let (mut row, mut wakes) = (Vec::new(), 0.0);
        for mode in modes {
            let d = Daemon::start(p, mode)?;
            std::thread::sleep(Duration::from_secs(2));
            let (c0, w0, t0) = (
                cpu_seconds(d.child.id())?,
                switches(d.child.id())?,
                Instant::now(),
            );
            std::thread::sleep(IDLE);
            let secs = t0.elapsed().as_secs_f64();
            let ms_per_s = (cpu_seconds(d.child.id())? - c0) * 1e3 / secs;
            wakes = (switches(d.child.id())? - w0) as f64 / secs;
            row.push(ms_per_s);
            if n == 1000 {
                latency.insert(mode.into(), json!(dlopen_ms(p, &d, dir)?));
            }
        }
        md += &format!("| {n} | {:.2} | {:.2} | {wakes:.2} |\n", row[0], row[1]);
        idle.insert(
            n.to_string(),
            json!({"poll_ms_per_s": row[0], "events_ms_per_s": row[1], "events_wakeups_per_s": wakes}),
        );
        end(kids);
    }
    for mode in modes {
        let mut l: Vec<f64> = serde_json::from_value(latency[mode].clone())?;
        l.sort_by(|a, b| a.total_cmp(b));
        md += &format!(
            "\n{mode}: `dlopen` of a new library file to `discovered` beside 1,000 crowded processes, {LOADS} loads: median {:.1} ms, slowest {:.1} ms.",
            median(&mut l.clone()),
            l.last().copied().unwrap_or(f64::NAN)
        );
    }
    eprintln!(
        "bench: discovery, ns per system call: {SYSCALL_ROUNDS} interleaved rounds without cudatrace, with event-driven discovery, with it kept off the loaders (the sys_enter fallback), beside polling"
    );
    let (mut bare, mut with_events, mut with_poll) = (Vec::new(), Vec::new(), Vec::new());
    let mut with_syscalls = Vec::new();
    let (mut hook, mut fallback) = (String::new(), String::new());
    for _ in 0..SYSCALL_ROUNDS {
        bare.push(syscall_ns(p)?);
        let d = Daemon::start(p, "events")?;
        with_events.push(syscall_ns(p)?);
        hook = d.hook();
        drop(d);
        let d = Daemon::start_with(
            p,
            "events",
            &[
                ("CUDATRACE_LOADER_SYMBOL", "no_such_symbol"),
                ("CUDATRACE_OPENS_FUNCTION", "no_such_function"),
            ],
        )?;
        with_syscalls.push(syscall_ns(p)?);
        fallback = d.hook();
        drop(d);
        let _d = Daemon::start(p, "poll")?;
        with_poll.push(syscall_ns(p)?);
    }
    let (bare, with_events, with_syscalls, with_poll) = (
        median(&mut bare),
        median(&mut with_events),
        median(&mut with_syscalls),
        median(&mut with_poll),
    );
    md += &format!(
        "\n\nA getppid() system call, 5 million in a row, medians of {SYSCALL_ROUNDS} interleaved rounds: {bare:.0} ns untraced, {with_events:.0} ns ({:+.1}%) with event-driven discovery (its hook: `{hook}`), {with_syscalls:.0} ns ({:+.1}%) with its last fallback (`{fallback}`), {with_poll:.0} ns beside polling discovery.\n",
        (with_events / bare - 1.0) * 100.0,
        (with_syscalls / bare - 1.0) * 100.0
    );
    md += &format!(
        "\nTarget: getppid() at most 3% slower while `cudatrace run` idles: {:+.1}%, {}.\n",
        (with_events / bare - 1.0) * 100.0,
        if with_events <= bare * 1.03 {
            "reached"
        } else {
            "not reached"
        }
    );
    let v = json!({"idle_cpu": idle, "dlopen_to_discovered_ms": latency,
                   "syscall_ns": {"untraced": bare, "events": with_events, "poll": with_poll, "events_hook": hook,
                                  "fallback": with_syscalls, "fallback_hook": fallback}});
    Ok((v, md))
}

/// `LOADS` workloads, each loading its own copy of the library: ms from its `dlopen` to the
/// daemon's `discovered` line.
fn dlopen_ms(p: &Paths, d: &Daemon, dir: &Path) -> Result<Vec<f64>> {
    let mut out = Vec::new();
    for k in 0..LOADS {
        let copy = dir.join(format!("discovery-{}-{k}", d.child.id()));
        std::fs::create_dir_all(&copy)?;
        let lib = copy.join("libcuda.so.1");
        std::fs::copy(&p.lib, &lib)?;
        let o = Command::new(&p.workload)
            .arg("--lib")
            .arg(&lib)
            // Alive for a second after its dlopen: polling over 1,000 crowded processes can take
            // longer than the 250 ms period to find it, and a process gone is never found.
            .args(["--settle", "1000", "basic", "10", "0"])
            .env("CUDA_STANDIN_DEVICE", "/dev/shm/cudatrace-bench-device")
            .output()?;
        let v: Value = serde_json::from_slice(o.stdout.trim_ascii())?;
        let (pid, loaded) = (
            v["pid"].as_u64().context("pid")?,
            v["loaded_ns"].as_u64().context("loaded_ns")?,
        );
        std::thread::sleep(Duration::from_millis(300));
        let at = d
            .discovered(pid)
            .with_context(|| format!("pid {pid}'s library was not discovered"))?;
        out.push((at as f64 - loaded as f64) / 1e6);
        let _ = std::fs::remove_dir_all(&copy);
    }
    Ok(out)
}
