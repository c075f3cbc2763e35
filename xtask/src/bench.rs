//! `cargo xtask bench`: the cost of tracing, measured side by side in one run.
//!
//! Overhead: rounds interleave (A) untraced, (B) the floor: empty uprobe and uretprobe programs on
//! the same symbol (bpftrace with empty actions), (C) bpftrace's latency-histogram one-liner,
//! (D) `cudatrace run`, each timing the same workload of cuLaunchKernel calls against the
//! stand-in libcuda (whose calls cost nearly nothing, so what is measured is the probes).
//! Then throughput (the workload at full speed for 30 s under `cudatrace run`: rate, drops, and
//! tracer CPU per million events) and memory at scale (RSS after 1, 100 and 1,000 processes, and
//! 10 and 10,000 kernels). Results go to bench/results/ as JSON and a Markdown table.
use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use serde_json::{Value, json};

const ROUNDS: usize = 7;
const CALLS: u64 = 300_000;

struct Paths {
    cudatrace: PathBuf,
    workload: PathBuf,
    lib: PathBuf,
}

/// A tracer under test, started and ready; stopped with SIGINT when dropped, so that an error
/// in the middle of the bench leaves no tracer behind.
struct Running {
    child: Child,
    stopped: bool,
}

impl Drop for Running {
    fn drop(&mut self) {
        if !self.stopped {
            // SAFETY: plain kill(2).
            unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
            let _ = self.child.wait();
        }
    }
}

fn wait_line(child: &mut Child, from_stdout: bool, needle: &str) -> Result<()> {
    let stream: Box<dyn std::io::Read + Send> = if from_stdout {
        Box::new(child.stdout.take().context("stdout piped")?)
    } else {
        Box::new(child.stderr.take().context("stderr piped")?)
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let needle = needle.to_owned();
    std::thread::spawn(move || {
        let mut sent = false;
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            if !sent && line.contains(&needle) {
                let _ = tx.send(());
                sent = true;
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(120)).context("tracer did not become ready")
}

fn bpftrace(lib: &Path, histogram: bool) -> Result<Running> {
    let l = lib.display();
    let script = if histogram {
        format!(
            "uprobe:{l}:cuLaunchKernel {{ @s[tid] = nsecs; }} \
             uretprobe:{l}:cuLaunchKernel /@s[tid]/ {{ @ns = hist(nsecs - @s[tid]); delete(@s[tid]); }} \
             BEGIN {{ printf(\"ready\\n\"); }}"
        )
    } else {
        format!("uprobe:{l}:cuLaunchKernel {{ }} uretprobe:{l}:cuLaunchKernel {{ }} BEGIN {{ printf(\"ready\\n\"); }}")
    };
    let mut child = Command::new("bpftrace")
        .args(["-e", &script])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("bpftrace (Debian package) is needed: scripts/setup.sh installs it")?;
    wait_line(&mut child, true, "ready")?;
    Ok(Running { child, stopped: false })
}

fn start_cudatrace(p: &Paths, port: u16) -> Result<Running> {
    let mut child = Command::new(&p.cudatrace)
        .args(["run", "--lib"])
        .arg(&p.lib)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    wait_line(&mut child, false, "ready:")?;
    Ok(Running { child, stopped: false })
}

impl Running {
    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn stop(mut self) -> Result<()> {
        // SAFETY: plain kill(2).
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        self.child.wait()?;
        self.stopped = true;
        wait_detached();
        Ok(())
    }
}

/// cudatrace hands detaching to a child; wait for it so that the next round starts clean.
fn wait_detached() {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(120) {
        let busy = std::fs::read_dir("/proc").map(|d| {
            d.flatten().any(|p| {
                std::fs::read_to_string(p.path().join("comm")).is_ok_and(|c| c.trim_end() == "cudatrace")
                    && std::fs::read_to_string(p.path().join("stat")).is_ok_and(|s| !s.contains(") Z "))
            })
        });
        if !busy.unwrap_or(false) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn workload(p: &Paths, args: &[&str]) -> Result<Value> {
    let out = Command::new(&p.workload)
        .arg("--lib")
        .arg(&p.lib)
        .args(args)
        .env("CUDA_STANDIN_CALL_NS", "0")
        .env("CUDA_STANDIN_NS_PER_BLOCK", "0")
        .env("CUDA_STANDIN_DEVICE", "/dev/shm/cudatrace-bench-device")
        .output()?;
    if !out.status.success() {
        bail!("workload failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let text = String::from_utf8(out.stdout)?;
    Ok(serde_json::from_str(text.lines().last().context("workload printed nothing")?)?)
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// User plus system CPU seconds of a process, from /proc/PID/stat.
fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let fields: Vec<&str> = stat[stat.rfind(')').context("stat")? + 2..].split_whitespace().collect();
    // utime and stime are fields 14 and 15: indexes 11 and 12 after the state field.
    let ticks: u64 = fields[11].parse::<u64>()? + fields[12].parse::<u64>()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok(ticks as f64 / hz)
}

fn rss_bytes(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .context("VmRSS")?
        .trim()
        .trim_end_matches(" kB")
        .trim()
        .parse()?;
    Ok(kb * 1024)
}

fn scrape(port: u16, metric: &str) -> Result<f64> {
    let out = Command::new("curl").args(["-sf", &format!("http://127.0.0.1:{port}/metrics")]).output()?;
    let text = String::from_utf8(out.stdout)?;
    let line = text.lines().find(|l| l.starts_with(metric)).with_context(|| format!("{metric} not exported"))?;
    Ok(line.rsplit(' ').next().unwrap_or("0").parse()?)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| c.lines().find_map(|l| l.strip_prefix("model name").map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned())))
        .unwrap_or_else(|| "unknown CPU".into());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!("{cpu}, {} cores, Linux {}", std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0), kernel.trim())
}

/// Runs the benchmark and writes bench/results/.
pub fn run(root: &Path, cudatrace: PathBuf, standin: PathBuf) -> Result<()> {
    let p = Paths { cudatrace, workload: standin.join("cuda-workload"), lib: standin.join("libcuda.so.1") };
    let calls = CALLS.to_string();
    let names = ["untraced", "floor", "bpftrace", "cudatrace"];
    let mut ns: [Vec<f64>; 4] = Default::default();
    eprintln!("bench: {ROUNDS} rounds of A B C D, {CALLS} cuLaunchKernel calls each");
    for round in 0..ROUNDS {
        for (i, name) in names.iter().enumerate() {
            let tracer = match i {
                0 => None,
                1 => Some(bpftrace(&p.lib, false)?),
                2 => Some(bpftrace(&p.lib, true)?),
                _ => Some(start_cudatrace(&p, free_port()?)?),
            };
            let r = workload(&p, &["calls", &calls])?;
            if let Some(t) = tracer {
                t.stop()?;
            }
            let v = r["ns_per_call"].as_f64().context("ns_per_call")?;
            eprintln!("bench: round {} {name}: {v:.1} ns/call", round + 1);
            ns[i].push(v);
        }
    }
    // Added cost per call, paired with the same round's untraced run.
    let added = |i: usize| -> Vec<f64> { ns[i].iter().zip(&ns[0]).map(|(t, a)| t - a).collect() };
    let mut summary = serde_json::Map::new();
    for (i, name) in names.iter().enumerate() {
        let mut a = if i == 0 { ns[0].clone() } else { added(i) };
        let med = median(&mut a);
        summary.insert(
            (*name).into(),
            json!({"ns_per_call": ns[i], "added_ns_median": if i == 0 { 0.0 } else { med },
                   "added_ns_min": a.first(), "added_ns_max": a.last()}),
        );
    }
    let med = |i: usize| median(&mut added(i));
    let (floor, bpf, ours) = (med(1), med(2), med(3));

    // Throughput: one workload thread at full speed for 30 s.
    eprintln!("bench: throughput, 30 s at full speed under cudatrace run");
    let port = free_port()?;
    let t = start_cudatrace(&p, port)?;
    let cpu0 = cpu_seconds(t.pid())?;
    let r = workload(&p, &["calls", "1000000000", "30"])?;
    std::thread::sleep(Duration::from_millis(1500));
    let cpu1 = cpu_seconds(t.pid())?;
    let events = scrape(port, "cudatrace_events_total")?;
    let dropped = scrape(port, "cudatrace_events_dropped_total")?;
    let rate = r["calls_per_second"].as_f64().unwrap_or(0.0);
    t.stop()?;
    let cpu_ms_per_million = (cpu1 - cpu0) * 1e3 / (events / 1e6);

    // Memory at scale.
    eprintln!("bench: resident memory with 1, 100, 1000 processes and 10, 10000 kernels");
    let port = free_port()?;
    let t = start_cudatrace(&p, port)?;
    let base_rss = rss_bytes(t.pid())?;
    let mut rss = serde_json::Map::new();
    let mut done = 0;
    for target in [1, 100, 1000] {
        while done < target {
            workload(&p, &["kernels", "10"])?;
            done += 1;
        }
        std::thread::sleep(Duration::from_millis(500));
        rss.insert(format!("processes_{target}_kernels_10"), json!(rss_bytes(t.pid())?));
    }
    workload(&p, &["kernels", "10000"])?;
    std::thread::sleep(Duration::from_millis(500));
    rss.insert("process_1_kernels_10000".into(), json!(rss_bytes(t.pid())?));
    t.stop()?;

    let result = json!({
        "machine": machine(),
        "rounds": ROUNDS,
        "calls_per_round": CALLS,
        "overhead": summary,
        "added_ns": {"floor": floor, "bpftrace": bpf, "cudatrace": ours},
        "ratio_cudatrace_to_floor": ours / floor,
        "ratio_cudatrace_to_bpftrace": ours / bpf,
        "throughput": {"calls_per_second": rate, "seconds": r["seconds"], "events": events, "dropped": dropped,
                       "tracer_cpu_ms_per_million_events": cpu_ms_per_million},
        "rss_bytes": {"idle": base_rss, "after": rss},
    });
    let dir = root.join("bench/results");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("latest.json"), serde_json::to_string_pretty(&result)? + "\n")?;
    let spread = |i: usize| {
        let mut a = added(i);
        a.sort_by(|x, y| x.total_cmp(y));
        format!("{:.0} ({:.0} to {:.0})", median(&mut a.clone()), a[0], a[a.len() - 1])
    };
    let mut md = format!(
        "# cudatrace benchmark\n\nMachine: {}\n\n{ROUNDS} interleaved rounds of {CALLS} `cuLaunchKernel` calls against the stand-in libcuda.\n\n\
         | setup | ns per call, median | added ns per call, median (min to max) |\n|---|---|---|\n",
        machine()
    );
    for (i, name) in ["A untraced", "B floor: empty uprobe+uretprobe", "C bpftrace latency histogram", "D cudatrace run"].iter().enumerate() {
        let added = if i == 0 { "0".to_owned() } else { spread(i) };
        md += &format!("| {name} | {:.0} | {added} |\n", median(&mut ns[i].clone()));
    }
    md += &format!(
        "\nD/B = {:.2}, D/C = {:.2}\n\nThroughput: {:.0} calls/s from one workload thread for {} s under `cudatrace run`: \
         {events:.0} events, {dropped:.0} dropped, {cpu_ms_per_million:.0} ms of tracer CPU per million events.\n\n\
         Resident memory of `cudatrace run`: idle {:.1} MiB",
        ours / floor,
        ours / bpf,
        rate,
        r["seconds"],
        base_rss as f64 / 1048576.0
    );
    for (k, v) in &rss {
        md += &format!(", {k} {:.1} MiB", v.as_f64().unwrap_or(0.0) / 1048576.0);
    }
    md += ".\n";
    std::fs::write(dir.join("latest.md"), &md)?;
    println!("{md}");
    Ok(())
}
