//! `cargo xtask demo`: `cudatrace trace` of the bundled workload, then `cudatrace top -b` while
//! a "trainer" slows a "model-server" on one simulated GPU, until the contention alert shows on
//! the model server's row.
use std::{
    io::BufRead as _,
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

use crate::{build, run as run_cmd, target_dir};

/// Detection fast enough for a demo: 1 s windows, a baseline after 5, firing after 3 s.
const FAST_DETECTION: &str = "[detect]\nwindow_s = 1\nwarmup_windows = 5\npending_windows = 2\nfiring_after_s = 3\nresolve_after_s = 5\n";

/// Runs the demo.
pub fn run() -> Result<()> {
    let standin = build()?;
    let cudatrace = target_dir().join("release/cudatrace");
    trace(&cudatrace, &standin)?;
    top(&cudatrace, &standin)
}

/// The trace part: every entry point of the stand-in, called twice.
fn trace(cudatrace: &Path, standin: &Path) -> Result<()> {
    let lib = standin.join("libcuda.so.1");
    let mut tracer = Command::new(cudatrace)
        .args(["trace", "--lib"])
        .arg(&lib)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start {}", cudatrace.display()))?;
    let stderr = tracer.stderr.take().expect("piped");
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(stderr));
    loop {
        match lines.next() {
            Some(Ok(line)) => {
                eprintln!("{line}");
                if line.starts_with("ready:") {
                    break;
                }
            }
            _ => {
                let status = tracer.wait()?;
                bail!("cudatrace exited before it was ready ({status})");
            }
        }
    }
    run_cmd(
        Command::new(standin.join("cuda-workload"))
            .arg("--lib")
            .arg(&lib)
            .args(["each", "2"]),
    )?;
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(tracer.id() as i32, libc::SIGINT) };
    for line in lines.map_while(Result::ok) {
        eprintln!("{line}");
    }
    let status = tracer.wait()?;
    if !status.success() {
        bail!("cudatrace failed: {status}");
    }
    Ok(())
}

/// The top part: a model server alone for 8 s, then a trainer on the same simulated GPU; `top -b`
/// every second until the model server's row shows the alert (or 40 snapshots).
fn top(cudatrace: &Path, standin: &Path) -> Result<()> {
    let dir = target_dir().join("demo");
    std::fs::create_dir_all(&dir)?;
    let config = dir.join("fast-detection.toml");
    std::fs::write(&config, FAST_DETECTION)?;
    // The workload under the names the screen shows.
    for name in ["model-server", "trainer"] {
        let link = dir.join(name);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(standin.join("cuda-workload"), &link)?;
    }
    let lib = standin.join("libcuda.so.1");
    eprintln!(
        "\n== cudatrace top -b: a model server alone, then a trainer on the same simulated GPU =="
    );
    let mut top = Command::new(cudatrace)
        .args(["top", "-b", "-n", "40", "-d", "1", "--config"])
        .arg(&config)
        .arg("--lib")
        .arg(&lib)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("cannot start {}", cudatrace.display()))?;
    let out = top.stdout.take().expect("piped");
    let device = dir.join("device");
    let job = |name: &str, seconds: &str, ns_per_block: &str, grid: &str, sync_every: &str| {
        Command::new(dir.join(name))
            .arg("--lib")
            .arg(&lib)
            .args(["loop", seconds, grid, sync_every])
            .env("CUDA_STANDIN_DEVICE", &device)
            .env("CUDA_STANDIN_NS_PER_BLOCK", ns_per_block)
            .env("CUDA_VISIBLE_DEVICES", "0")
            .stdout(Stdio::null())
            .spawn()
    };
    std::thread::sleep(Duration::from_secs(1));
    let mut server = job("model-server", "40", "1000", "1000", "1")?;
    let started = Instant::now();
    let mut trainer = None;
    let mut fired = false;
    for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
        println!("{line}");
        if trainer.is_none() && started.elapsed() >= Duration::from_secs(8) {
            trainer = Some(job("trainer", "30", "1000", "4000", "2")?);
        }
        if line.contains("model-server") && line.contains("firing:") {
            fired = true;
            break;
        }
    }
    // SAFETY: plain kill(2) of the processes this demo started.
    unsafe {
        libc::kill(top.id() as i32, libc::SIGINT);
        libc::kill(server.id() as i32, libc::SIGKILL);
        if let Some(t) = &trainer {
            libc::kill(t.id() as i32, libc::SIGKILL);
        }
    }
    let _ = (
        server.wait(),
        trainer.as_mut().map(|t| t.wait()),
        top.wait(),
    );
    if !fired {
        bail!("the contention alert did not show on the model server's row");
    }
    eprintln!("== the model server's row shows the alert, naming the trainer ==");
    Ok(())
}
