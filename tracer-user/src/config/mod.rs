//! The `cudatrace run` config file (TOML). Unknown keys and out-of-range values are errors that
//! say which key and what is allowed.
use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
};

use serde::Deserialize;

mod detect;
mod entries;
mod error;
pub mod mitigate;
pub mod otlp;
pub mod period;
pub mod quiet;
pub mod schedule;
pub mod state;
pub mod workloads;

pub use detect::DetectConfig;
pub use error::ConfigError;

/// What parsing and checking a config answers.
pub type Result<T> = std::result::Result<T, ConfigError>;

/// Settings of `cudatrace run`; every key is optional.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Address of the metrics server.
    pub listen: SocketAddr,
    /// NVML library to load instead of the loader's `libnvidia-ml.so.1`.
    pub nvml_library: Option<PathBuf>,
    /// TLS and basic auth for the metrics server (exporter-toolkit web config format).
    pub web_config_file: Option<PathBuf>,
    /// How often to sample NVML, in milliseconds.
    pub nvml_period_ms: u64,
    /// Kernels per process with their own `kernel` label (the rest are "other").
    pub top_kernels: usize,
    /// Kernels per process tracked at all.
    pub max_kernels: usize,
    /// Ring-buffer size in MiB (a power of two).
    pub ringbuf_mib: u32,
    /// Records a process may write per second, counted in the kernel (0: no limit): past it its
    /// calls are left out and counted as `reason="rate_limit"`, so one process cannot fill the
    /// ring buffer for all. Its metrics then count only what got through.
    pub record_rate_limit: u32,
    /// How often to look for newly mapped libcuda files, in milliseconds.
    pub rescan_ms: u64,
    /// How long an exited process's series stay in the metrics, in seconds.
    pub retain_exited_s: u64,
    /// Processes held at most (the longest-exited, else longest-idle, are dropped past it).
    pub max_processes: usize,
    /// Distinct library files attached at most (each costs descriptors and probes); more are
    /// refused and counted.
    pub max_libraries: usize,
    /// Largest library file read, MiB (a tenant's huge or sparse file is refused unread).
    pub max_library_mib: u64,
    /// Globs of the host's library files that may be attached (`--lib-allow` adds to them).
    pub lib_allow: Vec<String>,
    /// The uid cudatrace started as root switches to once its privileges are checked
    /// (`--keep-uid` stays root; `--run-as` overrides this).
    pub run_as: u32,
    /// The gid it switches to (default: `run_as`).
    pub run_as_gid: Option<u32>,
    /// Contention detection: baselines, thresholds and debouncing.
    pub detect: DetectConfig,
    /// Where alerts go besides stdout and the metrics.
    pub alerts: AlertConfig,
    /// Pod names from the Kubernetes API.
    pub kubernetes: KubernetesConfig,
    /// Launches counted in the kernel, and which of them are written as records.
    pub launches: LaunchesConfig,
    /// `[[workloads]]`: names for workloads, by globs on who a process is.
    pub workloads: Vec<workloads::WorkloadEntry>,
    /// `[state]`: where baselines outlive processes and restarts.
    pub state: state::StateConfig,
    /// `[otlp]`: slow and failed calls as OpenTelemetry spans.
    pub otlp: otlp::OtlpConfig,
    /// `[mitigate]`: automatic degradation on page-tier verdicts (off by default).
    pub mitigate: mitigate::MitigateConfig,
}

/// The `[launches]` table: launches are counted in the kernel (counts, errors, latency buckets
/// per process and kernel, exact), and only some are written to the ring buffer.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LaunchesConfig {
    /// Count launches in the kernel (false: one record per launch, as `trace` does).
    pub aggregate: bool,
    /// Launches of each process each second that are all written.
    pub sample_first_per_second: u32,
    /// Past those, one launch in this many is written (0: none).
    pub sample_one_in: u32,
    /// Launches at least this slow are always written, microseconds (0: none).
    pub slow_us: u32,
    /// Cells of the in-kernel launch map one process may make (one per kernel, entry point and
    /// latency bucket); past them its launches are counted in one cell per entry point.
    pub cells_per_process: u32,
}

impl Default for LaunchesConfig {
    fn default() -> Self {
        LaunchesConfig {
            aggregate: true,
            sample_first_per_second: 10,
            sample_one_in: 100,
            slow_us: 1000,
            cells_per_process: tracer_common::launches::DEFAULT_CELLS_PER_PROCESS,
        }
    }
}

/// Which launches reach the ring buffer when they are counted in-kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sampling {
    /// Launches of each process each second that are all written.
    pub first_per_second: u32,
    /// Past those, one launch in this many is written (0: none).
    pub one_in: u32,
    /// Launches at least this slow (µs) are always written (0: none).
    pub slow_us: u32,
    /// Cells of the launch map one process may make (0: no quota).
    pub cells_per_process: u32,
}

impl LaunchesConfig {
    /// What the kernel is told (`None`: every launch written).
    pub fn sampling(&self) -> Option<Sampling> {
        self.aggregate.then_some(Sampling {
            first_per_second: self.sample_first_per_second,
            one_in: self.sample_one_in,
            slow_us: self.slow_us,
            cells_per_process: self.cells_per_process,
        })
    }
}

/// The `[alerts]` table: sinks for alert state changes.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AlertConfig {
    /// Alertmanager base URL (`http://host:9093`): alerts are posted to its API v2.
    pub alertmanager_url: Option<String>,
    /// URL that receives each alert record (the stdout JSON) as a POST.
    pub webhook_url: Option<String>,
    /// How often firing alerts are sent to Alertmanager again, seconds (0: 60).
    pub resend_s: u64,
    /// Seconds the webhook waits after an incident's first change for its other victims, then
    /// POSTs them as one body (0: each change as it is).
    pub webhook_group_s: u64,
    /// CA certificates (PEM) https sinks may chain to, besides the public roots.
    pub ca_file: Option<PathBuf>,
    /// JSON-lines file every resolved alert is appended to (`cudatrace incidents` lists it).
    pub archive: Option<PathBuf>,
    /// Size of the archive past which it is rotated to `ARCHIVE.1`, MiB (0: 64).
    pub archive_max_mib: u64,
    /// `[[alerts.quiet]]`: quiet periods, whose alerts are recorded but not sent.
    pub quiet: Vec<quiet::QuietEntry>,
    /// Credentials sent to Alertmanager.
    pub alertmanager_auth: SinkAuth,
    /// Credentials sent to the webhook.
    pub webhook_auth: SinkAuth,
    /// Send credentials over plain `http://` sink URLs too (off: a sink with credentials must
    /// be `https://`, so that a password or token never crosses the network in the clear).
    pub insecure_http_credentials: bool,
}

impl AlertConfig {
    /// Refuses credentials bound for a plain `http://` sink, unless
    /// `insecure_http_credentials` allows them. Checked at load and again once the command
    /// line's `--alertmanager` and `--webhook` are in.
    pub fn check_credentials(&self) -> Result<()> {
        if self.insecure_http_credentials {
            return Ok(());
        }
        for (key, url, auth) in [
            (
                "alertmanager_auth",
                &self.alertmanager_url,
                &self.alertmanager_auth,
            ),
            ("webhook_auth", &self.webhook_url, &self.webhook_auth),
        ] {
            let Some(url) = url else { continue };
            if auth.is_set() && !url.to_ascii_lowercase().starts_with("https://") {
                return Err(ConfigError::invalid(
                    format!("alerts.{key}"),
                    format!(
                        "alerts.{key}: credentials for {url:?} would be sent in the clear: give an \
                         https URL, or set alerts.insecure_http_credentials = true"
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// `[alerts.alertmanager_auth]`, `[alerts.webhook_auth]`: what a sink sends in `Authorization`,
/// from files (Kubernetes Secrets), read at each POST so that rotated secrets are used.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SinkAuth {
    /// Basic auth user name (with `password_file`).
    pub username: Option<String>,
    /// File holding the basic auth password.
    pub password_file: Option<PathBuf>,
    /// File holding a bearer token (instead of basic auth).
    pub bearer_token_file: Option<PathBuf>,
}

impl SinkAuth {
    /// Whether it sends credentials at all.
    pub fn is_set(&self) -> bool {
        self.username.is_some() || self.bearer_token_file.is_some()
    }

    fn validate(&self, key: &str) -> Result<()> {
        match (&self.username, &self.password_file, &self.bearer_token_file) {
            (None, None, None) | (Some(_), Some(_), None) | (None, None, Some(_)) => Ok(()),
            (_, _, Some(_)) => Err(ConfigError::invalid(
                format!("alerts.{key}"),
                format!(
                    "alerts.{key}: give username and password_file, or bearer_token_file, not both"
                ),
            )),
            _ => Err(ConfigError::invalid(
                format!("alerts.{key}"),
                format!("alerts.{key}: give both username and password_file"),
            )),
        }
    }
}

/// The `[kubernetes]` table: where namespace, pod and container names come from.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct KubernetesConfig {
    /// Resolve names (default: when in a cluster, or `pods_url` is set).
    pub pod_names: Option<bool>,
    /// An HTTPS URL serving the node's `PodList` (default: the in-cluster API server's pods
    /// with `spec.nodeName` = `$NODE_NAME`; the kubelet's `https://NODE:10250/pods` also works).
    pub pods_url: Option<String>,
    /// The bearer token, read anew at each fetch.
    pub token_file: PathBuf,
    /// The CA certificates (PEM) the server's certificate must chain to.
    pub ca_file: PathBuf,
    /// Seconds between fetches of the pod list.
    pub refresh_s: u64,
}

impl Default for KubernetesConfig {
    fn default() -> Self {
        KubernetesConfig {
            pod_names: None,
            pods_url: None,
            token_file: "/var/run/secrets/kubernetes.io/serviceaccount/token".into(),
            ca_file: "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt".into(),
            refresh_s: 30,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: "127.0.0.1:9464".parse().expect("valid"),
            nvml_library: None,
            web_config_file: None,
            nvml_period_ms: 1000,
            top_kernels: 20,
            max_kernels: 500,
            ringbuf_mib: 8,
            record_rate_limit: 0,
            rescan_ms: 250,
            retain_exited_s: 120,
            max_processes: 1024,
            max_libraries: 32,
            max_library_mib: 2048,
            lib_allow: Vec::new(),
            run_as: 65534,
            run_as_gid: None,
            detect: DetectConfig::default(),
            alerts: AlertConfig::default(),
            kubernetes: KubernetesConfig::default(),
            launches: LaunchesConfig::default(),
            workloads: Vec::new(),
            state: state::StateConfig::default(),
            otlp: otlp::OtlpConfig::default(),
            mitigate: mitigate::MitigateConfig::default(),
        }
    }
}

impl Config {
    /// Parses and validates a config file's text.
    pub fn parse(text: &str) -> Result<Config> {
        let c: Config =
            toml::from_str(text).map_err(|e| ConfigError::Syntax(e.message().to_owned()))?;
        if c.nvml_period_ms < 10 {
            return Err(ConfigError::invalid(
                "nvml_period_ms",
                format!(
                    "nvml_period_ms = {}: sample at most every 10 ms",
                    c.nvml_period_ms
                ),
            ));
        }
        if c.top_kernels == 0 || c.top_kernels > c.max_kernels {
            return Err(ConfigError::invalid(
                "top_kernels",
                format!(
                    "top_kernels = {}: give 1 to max_kernels ({})",
                    c.top_kernels, c.max_kernels
                ),
            ));
        }
        check_ringbuf_mib(c.ringbuf_mib)
            .map_err(|e| ConfigError::invalid("ringbuf_mib", format!("ringbuf_mib = {e}")))?;
        if c.run_as == 0 {
            return Err(ConfigError::invalid(
                "run_as",
                "run_as = 0: give the unprivileged uid to switch to (65534 by default), or pass \
                 --keep-uid to stay root"
                    .to_string(),
            ));
        }
        if c.max_libraries == 0 {
            return Err(ConfigError::invalid(
                "max_libraries",
                "max_libraries = 0: give at least 1".to_string(),
            ));
        }
        if c.max_library_mib == 0 || c.max_library_mib > 64 * 1024 {
            return Err(ConfigError::invalid(
                "max_library_mib",
                format!(
                    "max_library_mib = {}: give 1 to 65536 (NVIDIA's libcuda is under 100)",
                    c.max_library_mib
                ),
            ));
        }
        if c.max_processes == 0 {
            return Err(ConfigError::invalid(
                "max_processes",
                "max_processes = 0: give at least 1".to_string(),
            ));
        }
        check_rescan_ms(c.rescan_ms)
            .map_err(|e| ConfigError::invalid("rescan_ms", format!("rescan_ms = {e}")))?;
        if c.launches.sample_one_in > 1_000_000 {
            return Err(ConfigError::invalid(
                "launches.sample_one_in",
                format!(
                    "launches.sample_one_in = {}: give 0 (none) to 1000000",
                    c.launches.sample_one_in
                ),
            ));
        }
        if c.launches.slow_us > 60_000_000 {
            return Err(ConfigError::invalid(
                "launches.slow_us",
                format!(
                    "launches.slow_us = {}: give 0 (none) to 60000000 (a minute)",
                    c.launches.slow_us
                ),
            ));
        }
        let most = tracer_common::launches::MAX_LAUNCH_CELLS;
        if !(1..=most).contains(&c.launches.cells_per_process) {
            return Err(ConfigError::invalid(
                "launches.cells_per_process",
                format!(
                    "launches.cells_per_process = {}: give 1 to {most} (the launch map's size)",
                    c.launches.cells_per_process
                ),
            ));
        }
        c.detect.validate()?;
        schedule::validate(&c.detect)?;
        quiet::validate(&c.alerts.quiet)?;
        workloads::validate(&c.workloads)?;
        c.state.validate()?;
        c.mitigate.validate()?;
        for (key, url) in [
            ("alertmanager_url", &c.alerts.alertmanager_url),
            ("webhook_url", &c.alerts.webhook_url),
        ] {
            if let Some(url) = url {
                check_url(url).map_err(|e| {
                    ConfigError::invalid(
                        format!("alerts.{key}"),
                        format!("alerts.{key} = {url:?}: {e}"),
                    )
                })?;
            }
        }
        if c.alerts.webhook_group_s > 3600 {
            return Err(ConfigError::invalid(
                "alerts.webhook_group_s",
                format!(
                    "alerts.webhook_group_s = {}: give 0 (each change as it is) to 3600 seconds",
                    c.alerts.webhook_group_s
                ),
            ));
        }
        c.alerts.alertmanager_auth.validate("alertmanager_auth")?;
        c.alerts.webhook_auth.validate("webhook_auth")?;
        c.alerts.check_credentials()?;
        if c.kubernetes.refresh_s < 5 {
            return Err(ConfigError::invalid(
                "kubernetes.refresh_s",
                format!(
                    "kubernetes.refresh_s = {}: give at least 5 seconds",
                    c.kubernetes.refresh_s
                ),
            ));
        }
        let https = |url: &str| {
            url.parse::<http::Uri>().is_ok_and(|u| {
                u.scheme_str() == Some("https") && u.host().is_some_and(|h| !h.is_empty())
            })
        };
        if let Some(url) = c.kubernetes.pods_url.as_deref().filter(|u| !https(u)) {
            return Err(ConfigError::invalid("kubernetes.pods_url", format!("kubernetes.pods_url = {url:?}: give an https URL (the token is never sent in the clear)")));
        }
        Ok(c)
    }

    /// Reads a config file; errors name the file.
    pub fn load(path: &Path) -> Result<Config> {
        let text = std::fs::read_to_string(path).map_err(|why| ConfigError::Read {
            path: path.to_owned(),
            why,
        })?;
        Config::parse(&text).map_err(|e| ConfigError::In {
            path: path.to_owned(),
            error: Box::new(e),
        })
    }
}

/// Checks a ring-buffer size in MiB (the config key and `--ringbuf-mib`); the error starts
/// with the value.
pub fn check_ringbuf_mib(mib: u32) -> std::result::Result<(), String> {
    if !mib.is_power_of_two() || mib > 1024 {
        return Err(format!("{mib}: a power of two up to 1024"));
    }
    Ok(())
}

/// Checks a rescan period in ms (the config key and `--rescan-ms`); the error starts with the
/// value.
pub fn check_rescan_ms(ms: u64) -> std::result::Result<(), String> {
    if ms == 0 {
        return Err("0: give a period of at least 1 ms".into());
    }
    Ok(())
}

/// Checks that a sink URL is http or https with a host.
pub fn check_url(url: &str) -> std::result::Result<(), String> {
    let uri: http::Uri = url
        .parse()
        .map_err(|_| "not a URL: give http[s]://HOST[:PORT][/PATH]".to_owned())?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return Err("not an http or https URL: give http[s]://HOST[:PORT][/PATH]".into());
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err("the URL has no host".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests;
