//! cudatrace: per-process CUDA driver call tracing with eBPF uprobes on libcuda.
mod attach;
mod caps;
mod discover;
mod events;
mod gputime;
mod identity;
mod kernels;
mod memory;
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
        /// A libcuda to attach (repeatable); without it, every libcuda in use or installed.
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
            Command::Trace { libs, pid, comm, cgroup, json, duration, ringbuf_mib, rescan_ms } => {
                let duration = match duration {
                    Some(d) if !(d > 0.0 && d.is_finite()) => {
                        anyhow::bail!("--duration {d}: give a positive number of seconds")
                    }
                    d => d.map(Duration::from_secs_f64),
                };
                if rescan_ms == 0 {
                    anyhow::bail!("--rescan-ms 0: give a period of at least 1 ms");
                }
                let opts = trace::TraceOptions {
                    libs,
                    pid,
                    comm,
                    cgroup,
                    json,
                    duration,
                    ringbuf_bytes: ringbuf_mib << 20,
                    rescan: Duration::from_millis(rescan_ms),
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
