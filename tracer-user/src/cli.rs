//! The command line: commands, their options, and the checks of single values.
use std::{
    net::SocketAddr,
    path::PathBuf,
    time::{Duration, SystemTime},
};

use clap::{Parser, Subcommand};

pub use review::ReviewArgs;

use crate::{
    config,
    logging::LogFormat,
    pipeline::{SessionOptions, Tuning},
    probe::ebpf_log::LogLevel,
    probe::filter::FilterOptions,
    probe::run_as::RunAs,
};

mod review;

/// Per-process CUDA driver call tracing with eBPF.
#[derive(Parser)]
#[command(name = "cudatrace", version, about)]
pub struct Cli {
    /// How stderr lines are written: `text` (the message) or `json` (one object a line with
    /// ts, level, event, msg and the event's fields).
    #[arg(
        long,
        global = true,
        value_enum,
        default_value_t = LogFormat::Text,
        env = "CUDATRACE_LOG_FORMAT",
        value_name = "FORMAT"
    )]
    pub log_format: LogFormat,
    /// The command.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Subcommand)]
pub enum Command {
    /// Stream every traced driver call until Ctrl-C or --duration, then print a summary.
    Trace(TraceArgs),
    /// The daemon: aggregate every call, sample NVML, and serve Prometheus metrics.
    Run(RunArgs),
    /// Write a timeline of every call (Trace Event JSON, for ui.perfetto.dev or chrome://tracing).
    Record(RecordArgs),
    /// GPUs and processes on one screen, refreshed every second (-b: plain-text snapshots).
    Top(TopArgs),
    /// List the incident archive's resolved alerts, newest first, with their root causes.
    Incidents(IncidentsArgs),
    /// Per incident (live daemon or archive): what rose, the causal chain, who, what to do.
    Explain(ExplainArgs),
    /// The alert-effectiveness review of the archive (--since 30d, the default; 7d weekly): per
    /// alert, cause and workload, how often, at which tier, time to resolve, flapping, unnamed;
    /// who acted (--alertmanager), what to change (--prometheus), one page (--html).
    Review(ReviewArgs),
    /// Replay cudatrace_signal_value from Prometheus through the detector: the alerts a config
    /// would have raised over that range.
    Backtest(BacktestArgs),
    /// Make `[state] dir`'s baselines/ the daemon's own (the chart's init container, CAP_CHOWN).
    PrepareState(PrepareStateArgs),
    /// Count every exported cu* function a process calls for a while (count-only probes): what
    /// a workload really calls, and which of it cudatrace does not trace.
    Census(CensusArgs),
    /// A dry run for a new node: every probe site of each libcuda, how this kernel would run it
    /// (emulated, stepped out of line, refused) and the known-bad kernel rows that apply.
    Sites(SitesArgs),
    /// List the probe-harm breakers kept in `[state] dir`, or clear one after a fix.
    Breaker(BreakerArgs),
    /// The separate privileged process that caps aggressors' cgroups for `[mitigate]`.
    Actuator(ActuatorArgs),
}

/// Options of `cudatrace actuator`.
#[derive(clap::Args)]
pub struct ActuatorArgs {
    /// The socket cudatrace's `mitigate.actuator` names.
    #[arg(
        long,
        value_name = "PATH",
        default_value = "/run/cudatrace/actuator.sock"
    )]
    pub socket: PathBuf,
    /// The journal of held caps (undone at the next start if this process is killed).
    #[arg(
        long,
        value_name = "FILE",
        default_value = "/var/lib/cudatrace/actuator.json"
    )]
    pub journal: PathBuf,
    /// A uid whose connections are served (repeatable; default only 65534, cudatrace's own uid
    /// after it drops root: give the daemon's `run_as` if it is another, and 0 only for a
    /// daemon run with --keep-uid); the peer must also run this cudatrace executable.
    #[arg(long = "allow-uid", value_name = "UID")]
    pub allow_uid: Vec<u32>,
    /// Another executable whose processes are served (repeatable; default only this one).
    #[arg(long = "allow-exe", value_name = "PATH")]
    pub allow_exe: Vec<PathBuf>,
}

/// Options of `cudatrace breaker`.
#[derive(clap::Args)]
pub struct BreakerArgs {
    /// The `run` config whose `[state] dir` holds the breakers.
    #[arg(long, value_name = "FILE")]
    pub config: PathBuf,
    /// Close the breaker of this library (its path as the breaker lists it).
    #[arg(long, value_name = "LIBRARY", conflicts_with = "clear_all")]
    pub clear: Option<String>,
    /// Close every breaker.
    #[arg(long)]
    pub clear_all: bool,
}

/// Options of `cudatrace sites`.
#[derive(clap::Args)]
pub struct SitesArgs {
    /// The libcuda to read (repeatable); without it, the host loader's.
    #[arg(long, value_name = "PATH")]
    pub lib: Vec<PathBuf>,
    /// Classify as `run` would with --allow-stepped-probes.
    #[arg(long = "allow-stepped-probes")]
    pub allow_stepped_probes: bool,
    /// One JSON object a line, per site, instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Options of `cudatrace census`.
#[derive(clap::Args)]
pub struct CensusArgs {
    /// How long to count (30s, 2m, or seconds).
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_span)]
    pub duration: Duration,
    /// Count this process only (and probe the libcuda it maps, unless --lib names one).
    #[arg(long, value_name = "PID")]
    pub pid: Option<u32>,
    /// The libcuda to probe (repeatable); without it, --pid's, else the host loader's.
    #[arg(long, value_name = "PATH")]
    pub lib: Vec<PathBuf>,
    /// One JSON object a line, per symbol, instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Options of `cudatrace backtest`.
#[derive(clap::Args)]
pub struct BacktestArgs {
    /// The Prometheus server (http or https URL) holding cudatrace_signal_value.
    #[arg(long, value_name = "URL")]
    pub prometheus: String,
    /// Start of the range (RFC 3339, UTC: 2026-11-01T00:00:00Z).
    #[arg(long, value_name = "RFC3339", value_parser = parse_time)]
    pub from: SystemTime,
    /// End of the range (RFC 3339, UTC).
    #[arg(long, value_name = "RFC3339", value_parser = parse_time)]
    pub to: SystemTime,
    /// Seconds between windows (default: the config's detect.window_s).
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub step: Option<u64>,
    /// The `run` config whose [detect] settings to replay (default: the defaults).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Only these series: a selector of cudatrace_signal_value (`{workload="serving/llm/server"}`).
    #[arg(long = "match", value_name = "SELECTOR")]
    pub selector: Option<String>,
}

/// Options of `cudatrace prepare-state`.
#[derive(clap::Args)]
pub struct PrepareStateArgs {
    /// The `run` config whose `[state] dir` and `run_as` to use.
    #[arg(long, value_name = "FILE")]
    pub config: PathBuf,
}

/// Options of `cudatrace incidents`.
#[derive(clap::Args)]
pub struct IncidentsArgs {
    /// The archive file (else the one `--config` names).
    #[arg(long, value_name = "PATH")]
    pub archive: Option<PathBuf>,
    /// The `run` config file whose `[alerts] archive` to read.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Only incidents that ended within this long (e.g. 1h, 30m, 2d).
    #[arg(long, value_name = "DURATION", value_parser = parse_since)]
    pub since: Option<Duration>,
    /// The archived objects, one JSON a line, instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Options of `cudatrace explain`.
#[derive(clap::Args)]
pub struct ExplainArgs {
    /// The live daemon's metrics address (http URL) whose pending and firing alerts to explain
    /// (default, when no archive is named: http://127.0.0.1:9464).
    #[arg(long, value_name = "URL")]
    pub daemon: Option<String>,
    /// A CA certificate (PEM) to trust for an https --daemon (the chart's metrics server with a
    /// web config), instead of the public roots.
    #[arg(long, value_name = "FILE")]
    pub ca_file: Option<PathBuf>,
    /// The user of the daemon's basic auth (its web config's `basic_auth_users`).
    #[arg(long, value_name = "NAME", requires = "password_file")]
    pub user: Option<String>,
    /// A file holding that user's password (never on the command line, which `ps` shows).
    #[arg(long, value_name = "FILE", requires = "user")]
    pub password_file: Option<PathBuf>,
    /// The archive, the time range and the output, as `incidents` takes them.
    #[command(flatten)]
    pub from: IncidentsArgs,
}

/// Options of `cudatrace top`.
#[derive(clap::Args)]
pub struct TopArgs {
    /// What to attach and which processes to keep.
    #[command(flatten)]
    pub sel: Selection,
    /// Print plain-text snapshots one after the other, for scripts and bug reports.
    #[arg(short = 'b', long)]
    pub batch: bool,
    /// Stop after this many snapshots.
    #[arg(short = 'n', long = "iterations", value_name = "COUNT", value_parser = clap::value_parser!(u64).range(1..))]
    pub count: Option<u64>,
    /// Seconds between snapshots.
    #[arg(short = 'd', long = "delay", value_name = "SECS", default_value = "1", value_parser = parse_duration)]
    pub delay: Duration,
    /// The `run` config file (thresholds, launch sampling, limits).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// NVML library to load instead of the loader's libnvidia-ml.so.1.
    #[arg(long, value_name = "PATH")]
    pub nvml_lib: Option<PathBuf>,
}

/// Options of `cudatrace record`.
#[derive(clap::Args)]
pub struct RecordArgs {
    /// What to attach and which processes to keep.
    #[command(flatten)]
    pub sel: Selection,
    /// The timeline file (gzip when it ends in .gz).
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: PathBuf,
    /// Stop after this many seconds.
    #[arg(long, value_name = "SECS", value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Write at most this many events; the rest are counted, and the file says so.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_events: Option<u64>,
    /// NVML library to load instead of the loader's libnvidia-ml.so.1 (GPU counters).
    #[arg(long, value_name = "PATH")]
    pub nvml_lib: Option<PathBuf>,
    /// Without --lib: how often to look for libcuda files that processes map later.
    #[arg(long, default_value_t = 250, value_name = "MS", value_parser = parse_rescan)]
    pub rescan_ms: u64,
    /// Ring-buffer size in MiB (a power of two).
    #[arg(long, default_value_t = 8, value_name = "MIB", value_parser = parse_ringbuf)]
    pub ringbuf_mib: u32,
}

/// Options of `cudatrace trace`.
#[derive(clap::Args)]
pub struct TraceArgs {
    /// What to attach and which processes to keep.
    #[command(flatten)]
    pub sel: Selection,
    /// Without --lib: how often to look for libcuda files that processes map later.
    #[arg(long, default_value_t = 250, value_name = "MS", value_parser = parse_rescan)]
    pub rescan_ms: u64,
    /// One JSON object a line instead of a table.
    #[arg(long)]
    pub json: bool,
    /// With --json, include each process's command line (it may hold tokens and passwords).
    #[arg(long)]
    pub cmdline: bool,
    /// Stop after this many seconds.
    #[arg(long, value_name = "SECS", value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Ring-buffer size in MiB (a power of two).
    #[arg(long, default_value_t = 8, value_name = "MIB", value_parser = parse_ringbuf)]
    pub ringbuf_mib: u32,
}

/// Options of `cudatrace run`.
#[derive(clap::Args)]
pub struct RunArgs {
    /// What to attach and which processes to keep.
    #[command(flatten)]
    pub sel: Selection,
    /// Address of the metrics server (default 127.0.0.1:9464, or the config file's).
    #[arg(long, value_name = "ADDR:PORT")]
    pub listen: Option<SocketAddr>,
    /// TOML config file (see README).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// NVML library to load instead of the loader's libnvidia-ml.so.1.
    #[arg(long, value_name = "PATH")]
    pub nvml_lib: Option<PathBuf>,
    /// TLS and basic auth for the metrics server, in the Prometheus exporter-toolkit's web
    /// config format (tls_server_config, basic_auth_users).
    #[arg(long, value_name = "FILE")]
    pub web_config_file: Option<PathBuf>,
    /// Send alerts to this Alertmanager (API v2), e.g. http://alertmanager:9093.
    #[arg(long, value_name = "URL")]
    pub alertmanager: Option<String>,
    /// POST each alert record (the stdout JSON line) to this URL.
    #[arg(long, value_name = "URL")]
    pub webhook: Option<String>,
    /// Stop after this many seconds.
    #[arg(long, value_name = "SECS", value_parser = parse_duration)]
    pub duration: Option<Duration>,
}

/// How discovery finds libraries mapped after start.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DiscoveryMode {
    /// The kernel names the processes to read.
    Events,
    /// Every process's maps, every rescan.
    Poll,
}

/// Trace options shared by every command: what to attach and which processes to keep.
#[derive(clap::Args)]
pub struct Selection {
    /// A libcuda to attach (repeatable); without it, every libcuda in use or installed, and
    /// those mapped later.
    #[arg(long = "lib", value_name = "PATH")]
    pub libs: Vec<PathBuf>,
    /// Trace only this process.
    #[arg(long)]
    pub pid: Option<u32>,
    /// Trace only threads with this name (as in /proc/PID/comm), filtered in the kernel.
    #[arg(long)]
    pub comm: Option<String>,
    /// Trace only processes in this cgroup v2 directory, filtered in the kernel.
    #[arg(long, value_name = "DIR")]
    pub cgroup: Option<PathBuf>,
    /// Attach only the host's library files this glob names (repeatable), matched by device
    /// and inode: e.g. /usr/lib/x86_64-linux-gnu/libcuda.so.* locks a node to the driver's own.
    #[arg(long = "lib-allow", value_name = "GLOB")]
    pub lib_allow: Vec<String>,
    /// Attach probe sites the kernel single-steps out of line even on a kernel known to harm
    /// a process that way (see docs/security.md, "Do no harm").
    #[arg(long = "allow-stepped-probes")]
    pub allow_stepped_probes: bool,
    /// How libraries mapped later are found, without --lib: events (the kernel names the
    /// process that opened a libcuda; polling where it cannot) or poll (every process's maps
    /// every --rescan-ms).
    #[arg(long, value_enum, default_value_t = DiscoveryMode::Events, value_name = "HOW")]
    pub discovery: DiscoveryMode,
    /// What the eBPF programs report on stderr: rare conditions at warn, process exits too at
    /// debug.
    #[arg(long, value_enum, default_value_t = LogLevel::Warn, value_name = "LEVEL")]
    pub log_level: LogLevel,
    /// Started as root, switch to this uid (and gid, UID:GID) once the privileges are checked,
    /// before anything of another user is read (default 65534, or the config's run_as).
    #[arg(long, value_name = "UID[:GID]", value_parser = parse_run_as, conflicts_with = "keep_uid")]
    pub run_as: Option<RunAs>,
    /// Stay uid 0 (with the capabilities reduced as always).
    #[arg(long)]
    pub keep_uid: bool,
}

impl Selection {
    /// The session these options select, with the command's own settings.
    pub fn session(self, t: Tuning) -> SessionOptions {
        let mut lib_allow = self.lib_allow;
        lib_allow.extend(t.lib_allow);
        SessionOptions {
            filter: FilterOptions {
                pid: self.pid,
                comm: self.comm,
                cgroup: self.cgroup,
            },
            libs: self.libs,
            duration: t.duration,
            ringbuf_bytes: t.ringbuf_mib << 20,
            log_level: self.log_level,
            rescan: Duration::from_millis(t.rescan_ms),
            poll_discovery: self.discovery == DiscoveryMode::Poll,
            limits: t.limits,
            cmdline: t.cmdline,
            max_libraries: t.max_libraries,
            lib_allow,
            allow_stepped_probes: self.allow_stepped_probes,
            state_dir: t.state_dir,
            sampling: t.sampling,
            run_as: if self.keep_uid {
                None
            } else {
                self.run_as.or(t.run_as)
            },
        }
    }
}

fn parse_run_as(s: &str) -> Result<RunAs, String> {
    let id = |t: &str| {
        t.parse::<u32>()
            .map_err(|_| format!("{t:?} is not a numeric id: give UID or UID:GID, e.g. 65534"))
    };
    let (uid, gid) = match s.split_once(':') {
        Some((u, g)) => (id(u)?, id(g)?),
        None => (id(s)?, id(s)?),
    };
    if uid == 0 {
        return Err(
            "uid 0 is where it starts: give an unprivileged uid, or pass --keep-uid".into(),
        );
    }
    Ok(RunAs { uid, gid })
}

fn parse_ringbuf(s: &str) -> Result<u32, String> {
    let mib: u32 = s
        .parse()
        .map_err(|_| format!("{s} is not a number of MiB"))?;
    config::check_ringbuf_mib(mib)
        .map(|()| mib)
        .map_err(|e| format!("{e} MiB"))
}

fn parse_rescan(s: &str) -> Result<u64, String> {
    let ms: u64 = s
        .parse()
        .map_err(|_| format!("{s} is not a number of milliseconds"))?;
    config::check_rescan_ms(ms).map(|()| ms)
}

fn parse_since(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|_| format!("{s}: give a duration such as 30m, 1h or 2d"))
}

/// A duration of up to a day: seconds, or with a unit (30s, 2m).
fn parse_span(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s).or_else(|_| {
        humantime::parse_duration(s).map_err(|_| format!("{s}: give a duration such as 30s or 2m"))
    })?;
    if d.is_zero() || d > Duration::from_secs(86_400) {
        return Err(format!("{s}: give a duration above 0 and at most a day"));
    }
    Ok(d)
}

fn parse_time(s: &str) -> Result<SystemTime, String> {
    humantime::parse_rfc3339_weak(s)
        .map_err(|_| format!("{s}: give a UTC time in RFC 3339, such as 2026-11-01T00:00:00Z"))
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    match s.parse::<f64>() {
        Ok(d) if d > 0.0 && d.is_finite() && d < 1e12 => Ok(Duration::from_secs_f64(d)),
        _ => Err(format!("{s}: give a positive number of seconds")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_values_are_checked() {
        assert_eq!(parse_ringbuf("16"), Ok(16));
        assert_eq!(
            parse_ringbuf("3").unwrap_err(),
            "3: a power of two up to 1024 MiB"
        );
        assert_eq!(
            parse_rescan("0").unwrap_err(),
            "0: give a period of at least 1 ms"
        );
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(
            parse_duration("-1").unwrap_err(),
            "-1: give a positive number of seconds"
        );
    }
}
