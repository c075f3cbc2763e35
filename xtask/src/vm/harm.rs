//! The guest's "do no harm" step, checked: the sites `cudatrace sites` found against the cross
//! objdump's reading of the same library, and the harm workload's counts under ten attach
//! cycles (no register or result mismatch, no abnormal exit, the code equal to the file after
//! every detach, breakpoints seen while attached).
use std::{collections::BTreeMap, path::Path, process::Command};

use anyhow::{Context as _, Result};
use serde_json::Value;

use super::checks::Outcome;
use crate::cross::Arch;

/// `(emulated, stepped, refused)` of the probed entry points of `lib` by the cross objdump's
/// mnemonic of their first instruction, on a kernel older than 6.13 (NOP stepped): branches,
/// `adr`/`adrp` emulated; PC-relative loads (`ldr` of a label) and exclusives refused; the rest
/// stepped. Independent of cudatrace's decoder.
pub fn objdump_sites(arch: Arch, lib: &Path) -> Result<(u64, u64, u64)> {
    let probed: Vec<&str> = tracer_common::Api::ALL.iter().map(|a| a.symbol()).collect();
    let (mut emulated, mut stepped, mut refused) = (0, 0, 0);
    let mut seen = std::collections::HashSet::new();
    for (addr, name, insn) in first_instructions(arch, lib)? {
        if !probed.contains(&name.as_str()) || !seen.insert(addr) {
            continue;
        }
        let mnemonic = insn.split_whitespace().next().unwrap_or("");
        let branch = matches!(
            mnemonic,
            "b" | "bl" | "cbz" | "cbnz" | "tbz" | "tbnz" | "adr" | "adrp" | "br" | "blr" | "ret"
        ) || mnemonic.starts_with("b.");
        let literal = (mnemonic.starts_with("ldr") || mnemonic == "prfm") && insn.contains('<');
        let exclusive = ["ldx", "stx", "lda", "stl"]
            .iter()
            .any(|p| mnemonic.starts_with(p));
        if branch {
            emulated += 1;
        } else if literal || exclusive {
            refused += 1;
        } else {
            stepped += 1;
        }
    }
    Ok((emulated, stepped, refused))
}

/// `(address, symbol, first instruction)` of every function of `lib`, as the cross objdump
/// (binutils of Debian's cross gcc) disassembles it.
pub fn first_instructions(arch: Arch, lib: &Path) -> Result<Vec<(String, String, String)>> {
    let out = Command::new(format!("{}-objdump", arch.gnu()))
        .args(["-d", "--no-show-raw-insn"])
        .arg(lib)
        .output()
        .context("the cross objdump (binutils of the cross gcc) is needed")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut found = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let Some((addr, name)) = line.strip_suffix(">:").and_then(|l| l.split_once(" <")) else {
            continue;
        };
        let insn = lines
            .next()
            .and_then(|l| l.split_once(":\t"))
            .map(|(_, i)| i.trim().replace('\t', " "))
            .unwrap_or_default();
        found.push((addr.to_owned(), name.to_owned(), insn));
    }
    Ok(found)
}

/// The `sites:` line of `cudatrace sites` equals the objdump's counts.
pub fn sites(text: Result<&str, String>, want: (u64, u64, u64)) -> Outcome {
    let text = text?;
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("sites: "))
        .ok_or_else(|| format!("no sites: line:\n{text}"))?;
    let n: Vec<u64> = line
        .split([' ', ','])
        .filter_map(|w| w.parse().ok())
        .collect();
    match n.as_slice() {
        [e, s, r, ..] if (*e, *s, *r) == want => Ok(format!(
            "{e} emulated, {s} stepped, {r} refused, as objdump reads them ({line})"
        )),
        _ => Err(format!(
            "cudatrace sites said {line:?}; objdump says {want:?}"
        )),
    }
}

/// `cudatrace_probe_sites` of step 2's scrape (the loader's library and the branch-protected
/// copy discovered) equals the objdump's counts of both.
pub fn metric(text: Result<&str, String>, want: (u64, u64)) -> Outcome {
    let samples = integration_tests::exposition::parse(text?);
    let path = |p: &str| {
        integration_tests::exposition::sum(
            &samples,
            "cudatrace_probe_sites",
            &[("arch", "aarch64"), ("path", p)],
        ) as u64
    };
    let got = (path("emulated"), path("stepped"));
    if got == want {
        Ok(format!(
            "cudatrace_probe_sites{{arch=\"aarch64\"}}: {} emulated, {} stepped, as objdump reads both libraries",
            got.0, got.1
        ))
    } else {
        Err(format!(
            "cudatrace_probe_sites said {got:?}; objdump says {want:?}"
        ))
    }
}

/// The summary's `key=value` pairs of each cycle.
fn cycles(text: &str) -> Vec<BTreeMap<String, u64>> {
    text.lines()
        .filter_map(|l| l.strip_prefix("summary: "))
        .map(|l| {
            l.split_whitespace()
                .filter_map(|kv| kv.split_once('='))
                .filter_map(|(k, v)| Some((k.to_owned(), v.parse().ok()?)))
                .collect()
        })
        .collect()
}

/// The harm workload's counts and the hits of each of its `want_cycles` attach cycles.
pub fn unharmed(
    report: Result<Value, String>,
    rc: Result<&str, String>,
    cycles_text: Result<&str, String>,
    want_cycles: i64,
) -> Outcome {
    let (r, rc, cyc) = (report?, rc?.trim().to_owned(), cycles(cycles_text?));
    let n = |k: &str| r[k].as_i64().unwrap_or(-1);
    let hits: Vec<i64> = cyc
        .iter()
        .map(|s| {
            let g = |k: &str| *s.get(k).unwrap_or(&0) as i64;
            g("events") - g("launch_samples") + g("launches_counted")
        })
        .collect();
    let ok = rc == "0"
        && n("mismatches") == 0
        && n("bad_results") == 0
        && n("abnormal") == 0
        && n("code_checks") == want_cycles
        && n("code_differ") == 0
        && n("control_differ") > 0
        && n("calls") > 0
        && n("remaps") >= 1
        && n("unmapped") == n("remaps")
        && hits.len() as i64 == want_cycles
        && hits.iter().all(|h| *h > 0);
    let said = format!(
        "{} checked calls ({} in {} forked children), {} probe hits in {} cycles {hits:?}, {} remaps, \
         {} SIGPROF; mismatches {}, bad results {}, abnormal exits {}; code bytes differing after \
         {} detaches {}, while attached {}",
        n("calls") + n("child_calls"),
        n("child_calls"),
        n("children"),
        hits.iter().sum::<i64>(),
        hits.len(),
        n("remaps"),
        n("signals"),
        n("mismatches"),
        n("bad_results"),
        n("abnormal"),
        n("code_checks"),
        n("code_differ"),
        n("control_differ"),
    );
    if ok {
        Ok(said)
    } else {
        Err(format!("exit {rc}: {said}; report {r}"))
    }
}

/// Step 4: the workload's own SIGSEGV is examined and left its own; the stand-in's fault past
/// `cuCtxSynchronize`'s entry is one harm (SIGILL), the breaker opens, and exactly one critical
/// `CudatraceProbeHarm` names that process.
pub fn breaker(
    own: Result<Value, String>,
    harmed: Result<Value, String>,
    err: Result<&str, String>,
    out: Result<&str, String>,
    metrics: Result<&str, String>,
) -> Outcome {
    let (own, harmed, err, out) = (own?["pid"].as_u64(), harmed?["pid"].as_u64(), err?, out?);
    let (Some(own), Some(harmed)) = (own, harmed) else {
        return Err("no pid in own.json or harmed.json".into());
    };
    let own_line = err
        .lines()
        .find(|l| l.contains(&format!("pid {own} (tid")) && l.contains("the workload's own"));
    let harm_line = err.lines().find(|l| {
        l.contains(&format!("probe harm: SIGILL in pid {harmed} "))
            && l.contains("bytes past the probed entry of cuCtxSynchronize")
    });
    let samples = integration_tests::exposition::parse(metrics?);
    let sum = |name: &str, with: &[(&str, &str)]| {
        integration_tests::exposition::sum(&samples, name, with)
    };
    let harms = sum("cudatrace_probe_harm_total", &[]);
    let that = sum(
        "cudatrace_probe_harm_total",
        &[("symbol", "cuCtxSynchronize"), ("signal", "SIGILL")],
    );
    let open = sum("cudatrace_probe_breaker_open", &[]);
    let alerts: Vec<Value> = out
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["alert"] == "CudatraceProbeHarm")
        .collect();
    let alert_ok = alerts.len() == 1
        && alerts[0]["victim"]["pid"].as_u64() == Some(harmed)
        && alerts[0]["severity"] == "critical";
    match (own_line, harm_line) {
        (Some(_), Some(line)) if harms == 1.0 && that == 1.0 && open == 1.0 && alert_ok => Ok(format!(
            "own SIGSEGV of {own} left its own; {line}; 1 CudatraceProbeHarm (critical) naming {harmed}"
        )),
        _ => Err(format!(
            "own line {own_line:?}, harm line {harm_line:?}, harms {harms}, of that {that}, breakers open {open}, \
             {} CudatraceProbeHarm: {alerts:?}",
            alerts.len()
        )),
    }
}
