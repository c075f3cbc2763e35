//! cudatrace: per-process CUDA driver call tracing with eBPF uprobes on libcuda.
//!
//! The flow, one folder a stage: `probe` (discover, resolve, load, attach) -> `pipeline` (ring
//! buffer, decode, enrich) -> `registry` (every per-process table) -> `aggregate` -> `detect` ->
//! `alert` -> `sinks` (stdout, Alertmanager, webhook, metrics). `cmd` holds one file per command.
//! The binary (`main.rs`) only parses and dispatches; the library is what the fuzz targets
//! (`fuzz/`) reach the parsers through.
// Every stderr line goes through `log` (see `logging`), so that `--log-format json` holds.
#![deny(clippy::print_stderr)]

pub mod actuator;
pub mod aggregate;
pub mod alert;
pub mod backtest;
pub mod bounded;
pub mod cli;
pub mod cmd;
pub mod config;
pub mod detect;
pub mod enrich;
pub mod event;
pub mod hostcpu;
pub mod identity;
pub mod logging;
pub mod nvml;
pub mod pipeline;
pub mod policy;
pub mod probe;
pub mod registry;
pub mod sinks;
pub mod state;
pub mod text;
