//! `cargo xtask bench`: the cost of tracing, measured side by side in one run.
//!
//! Overhead: rounds interleave (A) untraced, (B) the floor: empty uprobe and uretprobe programs on
//! the same symbol (bpftrace with empty actions), (C) bpftrace's latency-histogram one-liner,
//! (D) `cudatrace run`, each timing the same workload of cuLaunchKernel calls against the
//! stand-in libcuda (whose calls cost nearly nothing, so what is measured is the probes).
//! With `CUDATRACE_BENCH_BEFORE=PATH` a fifth setup, (E) that other `cudatrace` binary's `run`,
//! joins every round: a change is compared with what came before it in the same run.
//! Then throughput (the workload at full speed for 30 s under `cudatrace run`: rate, drops, and
//! tracer CPU per million events), the same again with a client scraping `/metrics` 20 times a
//! second (scrapes must not stall tracing), and memory at scale (RSS after 1, 100 and 1,000 processes, and
//! 10 and 10,000 kernels). Results go to bench/results/ as JSON and a Markdown table.
use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use std::sync::{
    Arc,
    atomic::{AtomicBool, AtomicU64, Ordering},
};

use anyhow::{Context as _, Result, bail};
use integration_tests::{exposition, free_port, http, wait_for_background_detach};
use serde_json::{Value, json};

const ROUNDS: usize = 7;
const CALLS: u64 = 300_000;

struct Paths {
    cudatrace: PathBuf,
    /// Another cudatrace to compare with (E), from `CUDATRACE_BENCH_BEFORE`.
    before: Option<PathBuf>,
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
    start_binary(&p.cudatrace, p, port)
}

fn start_binary(bin: &Path, p: &Paths, port: u16) -> Result<Running> {
    let mut child = Command::new(bin)
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
        // cudatrace hands detaching to a child; wait for it so that the next round starts clean.
        wait_for_background_detach();
        Ok(())
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
    let text = http::try_get(&format!("http://127.0.0.1:{port}/metrics"), None).map_err(anyhow::Error::msg)?;
    let samples = exposition::parse(&text);
    let found = exposition::select(&samples, metric, &[]);
    anyhow::ensure!(!found.is_empty(), "{metric} not exported");
    Ok(found.iter().map(|s| s.value).sum())
}

/// What one throughput run measured.
struct Throughput {
    calls_per_second: f64,
    seconds: Value,
    events: f64,
    dropped: f64,
    cpu_ms_per_million: f64,
    scrapes: u64,
    scrape_ms_max: f64,
}

/// One workload thread at full speed for 30 s under `cudatrace run`; with `scrape_hz`, a client
/// scrapes `/metrics` that often meanwhile.
fn throughput(p: &Paths, bin: &Path, scrape_hz: Option<u32>) -> Result<Throughput> {
    let port = free_port();
    let t = start_binary(bin, p, port)?;
    let stop = Arc::new(AtomicBool::new(false));
    let (scrapes, slowest_us) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let scraper = scrape_hz.map(|hz| {
        let (stop, scrapes, slowest_us) = (stop.clone(), scrapes.clone(), slowest_us.clone());
        std::thread::spawn(move || {
            let url = format!("http://127.0.0.1:{port}/metrics");
            let period = Duration::from_secs_f64(1.0 / f64::from(hz));
            let mut next = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                let start = Instant::now();
                if http::try_get(&url, None).is_ok() {
                    scrapes.fetch_add(1, Ordering::Relaxed);
                    slowest_us.fetch_max(start.elapsed().as_micros() as u64, Ordering::Relaxed);
                }
                next += period;
                std::thread::sleep(next.saturating_duration_since(Instant::now()));
            }
        })
    });
    let cpu0 = cpu_seconds(t.pid())?;
    let r = workload(p, &["calls", "1000000000", "30"])?;
    stop.store(true, Ordering::Relaxed);
    if let Some(s) = scraper {
        let _ = s.join();
    }
    std::thread::sleep(Duration::from_millis(1500));
    let cpu1 = cpu_seconds(t.pid())?;
    let events = scrape(port, "cudatrace_events_total")?;
    let dropped = scrape(port, "cudatrace_events_dropped_total")?;
    t.stop()?;
    Ok(Throughput {
        calls_per_second: r["calls_per_second"].as_f64().unwrap_or(0.0),
        seconds: r["seconds"].clone(),
        events,
        dropped,
        cpu_ms_per_million: (cpu1 - cpu0) * 1e3 / (events / 1e6),
        scrapes: scrapes.load(Ordering::Relaxed),
        scrape_ms_max: slowest_us.load(Ordering::Relaxed) as f64 / 1e3,
    })
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
    let before = std::env::var_os("CUDATRACE_BENCH_BEFORE").map(PathBuf::from);
    let p = Paths { cudatrace, before, workload: standin.join("cuda-workload"), lib: standin.join("libcuda.so.1") };
    let calls = CALLS.to_string();
    let mut names = vec!["untraced", "floor", "bpftrace", "cudatrace"];
    if p.before.is_some() {
        names.push("cudatrace_before");
    }
    let mut ns: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
    eprintln!("bench: {ROUNDS} rounds of {}, {CALLS} cuLaunchKernel calls each", if p.before.is_some() { "A B C D E" } else { "A B C D" });
    for round in 0..ROUNDS {
        for (i, name) in names.iter().enumerate() {
            let tracer = match i {
                0 => None,
                1 => Some(bpftrace(&p.lib, false)?),
                2 => Some(bpftrace(&p.lib, true)?),
                3 => Some(start_cudatrace(&p, free_port())?),
                _ => Some(start_binary(p.before.as_deref().expect("E only with a before binary"), &p, free_port())?),
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
    let before = (names.len() > 4).then(|| med(4));

    // Throughput: one workload thread at full speed for 30 s, then the same with 20 scrapes a
    // second.
    eprintln!("bench: throughput, 30 s at full speed under cudatrace run");
    let quiet = throughput(&p, &p.cudatrace, None)?;
    eprintln!("bench: throughput, 30 s at full speed under cudatrace run, scraped 20 times a second");
    let scraped = throughput(&p, &p.cudatrace, Some(20))?;
    let quiet_before = match &p.before {
        Some(bin) => {
            eprintln!("bench: throughput, 30 s at full speed under the before binary's run");
            Some(throughput(&p, bin, None)?)
        }
        None => None,
    };
    let (rate, events, dropped, cpu_ms_per_million) = (quiet.calls_per_second, quiet.events, quiet.dropped, quiet.cpu_ms_per_million);
    let scrape_cpu_ratio = scraped.cpu_ms_per_million / quiet.cpu_ms_per_million;

    // Memory at scale.
    eprintln!("bench: resident memory with 1, 100, 1000 processes and 10, 10000 kernels");
    let t = start_cudatrace(&p, free_port())?;
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
        "ratio_cudatrace_to_before": before.map(|b| ours / b),
        "throughput_before": quiet_before.as_ref().map(|t| json!({"calls_per_second": t.calls_per_second, "events": t.events,
                       "dropped": t.dropped, "tracer_cpu_ms_per_million_events": t.cpu_ms_per_million})),
        "throughput": {"calls_per_second": rate, "seconds": quiet.seconds, "events": events, "dropped": dropped,
                       "tracer_cpu_ms_per_million_events": cpu_ms_per_million},
        "throughput_scraped_20hz": {"calls_per_second": scraped.calls_per_second, "seconds": scraped.seconds,
                       "events": scraped.events, "dropped": scraped.dropped, "scrapes": scraped.scrapes,
                       "slowest_scrape_ms": scraped.scrape_ms_max,
                       "tracer_cpu_ms_per_million_events": scraped.cpu_ms_per_million,
                       "cpu_ratio_to_unscraped": scrape_cpu_ratio},
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
    let labels = ["A untraced", "B floor: empty uprobe+uretprobe", "C bpftrace latency histogram", "D cudatrace run", "E cudatrace run, before"];
    for (i, name) in labels.iter().take(names.len()).enumerate() {
        let added = if i == 0 { "0".to_owned() } else { spread(i) };
        md += &format!("| {name} | {:.0} | {added} |\n", median(&mut ns[i].clone()));
    }
    if let (Some(b), Some(t)) = (before, &quiet_before) {
        md += &format!(
            "\nD/E = {:.2} (this build against `CUDATRACE_BENCH_BEFORE`); the before binary's throughput run: {:.0} calls/s, \
             {:.0} events, {:.0} dropped, {:.0} ms of tracer CPU per million events\n",
            ours / b,
            t.calls_per_second,
            t.events,
            t.dropped,
            t.cpu_ms_per_million
        );
    }
    md += &format!(
        "\nD/B = {:.2}, D/C = {:.2}\n\nThroughput: {:.0} calls/s from one workload thread for {} s under `cudatrace run`: \
         {events:.0} events, {dropped:.0} dropped, {cpu_ms_per_million:.0} ms of tracer CPU per million events.\n\n\
         Scraped 20 times a second meanwhile ({} scrapes, slowest {:.1} ms): {:.0} calls/s, {:.0} events, {:.0} dropped, \
         {:.0} ms of tracer CPU per million events ({:.2}x unscraped).\n\n\
         Resident memory of `cudatrace run`: idle {:.1} MiB",
        ours / floor,
        ours / bpf,
        rate,
        quiet.seconds,
        scraped.scrapes,
        scraped.scrape_ms_max,
        scraped.calls_per_second,
        scraped.events,
        scraped.dropped,
        scraped.cpu_ms_per_million,
        scrape_cpu_ratio,
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
