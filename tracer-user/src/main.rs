//! cudatrace: per-process CUDA driver call tracing with eBPF uprobes on libcuda.
//!
//! The flow, one folder a stage: `probe` (discover, resolve, load, attach) -> `pipeline` (ring
//! buffer, decode, enrich) -> `registry` (every per-process table) -> `aggregate` -> `detect` ->
//! `alert` -> `sinks` (stdout, Alertmanager, webhook, metrics). `cmd` holds one file per command;
//! this file only parses and dispatches.
mod aggregate;
mod alert;
mod cli;
mod cmd;
mod config;
mod detect;
mod nvml;
mod pipeline;
mod probe;
mod registry;
mod sinks;

use std::process::ExitCode;

use clap::Parser as _;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cudatrace: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            cli::Command::Trace(args) => cmd::trace::run(args).await,
            cli::Command::Run(args) => cmd::run::run(args).await,
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
