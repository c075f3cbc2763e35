//! The cost per traced call, measured side by side in interleaved rounds: (A) untraced, (B) the
//! floor (empty uprobe + uretprobe, bpftrace), (C) bpftrace's latency histogram, (D) `cudatrace
//! run`, (E) `cudatrace trace --json > /dev/null`, (F) the `CUDATRACE_BENCH_BEFORE` binary's
//! `run`; once on a symbol whose first instruction the kernel emulates and once on one it must
//! single-step. D's attach (start to ready) and stop (SIGINT to exit) times are kept too.
use std::{
    path::Path,
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{Context as _, Result};
use integration_tests::free_port;

use super::{bpftrace, start_binary, wait_line, workload, Paths, Running};

/// A probed symbol the bench calls, and how.
pub struct Symbol {
    /// Its name in libcuda.
    pub name: &'static str,
    /// The workload scenario that calls it back to back.
    pub scenario: &'static str,
    /// Calls per round.
    pub calls: u64,
}

/// cuLaunchKernel (the stand-in's starts with `push`, emulated) and cuMemcpyHtoD_v2 (`mov`,
/// single-stepped out of line: about 25 times the cost, so fewer calls). Launch rounds last a
/// few seconds, so that the pair's windows (open a quarter of the time once launches come fast,
/// `tracer-user`'s `probe::windows`) are measured as they run, not only their first.
pub const SYMBOLS: [Symbol; 2] = [
    Symbol {
        name: "cuLaunchKernel",
        scenario: "calls",
        calls: 2_000_000,
    },
    Symbol {
        name: "cuMemcpyHtoD_v2",
        scenario: "copy-calls",
        calls: 20_000,
    },
];

/// The setups, in the order they run each round: D attaches launches by uprobe sessions where
/// the kernel has them, G by the uprobe_multi pair (`CUDATRACE_ATTACH=pair`).
pub const SETUPS: [&str; 7] = [
    "A untraced",
    "B floor: empty uprobe+uretprobe",
    "C bpftrace latency histogram",
    "D cudatrace run",
    "E cudatrace trace --json > /dev/null",
    "G cudatrace run, uprobe_multi pair (no sessions)",
    "F cudatrace run, before",
];
/// Index of G in [`SETUPS`].
pub const PAIR: usize = 5;
/// Index of F in [`SETUPS`] (run only with a before binary).
pub const BEFORE: usize = 6;

/// One symbol's rounds.
pub struct Overhead {
    /// ns per call, per setup (F empty without a before binary), one value per round.
    pub ns: Vec<Vec<f64>>,
    /// D: start to `ready:`, ms, per round.
    pub attach_ms: Vec<f64>,
    /// D: SIGINT to exit, ms, per round.
    pub stop_ms: Vec<f64>,
}

/// `cudatrace trace --json` with its records thrown away.
fn start_trace(bin: &Path, lib: &Path) -> Result<Running> {
    let mut child = Command::new(bin)
        .args(["trace", "--json", "--lib"])
        .arg(lib)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    wait_line(&mut child, false, "ready:")?;
    Ok(Running {
        child,
        stopped: false,
    })
}

/// The first instruction of `symbol` in `lib`, as objdump writes it (`push %rbp`).
pub fn first_instruction(lib: &Path, symbol: &str) -> String {
    let out = Command::new("objdump")
        .args(["-d", "--no-show-raw-insn"])
        .arg(lib)
        .output();
    let Ok(out) = out else {
        return "unknown (objdump not found)".into();
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text
        .lines()
        .skip_while(|l| !l.ends_with(&format!("<{symbol}>:")));
    lines.next();
    lines
        .next()
        .and_then(|l| l.split_once(':'))
        .map(|(_, i)| i.split_whitespace().collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "unknown".into())
}

/// `rounds` interleaved rounds on `sym`.
pub fn measure(p: &Paths, sym: &Symbol, rounds: usize) -> Result<Overhead> {
    let calls = sym.calls.to_string();
    let setups = if p.before.is_some() { 7 } else { 6 };
    let mut o = Overhead {
        ns: vec![Vec::new(); 7],
        attach_ms: Vec::new(),
        stop_ms: Vec::new(),
    };
    for round in 0..rounds {
        // `i` picks the setup and indexes its name and every per-setup column.
        #[allow(clippy::needless_range_loop)]
        for i in 0..setups {
            let started = Instant::now();
            let tracer = match i {
                0 => None,
                1 => Some(bpftrace(&p.lib, sym.name, false)?),
                2 => Some(bpftrace(&p.lib, sym.name, true)?),
                3 => Some(start_binary(&p.cudatrace, p, free_port(), (&[], &[]))?),
                4 => Some(start_trace(&p.cudatrace, &p.lib)?),
                PAIR => Some(start_binary(
                    &p.cudatrace,
                    p,
                    free_port(),
                    (&[], &[("CUDATRACE_ATTACH", "pair")]),
                )?),
                _ => Some(start_binary(
                    p.before.as_deref().expect("F only with a before binary"),
                    p,
                    free_port(),
                    (&[], &[]),
                )?),
            };
            if i == 3 {
                o.attach_ms.push(started.elapsed().as_secs_f64() * 1e3);
            }
            let r = workload(p, &[sym.scenario, &calls])?;
            if let Some(t) = tracer {
                let stopping = Instant::now();
                t.stop()?;
                if i == 3 {
                    o.stop_ms.push(stopping.elapsed().as_secs_f64() * 1e3);
                }
            }
            let v = r["ns_per_call"].as_f64().context("ns_per_call")?;
            eprintln!(
                "bench: {} round {} {}: {v:.1} ns/call",
                sym.name,
                round + 1,
                SETUPS[i]
            );
            o.ns[i].push(v);
        }
    }
    Ok(o)
}

/// `CUDATRACE_BENCH_ONLY=overhead`: the interleaved rounds on cuLaunchKernel alone, each setup's
/// added ns per call (median over rounds) and the ratios to the floor.
pub fn part(p: &Paths, _dir: &Path) -> Result<(serde_json::Value, String)> {
    let o = measure(p, &SYMBOLS[0], super::ROUNDS)?;
    let setups = if p.before.is_some() { 7 } else { 6 };
    let added = |i: usize| {
        let mut a: Vec<f64> = o.ns[i].iter().zip(&o.ns[0]).map(|(t, u)| t - u).collect();
        super::median(&mut a)
    };
    let mut md = format!(
        "# cuLaunchKernel, {} interleaved rounds of {} calls\n\n| setup | ns per call, median | added ns, median | / B |\n|---|---|---|---|\n",
        super::ROUNDS,
        SYMBOLS[0].calls
    );
    let mut rows = serde_json::Map::new();
    for (i, name) in SETUPS.iter().enumerate().take(setups) {
        let (ns, add) = (super::median(&mut o.ns[i].clone()), added(i));
        let ratio = if i == 0 { 0.0 } else { add / added(1) };
        md += &format!("| {name} | {ns:.0} | {add:.0} | {ratio:.2} |\n");
        rows.insert((*name).into(), serde_json::json!({"ns_per_call": o.ns[i], "added_ns_median": add, "ratio_to_floor": ratio}));
    }
    Ok((
        serde_json::json!({"rounds": super::ROUNDS, "setups": rows}),
        md,
    ))
}
