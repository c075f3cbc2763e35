//! `cudatrace census`: counts every exported `cu*` function a process (or every process) calls
//! for a while, with count-only entry probes, and says which of them cudatrace does not trace.
use std::{collections::BTreeMap, io::Write as _, path::PathBuf};

use anyhow::{bail, Result};
use serde::Serialize;

use crate::{
    cli::CensusArgs,
    probe::{census::Census, discovery, proc_maps},
    text::printable,
};

/// One symbol's line.
#[derive(Serialize)]
struct Row<'a> {
    symbol: &'a str,
    calls: u64,
    processes: usize,
    traced: bool,
}

/// The libcuda files to probe: `--lib`, else those `--pid` maps, else the host loader's.
fn libraries(args: &CensusArgs) -> Result<Vec<PathBuf>> {
    if !args.lib.is_empty() {
        return Ok(args.lib.clone());
    }
    if let Some(pid) = args.pid {
        let maps = std::fs::File::open(format!("/proc/{pid}/maps")).map_err(|e| {
            anyhow::anyhow!("cannot read the maps of process {pid} ({e}): is it running?")
        })?;
        let libs: Vec<PathBuf> = proc_maps::libcuda_mappings(maps)
            .into_iter()
            .map(|m| PathBuf::from(format!("/proc/{pid}/root{}", m.path)))
            .collect();
        if libs.is_empty() {
            bail!("process {pid} maps no libcuda: name the library with --lib PATH");
        }
        return Ok(libs);
    }
    let libs = discovery::loader_libraries();
    if libs.is_empty() {
        bail!("no libcuda.so.1 in the loader's folders: name the library with --lib PATH");
    }
    Ok(libs)
}

/// Runs the command.
pub async fn run(args: CensusArgs) -> Result<()> {
    let libs = libraries(&args)?;
    // SIGTERM (a pod's stop, `timeout`) ends the count like Ctrl-C: what was counted is printed.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let census = Census::attach(&libs, args.pid)?;
    let shown: Vec<String> = libs
        .iter()
        .map(|l| printable(&l.display().to_string()).into_owned())
        .collect();
    log::info!(
        target: "cudatrace::ready",
        symbols = census.symbols.len(),
        attach = census.how;
        "ready: counting calls of {} exported cu* functions of {} for {:.0} s ({})",
        census.symbols.len(),
        shown.join(", "),
        args.duration.as_secs_f64(),
        census.how
    );
    tokio::select! {
        _ = tokio::time::sleep(args.duration) => {}
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    let mut by_symbol: BTreeMap<usize, (u64, std::collections::BTreeSet<u32>)> = BTreeMap::new();
    for c in census.counts()? {
        let e = by_symbol.entry(c.symbol).or_default();
        e.0 = e.0.saturating_add(c.calls);
        e.1.insert(c.pid);
    }
    let mut rows: Vec<Row> = by_symbol
        .iter()
        .map(|(i, (calls, pids))| Row {
            symbol: &census.symbols[*i].name,
            calls: *calls,
            processes: pids.len(),
            traced: census.symbols[*i].traced,
        })
        .collect();
    rows.sort_by(|a, b| b.calls.cmp(&a.calls).then(a.symbol.cmp(b.symbol)));
    let mut out = std::io::stdout().lock();
    if !args.json {
        writeln!(
            out,
            "{:>12} {:>9}  {:<10} SYMBOL",
            "CALLS", "PROCESSES", "TRACED"
        )?;
    }
    for r in &rows {
        if args.json {
            writeln!(out, "{}", serde_json::to_string(r)?)?;
        } else {
            let traced = if r.traced { "yes" } else { "NO" };
            writeln!(
                out,
                "{:>12} {:>9}  {traced:<10} {}",
                r.calls, r.processes, r.symbol
            )?;
        }
    }
    let untraced: Vec<&str> = rows
        .iter()
        .filter(|r| !r.traced)
        .map(|r| r.symbol)
        .collect();
    let processes: std::collections::BTreeSet<u32> = by_symbol
        .values()
        .flat_map(|(_, p)| p.iter().copied())
        .collect();
    log::info!(
        target: "cudatrace::census",
        called = rows.len(),
        untraced = untraced.len(),
        processes = processes.len();
        "census: {} of {} exported functions called by {} processes; {} of them not traced by cudatrace{}{}",
        rows.len(),
        census.symbols.len(),
        processes.len(),
        untraced.len(),
        if untraced.is_empty() { "" } else { ": " },
        untraced.join(", ")
    );
    Ok(())
}
