//! What a session is asked to trace, and how: [`SessionOptions`], made from the command line's
//! selection and a command's [`Tuning`] (`cli::Selection::session`).
use std::{path::PathBuf, time::Duration};

use crate::{
    config::{Config, Sampling},
    probe::{ebpf_log::LogLevel, filter::FilterOptions, run_as::RunAs},
    registry::RegistryLimits,
};

/// What to trace and how, for every command.
pub struct SessionOptions {
    /// Libraries to attach; discovered (and watched for) when empty.
    pub libs: Vec<PathBuf>,
    /// Only this process, and threads and cgroups as the filter says.
    pub filter: FilterOptions,
    /// Stop after this long.
    pub duration: Option<Duration>,
    /// Ring-buffer size in bytes.
    pub ringbuf_bytes: u32,
    /// What the eBPF programs report on stderr.
    pub log_level: LogLevel,
    /// How often to look for newly mapped libcuda files, without `--lib`, when polling.
    pub rescan: Duration,
    /// Poll every process's maps even where the kernel can name the processes to read.
    pub poll_discovery: bool,
    /// What the process registry keeps.
    pub limits: RegistryLimits,
    /// Whether identities keep the command line (`trace --cmdline`; it may hold secrets).
    pub cmdline: bool,
    /// Distinct library files attached at most.
    pub max_libraries: usize,
    /// `--lib-allow` globs: only the host's files they name are attached (none: any).
    pub lib_allow: Vec<String>,
    /// `--allow-stepped-probes`: attach stepped sites on a known-bad kernel too.
    pub allow_stepped_probes: bool,
    /// `[state] dir`, where the probe-harm breaker is kept.
    pub state_dir: Option<PathBuf>,
    /// Launches counted in-kernel, and which are written (`run`); `None`: every launch is
    /// written (`trace`).
    pub sampling: Option<Sampling>,
    /// The ids a session started as root switches to once its privileges are checked (`None`:
    /// it stays root, `--keep-uid`).
    pub run_as: Option<RunAs>,
}

/// Processes `trace` and `record` hold at most (identity, kernel names, memory, streams); an
/// exited one is released at once.
pub const TRACER_MAX_PROCESSES: usize = 4096;
/// Distinct library files `trace` and `record` attach at most (as `run`'s default).
pub const TRACER_MAX_LIBRARIES: usize = 32;

/// What a command sets of its session besides the selection (`cli::Selection`), by name.
pub struct Tuning {
    /// Stop after this long.
    pub duration: Option<Duration>,
    /// Ring-buffer size, MiB.
    pub ringbuf_mib: u32,
    /// How often to look for newly mapped libraries, ms.
    pub rescan_ms: u64,
    /// What the process registry keeps.
    pub limits: RegistryLimits,
    /// Whether identities keep the command line.
    pub cmdline: bool,
    /// Distinct library files attached at most.
    pub max_libraries: usize,
    /// Globs of the host's library files allowed, besides the command line's.
    pub lib_allow: Vec<String>,
    /// Launches counted in-kernel (`None`: every launch written).
    pub sampling: Option<Sampling>,
    /// The ids to leave uid 0 for (`None`: stay).
    pub run_as: Option<RunAs>,
    /// `[state] dir`, where the probe-harm breaker is kept (`None`: in memory only).
    pub state_dir: Option<PathBuf>,
}

impl Tuning {
    /// `run` and `top`: everything from the config file; launches counted in-kernel.
    pub fn daemon(cfg: &Config, duration: Option<Duration>) -> Tuning {
        Tuning {
            duration,
            ringbuf_mib: cfg.ringbuf_mib,
            rescan_ms: cfg.rescan_ms,
            limits: RegistryLimits {
                max_processes: cfg.max_processes,
                retain_exited: Duration::from_secs(cfg.retain_exited_s),
            },
            cmdline: false,
            max_libraries: cfg.max_libraries,
            lib_allow: cfg.lib_allow.clone(),
            sampling: cfg.launches.sampling(),
            run_as: Some(RunAs {
                uid: cfg.run_as,
                gid: cfg.run_as_gid.unwrap_or(cfg.run_as),
            }),
            state_dir: cfg.state.dir.clone(),
        }
    }

    /// `trace` and `record`: bounded tables, an exited process released at once, every launch
    /// written.
    pub fn tracer(duration: Option<Duration>, ringbuf_mib: u32, rescan_ms: u64) -> Tuning {
        Tuning {
            duration,
            ringbuf_mib,
            rescan_ms,
            limits: RegistryLimits {
                max_processes: TRACER_MAX_PROCESSES,
                retain_exited: Duration::ZERO,
            },
            cmdline: false,
            max_libraries: TRACER_MAX_LIBRARIES,
            lib_allow: Vec::new(),
            sampling: None,
            run_as: Some(RunAs::default()),
            state_dir: None,
        }
    }
}
