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
    time::Duration,
};

use anyhow::{bail, Context as _, Result};
use integration_tests::{exposition, free_port, http, wait_for_background_detach};
use serde_json::{json, Value};

const ROUNDS: usize = 7;

mod discovery;
mod otlp;
mod overhead;
mod proc;
mod throughput;

use proc::{cpu_seconds, switches};
use throughput::{throughput, Throughput};

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
    rx.recv_timeout(Duration::from_secs(120))
        .context("tracer did not become ready")
}

fn bpftrace(lib: &Path, symbol: &str, histogram: bool) -> Result<Running> {
    let l = lib.display();
    let script = if histogram {
        format!(
            "uprobe:{l}:{symbol} {{ @s[tid] = nsecs; }} \
             uretprobe:{l}:{symbol} /@s[tid]/ {{ @ns = hist(nsecs - @s[tid]); delete(@s[tid]); }} \
             BEGIN {{ printf(\"ready\\n\"); }}"
        )
    } else {
        format!("uprobe:{l}:{symbol} {{ }} uretprobe:{l}:{symbol} {{ }} BEGIN {{ printf(\"ready\\n\"); }}")
    };
    let mut child = Command::new("bpftrace")
        .args(["-e", &script])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("bpftrace (Debian package) is needed: scripts/setup.sh installs it")?;
    wait_line(&mut child, true, "ready")?;
    Ok(Running {
        child,
        stopped: false,
    })
}

/// `bin run` on the stand-in, `extra` its arguments and `vars` its environment's additions.
fn start_binary(
    bin: &Path,
    p: &Paths,
    port: u16,
    (extra, vars): (&[&str], &[(&str, &str)]),
) -> Result<Running> {
    let mut child = Command::new(bin)
        .envs(vars.iter().copied())
        .args(["run", "--lib"])
        .arg(&p.lib)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    wait_line(&mut child, false, "ready:")?;
    Ok(Running {
        child,
        stopped: false,
    })
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
    Ok(serde_json::from_str(
        text.lines().last().context("workload printed nothing")?,
    )?)
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
    let text = http::try_get(&format!("http://127.0.0.1:{port}/metrics"), None)
        .map_err(anyhow::Error::msg)?;
    let samples = exposition::parse(&text);
    let found = exposition::select(&samples, metric, &[]);
    anyhow::ensure!(!found.is_empty(), "{metric} not exported");
    Ok(found.iter().map(|s| s.value).sum())
}

/// `cudatrace_calls_total` of cuLaunchKernel, every process.
fn launches_of(port: u16) -> Result<f64> {
    let text = http::try_get(&format!("http://127.0.0.1:{port}/metrics"), None)
        .map_err(anyhow::Error::msg)?;
    let samples = exposition::parse(&text);
    Ok(exposition::sum(
        &samples,
        "cudatrace_calls_total",
        &[("api", "cuLaunchKernel")],
    ))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines().find_map(|l| {
                l.strip_prefix("model name")
                    .map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned())
            })
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!(
        "{cpu}, {} cores, Linux {}",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        kernel.trim()
    )
}

/// Runs the benchmark and writes bench/results/.
pub fn run(root: &Path, cudatrace: PathBuf, standin: PathBuf) -> Result<()> {
    let before = std::env::var_os("CUDATRACE_BENCH_BEFORE").map(PathBuf::from);
    let p = Paths {
        cudatrace,
        before,
        workload: standin.join("cuda-workload"),
        lib: standin.join("libcuda.so.1"),
    };
    let dir = root.join("bench/results");
    std::fs::create_dir_all(&dir)?;
    // CUDATRACE_BENCH_ONLY=discovery (or otlp, overhead) runs that part alone.
    let only = std::env::var("CUDATRACE_BENCH_ONLY").unwrap_or_default();
    type Part = fn(&Paths, &Path) -> Result<(Value, String)>;
    for (name, part) in [
        ("discovery", discovery::measure as Part),
        ("otlp", otlp::measure),
        ("overhead", overhead::part),
    ] {
        if only == name {
            let (v, md) = part(&p, &dir)?;
            std::fs::write(
                dir.join(format!("{name}.json")),
                serde_json::to_string_pretty(&v)? + "\n",
            )?;
            std::fs::write(dir.join(format!("{name}.md")), &md)?;
            println!("{md}");
            return Ok(());
        }
    }
    let (discovery_json, discovery_md) = discovery::measure(&p, &dir)?;
    let (otlp_json, otlp_md) = otlp::measure(&p, &dir)?;
    let setups = if p.before.is_some() { 7 } else { 6 };
    let mut overheads = Vec::new();
    for sym in &overhead::SYMBOLS {
        eprintln!(
            "bench: {ROUNDS} interleaved rounds of {} {} calls, setups A to {}",
            sym.calls,
            sym.name,
            if setups == 7 { "G, F" } else { "E, G" }
        );
        overheads.push(overhead::measure(&p, sym, ROUNDS)?);
    }
    // Added cost per call, paired with the same round's untraced run.
    let added = |o: &overhead::Overhead, i: usize| -> Vec<f64> {
        o.ns[i].iter().zip(&o.ns[0]).map(|(t, a)| t - a).collect()
    };
    let med = |o: &overhead::Overhead, i: usize| median(&mut added(o, i));

    // Throughput at full speed, one and two workload threads, then one thread scraped 20 times a
    // second.
    eprintln!("bench: throughput, 30 s at full speed under cudatrace run, 1 and 2 threads");
    let quiet = throughput(&p, &p.cudatrace, (None, 1), &[])?;
    let two = throughput(&p, &p.cudatrace, (None, 2), &[])?;
    eprintln!(
        "bench: throughput, 30 s at full speed under cudatrace run, scraped 20 times a second"
    );
    let scraped = throughput(&p, &p.cudatrace, (Some(20), 1), &[])?;
    let quiet_before = match &p.before {
        Some(bin) => {
            eprintln!("bench: throughput, 30 s at full speed under the before binary's run");
            Some(throughput(&p, bin, (None, 1), &[])?)
        }
        None => None,
    };
    let scrape_cpu_ratio = scraped.cpu_ms_per_million / quiet.cpu_ms_per_million;
    let rss = memory(&p)?;

    let tp = |t: &Throughput| {
        json!({"calls_per_second": t.calls_per_second, "seconds": t.seconds, "calls": t.calls, "launches_counted": t.launches,
               "records": t.events, "dropped": t.dropped, "tracer_cpu_ms_per_million_launches": t.cpu_ms_per_million,
               "scrapes": t.scrapes, "slowest_scrape_ms": t.scrape_ms_max, "rss_bytes_start_end": [t.rss.0, t.rss.1]})
    };
    let mut per_symbol = serde_json::Map::new();
    for (sym, o) in overhead::SYMBOLS.iter().zip(&overheads) {
        let setups_json: serde_json::Map<String, Value> = (0..setups)
            .map(|i| (overhead::SETUPS[i].to_owned(), json!({"ns_per_call": o.ns[i], "added_ns_median": if i == 0 { 0.0 } else { med(o, i) }})))
            .collect();
        per_symbol.insert(
            sym.name.into(),
            json!({"first_instruction": overhead::first_instruction(&p.lib, sym.name), "calls_per_round": sym.calls,
                   "setups": setups_json, "ratio_run_to_floor": med(o, 3) / med(o, 1), "ratio_run_to_bpftrace": med(o, 3) / med(o, 2),
                   "ratio_pair_to_floor": med(o, overhead::PAIR) / med(o, 1),
                   "attach_ms": o.attach_ms, "stop_ms": o.stop_ms}),
        );
    }
    let result = json!({
        "machine": machine(),
        "rounds": ROUNDS,
        "overhead": per_symbol,
        "throughput": tp(&quiet),
        "throughput_two_threads": tp(&two),
        "throughput_scraped_20hz": tp(&scraped),
        "scraped_cpu_ratio_to_unscraped": scrape_cpu_ratio,
        "throughput_before": quiet_before.as_ref().map(tp),
        "rss_bytes": rss,
        "discovery": discovery_json,
        "otlp": otlp_json,
    });
    std::fs::write(
        dir.join("latest.json"),
        serde_json::to_string_pretty(&result)? + "\n",
    )?;

    let mut md = format!("# cudatrace benchmark\n\nMachine: {}\n", machine());
    for (sym, o) in overhead::SYMBOLS.iter().zip(&overheads) {
        md += &format!(
            "\n## {} (first instruction in the stand-in: `{}`)\n\n{ROUNDS} interleaved rounds of {} calls.\n\n\
             | setup | ns per call, median | added ns per call, median (min to max) |\n|---|---|---|\n",
            sym.name,
            overhead::first_instruction(&p.lib, sym.name),
            sym.calls
        );
        for i in 0..setups {
            let mut a = added(o, i);
            a.sort_by(|x, y| x.total_cmp(y));
            let spread = if i == 0 {
                "0".to_owned()
            } else {
                format!(
                    "{:.0} ({:.0} to {:.0})",
                    median(&mut a.clone()),
                    a[0],
                    a[a.len() - 1]
                )
            };
            md += &format!(
                "| {} | {:.0} | {spread} |\n",
                overhead::SETUPS[i],
                median(&mut o.ns[i].clone())
            );
        }
        md += &format!(
            "\nD/B = {:.2}, D/C = {:.2}, E/B = {:.2}, G/B = {:.2}{}; D attach (start to ready) median {:.0} ms, stop (SIGINT to exit) median {:.0} ms.\n",
            med(o, 3) / med(o, 1),
            med(o, 3) / med(o, 2),
            med(o, 4) / med(o, 1),
            med(o, overhead::PAIR) / med(o, 1),
            if setups == 7 { format!(", D/F = {:.2}", med(o, 3) / med(o, overhead::BEFORE)) } else { String::new() },
            median(&mut o.attach_ms.clone()),
            median(&mut o.stop_ms.clone())
        );
    }
    for (label, t) in [
        ("one workload thread", &quiet),
        ("two workload threads", &two),
    ] {
        md += &format!(
            "\nThroughput, {label}, 30 s under `cudatrace run`: {:.0} launches/s, {:.0} made, {:.0} counted, {:.0} records, \
             {:.0} dropped, {:.1} ms of tracer CPU per million launches.\n",
            t.calls_per_second, t.calls, t.launches, t.events, t.dropped, t.cpu_ms_per_million
        );
    }
    md += &format!(
        "\nScraped 20 times a second meanwhile ({} scrapes, slowest {:.1} ms): {:.0} launches/s, {:.0} made, {:.0} counted, \
         {:.0} dropped, {:.1} ms of tracer CPU per million launches ({scrape_cpu_ratio:.2}x unscraped).\n",
        scraped.scrapes, scraped.scrape_ms_max, scraped.calls_per_second, scraped.calls, scraped.launches, scraped.dropped, scraped.cpu_ms_per_million
    );
    if let Some(t) = &quiet_before {
        md += &format!("\nThe before binary's throughput run: {:.0} launches/s, {:.0} counted, {:.0} dropped, {:.1} ms of tracer CPU per million launches.\n", t.calls_per_second, t.launches, t.dropped, t.cpu_ms_per_million);
    }
    md += &targets(&overheads[0], &quiet, &two);
    md += "\nResident memory of `cudatrace run`:";
    for (k, v) in &rss {
        md += &format!(" {k} {:.1} MiB;", v.as_f64().unwrap_or(0.0) / 1048576.0);
    }
    md += "\n";
    md += &discovery_md;
    md += &otlp_md;
    std::fs::write(dir.join("latest.md"), &md)?;
    println!("{md}");
    Ok(())
}

/// The targets of the performance issue, each said reached or not with its figure.
fn targets(launch: &overhead::Overhead, one: &Throughput, two: &Throughput) -> String {
    let added = |i: usize| -> f64 {
        median(
            &mut launch.ns[i]
                .iter()
                .zip(&launch.ns[0])
                .map(|(t, a)| t - a)
                .collect::<Vec<_>>(),
        )
    };
    let (b, c, d, g) = (added(1), added(2), added(3), added(overhead::PAIR));
    let stop = median(&mut launch.stop_ms.clone());
    let mib = |v: u64| v as f64 / 1048576.0;
    let yes = |ok: bool| if ok { "reached" } else { "not reached" };
    let rows = [
        (
            format!("D (uprobe sessions where the kernel has them) below B on cuLaunchKernel: D/B = {:.2}", d / b),
            d < b,
        ),
        (
            format!("G (the uprobe_multi pair) within 1.15x of B on cuLaunchKernel: G/B = {:.2}", g / b),
            g <= 1.15 * b,
        ),
        (
            format!("D below C on cuLaunchKernel: D {d:.0} ns, C {c:.0} ns added"),
            d < c,
        ),
        (
            format!(
                "under 20 ms of tracer CPU per million launches: {:.1} (one thread), {:.1} (two)",
                one.cpu_ms_per_million, two.cpu_ms_per_million
            ),
            one.cpu_ms_per_million < 20.0 && two.cpu_ms_per_million < 20.0,
        ),
        (
            format!(
                "0 drops at the top rate of two workload threads: {:.0} dropped of {:.0} launches",
                two.dropped, two.calls
            ),
            two.dropped == 0.0,
        ),
        (
            format!(
                "every launch counted: {:.0} of {:.0} (one thread), {:.0} of {:.0} (two)",
                one.launches, one.calls, two.launches, two.calls
            ),
            one.launches == one.calls && two.launches == two.calls,
        ),
        (
            format!("detach under 1 s: stop median {stop:.0} ms"),
            stop < 1000.0,
        ),
        (
            format!(
                "memory flat in events: {:.1} to {:.1} MiB over the two-thread run",
                mib(two.rss.0),
                mib(two.rss.1)
            ),
            two.rss.1 <= two.rss.0 + (4 << 20),
        ),
    ];
    let mut md = "\n## Targets\n\n".to_owned();
    for (what, ok) in rows {
        md += &format!("- {what}: {}\n", yes(ok));
    }
    md
}

/// Resident memory of `cudatrace run` idle, then with 1, 100 and 1,000 processes of 10 kernels,
/// and one of 10,000 kernels.
fn memory(p: &Paths) -> Result<serde_json::Map<String, Value>> {
    eprintln!("bench: resident memory with 1, 100, 1000 processes and 10, 10000 kernels");
    let t = start_binary(&p.cudatrace, p, free_port(), (&[], &[]))?;
    let mut rss = serde_json::Map::new();
    rss.insert("idle".into(), json!(rss_bytes(t.pid())?));
    let mut done = 0;
    for target in [1, 100, 1000] {
        while done < target {
            workload(p, &["kernels", "10"])?;
            done += 1;
        }
        std::thread::sleep(Duration::from_millis(500));
        rss.insert(
            format!("processes_{target}_kernels_10"),
            json!(rss_bytes(t.pid())?),
        );
    }
    workload(p, &["kernels", "10000"])?;
    std::thread::sleep(Duration::from_millis(500));
    rss.insert("process_1_kernels_10000".into(), json!(rss_bytes(t.pid())?));
    t.stop()?;
    Ok(rss)
}
