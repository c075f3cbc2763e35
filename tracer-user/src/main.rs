//! cudatrace: per-process CUDA driver call tracing with eBPF uprobes on libcuda.
mod aggregate;
mod alert;
mod attach;
mod baseline;
mod caps;
mod classify;
mod config;
mod detect;
mod discover;
mod events;
mod export;
mod gputime;
mod identity;
mod kernels;
mod memory;
mod nvml;
mod output;
mod symbols;
mod trace;

use std::{path::PathBuf, process::ExitCode, time::Duration};

use clap::{Parser, Subcommand};

/// Per-process CUDA driver call tracing with eBPF.
#[derive(Parser)]
#[command(name = "cudatrace", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Stream every traced driver call until Ctrl-C or --duration, then print a summary.
    Trace {
        #[command(flatten)]
        sel: Selection,
        /// Without --lib: how often to look for libcuda files that processes map later.
        #[arg(long, default_value_t = 250, value_name = "MS")]
        rescan_ms: u64,
        /// One JSON object a line instead of a table.
        #[arg(long)]
        json: bool,
        /// Stop after this many seconds.
        #[arg(long, value_name = "SECS")]
        duration: Option<f64>,
        /// Ring-buffer size in MiB (a power of two).
        #[arg(long, default_value_t = 8, value_name = "MIB", value_parser = parse_ringbuf)]
        ringbuf_mib: u32,
    },
    /// The daemon: aggregate every call, sample NVML, and serve Prometheus metrics.
    Run {
        #[command(flatten)]
        sel: Selection,
        /// Address of the metrics server (default 127.0.0.1:9464, or the config file's).
        #[arg(long, value_name = "ADDR:PORT")]
        listen: Option<std::net::SocketAddr>,
        /// TOML config file (see README).
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// NVML library to load instead of the loader's libnvidia-ml.so.1.
        #[arg(long, value_name = "PATH")]
        nvml_lib: Option<PathBuf>,
        /// Send alerts to this Alertmanager (API v2), e.g. http://alertmanager:9093.
        #[arg(long, value_name = "URL")]
        alertmanager: Option<String>,
        /// POST each alert record (the stdout JSON line) to this URL.
        #[arg(long, value_name = "URL")]
        webhook: Option<String>,
        /// Stop after this many seconds.
        #[arg(long, value_name = "SECS")]
        duration: Option<f64>,
    },
}

fn duration_arg(d: Option<f64>) -> anyhow::Result<Option<Duration>> {
    match d {
        Some(d) if !(d > 0.0 && d.is_finite()) => anyhow::bail!("--duration {d}: give a positive number of seconds"),
        d => Ok(d.map(Duration::from_secs_f64)),
    }
}

/// Trace options shared by every command: what to attach and which processes to keep.
#[derive(clap::Args)]
struct Selection {
    /// A libcuda to attach (repeatable); without it, every libcuda in use or installed, and
    /// those mapped later.
    #[arg(long = "lib", value_name = "PATH")]
    libs: Vec<PathBuf>,
    /// Trace only this process.
    #[arg(long)]
    pid: Option<u32>,
    /// Trace only threads with this name (as in /proc/PID/comm), filtered in the kernel.
    #[arg(long)]
    comm: Option<String>,
    /// Trace only processes in this cgroup v2 directory, filtered in the kernel.
    #[arg(long, value_name = "DIR")]
    cgroup: Option<PathBuf>,
}

fn parse_ringbuf(s: &str) -> Result<u32, String> {
    let mib: u32 = s.parse().map_err(|_| format!("{s} is not a number of MiB"))?;
    if !mib.is_power_of_two() || mib > 1024 {
        return Err(format!("{mib} MiB: the ring buffer must be a power of two up to 1024 MiB"));
    }
    Ok(mib)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cudatrace: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Trace { sel, json, duration, ringbuf_mib, rescan_ms } => {
                if rescan_ms == 0 {
                    anyhow::bail!("--rescan-ms 0: give a period of at least 1 ms");
                }
                let opts = trace::TraceOptions {
                    libs: sel.libs,
                    pid: sel.pid,
                    comm: sel.comm,
                    cgroup: sel.cgroup,
                    mode: trace::Mode::Print { json },
                    duration: duration_arg(duration)?,
                    ringbuf_bytes: ringbuf_mib << 20,
                    rescan: Duration::from_millis(rescan_ms),
                };
                trace::run(opts).await
            }
            Command::Run { sel, listen, config, nvml_lib, duration, alertmanager, webhook } => {
                let mut cfg = match &config {
                    Some(path) => config::Config::load(path)?,
                    None => config::Config::default(),
                };
                if let Some(listen) = listen {
                    cfg.listen = listen;
                }
                if nvml_lib.is_some() {
                    cfg.nvml_library = nvml_lib;
                }
                for (flag, url, slot) in [
                    ("--alertmanager", alertmanager, &mut cfg.alerts.alertmanager_url),
                    ("--webhook", webhook, &mut cfg.alerts.webhook_url),
                ] {
                    if let Some(url) = url {
                        config::check_url(&url).map_err(|e| anyhow::anyhow!("{flag} {url}: {e}"))?;
                        *slot = Some(url);
                    }
                }
                let opts = trace::TraceOptions {
                    libs: sel.libs,
                    pid: sel.pid,
                    comm: sel.comm,
                    cgroup: sel.cgroup,
                    duration: duration_arg(duration)?,
                    ringbuf_bytes: cfg.ringbuf_mib << 20,
                    rescan: Duration::from_millis(cfg.rescan_ms),
                    mode: trace::Mode::Serve(Box::new(cfg)),
                };
                trace::run(opts).await
            }
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line: the outermost context and its causes.
            eprintln!("cudatrace: {e:#}");
            ExitCode::FAILURE
        }
    }
}
