//! `cargo xtask fuzz`: every cargo-fuzz target in fuzz/ (the nightly, libFuzzer, AddressSanitizer)
//! for a while each. The targets reach tracer-user's parsers through its library, built without
//! the eBPF object (`CUDATRACE_SKIP_EBPF`). A crash stops the run with the input saved under
//! fuzz/artifacts/ (to become a regression test).
use std::{path::Path, process::Command, time::Instant};

use anyhow::{bail, Context as _, Result};

/// The targets, as fuzz/Cargo.toml names them.
pub const TARGETS: [&str; 7] = [
    "decode",
    "proc_maps",
    "proc_status",
    "config",
    "elf_symbols",
    "demangle",
    "pod_list",
];

/// Builds the targets and runs each for `seconds`; the builds go under `target_dir`/fuzz.
pub fn run(root: &Path, target_dir: &Path, seconds: u64) -> Result<()> {
    let fuzz_dir = target_dir.join("fuzz");
    // `cargo fuzz SUBCOMMAND -O [TARGET] --target-dir DIR [-- LIBFUZZER ARGS]`: the target dir
    // must come before `--`, or libFuzzer gets it and cargo builds in fuzz/target.
    let cargo_fuzz = |args: &[&str], libfuzzer: &[&str]| {
        let mut cmd = Command::new("cargo");
        cmd.current_dir(root.join("fuzz"))
            .args(["+nightly", "fuzz"])
            .args(args)
            .arg("--target-dir")
            .arg(&fuzz_dir)
            .env("CUDATRACE_SKIP_EBPF", "1")
            .env_remove("CARGO_TARGET_DIR");
        if !libfuzzer.is_empty() {
            cmd.arg("--").args(libfuzzer);
        }
        cmd
    };
    let status = cargo_fuzz(&["build", "-O"], &[])
        .status()
        .context("cannot run cargo fuzz: `cargo install cargo-fuzz` (scripts/setup.sh does)")?;
    if !status.success() {
        bail!("building the fuzz targets failed: {status}");
    }
    for target in TARGETS {
        let started = Instant::now();
        let out = cargo_fuzz(
            &["run", "-O", target],
            &[&format!("-max_total_time={seconds}"), "-rss_limit_mb=2048"],
        )
        .output()
        .with_context(|| format!("cannot run fuzz target {target}"))?;
        let log = String::from_utf8_lossy(&out.stderr);
        let done = log
            .lines()
            .rev()
            .find(|l| l.starts_with("Done "))
            .unwrap_or("(no summary)")
            .to_owned();
        eprintln!(
            "fuzz {target}: {done} ({:.0} s)",
            started.elapsed().as_secs_f64()
        );
        if !out.status.success() {
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            bail!(
                "fuzz target {target} failed ({}):\n{}",
                out.status,
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
    }
    Ok(())
}
