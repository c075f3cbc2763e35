//! The `cudatrace run` config file (TOML). Unknown keys and out-of-range values are errors that
//! say which key and what is allowed.
use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
};

use anyhow::{bail, Result};
use serde::Deserialize;

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
    /// Contention detection: baselines, thresholds and debouncing.
    pub detect: DetectConfig,
    /// Where alerts go besides stdout and the metrics.
    pub alerts: AlertConfig,
    /// Pod names from the Kubernetes API.
    pub kubernetes: KubernetesConfig,
    /// Launches counted in the kernel, and which of them are written as records.
    pub launches: LaunchesConfig,
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
}

impl Default for LaunchesConfig {
    fn default() -> Self {
        LaunchesConfig {
            aggregate: true,
            sample_first_per_second: 10,
            sample_one_in: 100,
            slow_us: 1000,
        }
    }
}

impl LaunchesConfig {
    /// What the kernel is told (`None`: every launch written).
    pub fn sampling(&self) -> Option<crate::probe::kernel_maps::Sampling> {
        self.aggregate
            .then_some(crate::probe::kernel_maps::Sampling {
                first_per_second: self.sample_first_per_second,
                one_in: self.sample_one_in,
                slow_us: self.slow_us,
            })
    }
}

/// The `[detect]` table: how baselines are learned and when a window breaches.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DetectConfig {
    /// Length of one evaluation window, seconds.
    pub window_s: u64,
    /// Windows a series is learned for before it can breach.
    pub warmup_windows: usize,
    /// Holt level smoothing (alpha), 0 to 1.
    pub level_smoothing: f64,
    /// Holt trend smoothing (beta), 0 to 1.
    pub trend_smoothing: f64,
    /// Trend damping per window (phi), 0 to 1.
    pub trend_damping: f64,
    /// EWMA weight of the newest squared forecast error, 0 to 1.
    pub spread_smoothing: f64,
    /// Lowest spread as a fraction of the baseline.
    pub min_spread_ratio: f64,
    /// Windows the Hampel filter compares a new value with.
    pub hampel_windows: usize,
    /// Deviations (MAD-estimated) beyond which a window is an outlier.
    pub hampel_k: f64,
    /// Warning when a window exceeds the baseline p99 by this fraction.
    pub warning: f64,
    /// Critical past this fraction over the baseline p99.
    pub critical: f64,
    /// Page past this fraction over the baseline p99.
    pub page: f64,
    /// Consecutive breaching windows before an alert is pending.
    pub pending_windows: u32,
    /// Seconds a breach lasts (from its first window) before a pending alert fires.
    pub firing_after_s: u64,
    /// Seconds without a breaching window before a firing alert resolves.
    pub resolve_after_s: u64,
    /// Calls a window needs (launches, or synchronous copies) for its value to count.
    pub min_samples: u64,
    /// Smallest rise over the baseline p99 that breaches, in microseconds (per launch, per wait
    /// per launch, per copy): keeps jitter of fast calls from alerting.
    pub min_increase_us: f64,
    /// After an alert has fired this long, breaching windows are learned: the new normal.
    pub rebaseline_after_s: u64,
    /// Device memory used over total (NVML) at or above which a GPU is under memory pressure.
    pub memory_pressure_ratio: f64,
    /// NVML utilization (percent) below which a GPU counts as idle.
    pub idle_gpu_percent: u32,
    /// Alert on slowdowns with no cause seen (`CudatraceSlowdown`): the process's own work
    /// changed, or something untraced shares its GPU.
    pub report_unexplained: bool,
    /// `[[detect.schedule]]`: periods with other tiers and debounce times (first match wins).
    pub schedule: Vec<crate::policy::schedule::ScheduleEntry>,
}

impl Default for DetectConfig {
    fn default() -> Self {
        DetectConfig {
            window_s: 5,
            warmup_windows: 6,
            level_smoothing: 0.1,
            trend_smoothing: 0.02,
            trend_damping: 0.9,
            spread_smoothing: 0.1,
            min_spread_ratio: 0.02,
            hampel_windows: 9,
            hampel_k: 3.0,
            warning: 0.10,
            critical: 0.30,
            page: 0.50,
            pending_windows: 3,
            firing_after_s: 30,
            resolve_after_s: 60,
            min_samples: 10,
            min_increase_us: 10.0,
            rebaseline_after_s: 1800,
            memory_pressure_ratio: 0.95,
            idle_gpu_percent: 10,
            report_unexplained: true,
            schedule: Vec::new(),
        }
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
    pub quiet: Vec<crate::policy::quiet::QuietEntry>,
    /// Credentials sent to Alertmanager.
    pub alertmanager_auth: SinkAuth,
    /// Credentials sent to the webhook.
    pub webhook_auth: SinkAuth,
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
    fn validate(&self, key: &str) -> Result<()> {
        match (&self.username, &self.password_file, &self.bearer_token_file) {
            (None, None, None) | (Some(_), Some(_), None) | (None, None, Some(_)) => Ok(()),
            (_, _, Some(_)) => bail!(
                "alerts.{key}: give username and password_file, or bearer_token_file, not both"
            ),
            _ => bail!("alerts.{key}: give both username and password_file"),
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
            detect: DetectConfig::default(),
            alerts: AlertConfig::default(),
            kubernetes: KubernetesConfig::default(),
            launches: LaunchesConfig::default(),
        }
    }
}

impl Config {
    /// Parses and validates a config file's text.
    pub fn parse(text: &str) -> Result<Config> {
        let c: Config = toml::from_str(text).map_err(|e| anyhow::anyhow!("{}", e.message()))?;
        if c.nvml_period_ms < 10 {
            bail!(
                "nvml_period_ms = {}: sample at most every 10 ms",
                c.nvml_period_ms
            );
        }
        if c.top_kernels == 0 || c.top_kernels > c.max_kernels {
            bail!(
                "top_kernels = {}: give 1 to max_kernels ({})",
                c.top_kernels,
                c.max_kernels
            );
        }
        check_ringbuf_mib(c.ringbuf_mib).map_err(|e| anyhow::anyhow!("ringbuf_mib = {e}"))?;
        if c.max_libraries == 0 {
            bail!("max_libraries = 0: give at least 1");
        }
        if c.max_library_mib == 0 || c.max_library_mib > 64 * 1024 {
            bail!(
                "max_library_mib = {}: give 1 to 65536 (NVIDIA's libcuda is under 100)",
                c.max_library_mib
            );
        }
        if c.max_processes == 0 {
            bail!("max_processes = 0: give at least 1");
        }
        check_rescan_ms(c.rescan_ms).map_err(|e| anyhow::anyhow!("rescan_ms = {e}"))?;
        if c.launches.sample_one_in > 1_000_000 {
            bail!(
                "launches.sample_one_in = {}: give 0 (none) to 1000000",
                c.launches.sample_one_in
            );
        }
        if c.launches.slow_us > 60_000_000 {
            bail!(
                "launches.slow_us = {}: give 0 (none) to 60000000 (a minute)",
                c.launches.slow_us
            );
        }
        c.detect.validate()?;
        crate::policy::schedule::validate(&c.detect)?;
        crate::policy::quiet::validate(&c.alerts.quiet)?;
        for (key, url) in [
            ("alertmanager_url", &c.alerts.alertmanager_url),
            ("webhook_url", &c.alerts.webhook_url),
        ] {
            if let Some(url) = url {
                check_url(url).map_err(|e| anyhow::anyhow!("alerts.{key} = {url:?}: {e}"))?;
            }
        }
        if c.alerts.webhook_group_s > 3600 {
            bail!(
                "alerts.webhook_group_s = {}: give 0 (each change as it is) to 3600 seconds",
                c.alerts.webhook_group_s
            );
        }
        c.alerts.alertmanager_auth.validate("alertmanager_auth")?;
        c.alerts.webhook_auth.validate("webhook_auth")?;
        if c.kubernetes.refresh_s < 5 {
            bail!(
                "kubernetes.refresh_s = {}: give at least 5 seconds",
                c.kubernetes.refresh_s
            );
        }
        let https = |url: &str| {
            url.parse::<http::Uri>().is_ok_and(|u| {
                u.scheme_str() == Some("https") && u.host().is_some_and(|h| !h.is_empty())
            })
        };
        if let Some(url) = c.kubernetes.pods_url.as_deref().filter(|u| !https(u)) {
            bail!("kubernetes.pods_url = {url:?}: give an https URL (the token is never sent in the clear)");
        }
        Ok(c)
    }

    /// Reads a config file; errors name the file.
    pub fn load(path: &Path) -> Result<Config> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("bad config {}: cannot read it ({e})", path.display()))?;
        Config::parse(&text).map_err(|e| anyhow::anyhow!("bad config {}: {e}", path.display()))
    }
}

impl DetectConfig {
    /// Checks the table's values (a schedule entry's, once over them, too).
    pub(crate) fn validate(&self) -> Result<()> {
        let d = self;
        if d.window_s == 0 {
            bail!("detect.window_s = 0: give at least 1 second");
        }
        if d.warmup_windows < 3 {
            bail!(
                "detect.warmup_windows = {}: give at least 3",
                d.warmup_windows
            );
        }
        for (key, v) in [
            ("level_smoothing", d.level_smoothing),
            ("trend_smoothing", d.trend_smoothing),
            ("spread_smoothing", d.spread_smoothing),
        ] {
            if !(v > 0.0 && v <= 1.0) {
                bail!("detect.{key} = {v}: give a weight above 0 and at most 1");
            }
        }
        if !(0.0..=1.0).contains(&d.trend_damping) {
            bail!(
                "detect.trend_damping = {}: give 0 (no trend) to 1 (undamped)",
                d.trend_damping
            );
        }
        if !(0.0..1.0).contains(&d.min_spread_ratio) {
            bail!(
                "detect.min_spread_ratio = {}: give 0 to below 1",
                d.min_spread_ratio
            );
        }
        if d.hampel_windows < 3 {
            bail!(
                "detect.hampel_windows = {}: give at least 3",
                d.hampel_windows
            );
        }
        if d.hampel_k.is_nan() || d.hampel_k <= 0.0 {
            bail!(
                "detect.hampel_k = {}: give a positive number of deviations",
                d.hampel_k
            );
        }
        if !(d.warning > 0.0 && d.warning < d.critical && d.critical < d.page) {
            bail!(
                "detect thresholds warning = {}, critical = {}, page = {}: give fractions over the baseline p99 with 0 < warning < critical < page",
                d.warning,
                d.critical,
                d.page
            );
        }
        if d.pending_windows == 0 {
            bail!("detect.pending_windows = 0: give at least 1");
        }
        if d.resolve_after_s < d.window_s {
            bail!(
                "detect.resolve_after_s = {}: give at least one window ({} s)",
                d.resolve_after_s,
                d.window_s
            );
        }
        if d.min_samples == 0 {
            bail!("detect.min_samples = 0: give at least 1");
        }
        if d.min_increase_us.is_nan() || d.min_increase_us < 0.0 {
            bail!(
                "detect.min_increase_us = {}: give 0 or more microseconds",
                d.min_increase_us
            );
        }
        if !(d.memory_pressure_ratio > 0.0 && d.memory_pressure_ratio <= 1.0) {
            bail!(
                "detect.memory_pressure_ratio = {}: give a fraction above 0 and at most 1",
                d.memory_pressure_ratio
            );
        }
        if d.idle_gpu_percent > 100 {
            bail!(
                "detect.idle_gpu_percent = {}: give a percentage",
                d.idle_gpu_percent
            );
        }
        Ok(())
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
mod tests {
    use super::*;

    #[test]
    fn defaults_and_overrides() {
        assert_eq!(Config::parse("").unwrap(), Config::default());
        let c = Config::parse("listen = \"0.0.0.0:9000\"\ntop_kernels = 5\n").unwrap();
        assert_eq!((c.listen.port(), c.top_kernels), (9000, 5));
    }

    #[test]
    fn bad_values_say_what_is_wrong() {
        assert!(Config::parse("colour = 1")
            .unwrap_err()
            .to_string()
            .contains("unknown field `colour`"));
        assert!(Config::parse("listen = \"nowhere\"").is_err());
        assert_eq!(
            Config::parse("top_kernels = 0").unwrap_err().to_string(),
            "top_kernels = 0: give 1 to max_kernels (500)"
        );
        assert_eq!(
            Config::parse("ringbuf_mib = 3").unwrap_err().to_string(),
            "ringbuf_mib = 3: a power of two up to 1024"
        );
        assert_eq!(
            Config::parse("[detect]\nwarning = 0.4\n").unwrap_err().to_string(),
            "detect thresholds warning = 0.4, critical = 0.3, page = 0.5: give fractions over the baseline p99 with 0 < warning < critical < page"
        );
        assert!(Config::parse("[detect]\nwindow = 5\n")
            .unwrap_err()
            .to_string()
            .contains("unknown field `window`"));
        assert_eq!(
            Config::parse("[kubernetes]\npods_url = \"http://10.0.0.1:10255/pods\"\n").unwrap_err().to_string(),
            "kubernetes.pods_url = \"http://10.0.0.1:10255/pods\": give an https URL (the token is never sent in the clear)"
        );
        assert_eq!(
            Config::parse("[kubernetes]\nrefresh_s = 1\n")
                .unwrap_err()
                .to_string(),
            "kubernetes.refresh_s = 1: give at least 5 seconds"
        );
        assert_eq!(
            Config::parse("[alerts]\nwebhook_group_s = 86400\n")
                .unwrap_err()
                .to_string(),
            "alerts.webhook_group_s = 86400: give 0 (each change as it is) to 3600 seconds"
        );
        let k = Config::parse("[kubernetes]\npod_names = false\n")
            .unwrap()
            .kubernetes;
        assert_eq!((k.pod_names, k.refresh_s), (Some(false), 30));
        assert_eq!(
            Config::parse("[detect]\nresolve_after_s = 2\n")
                .unwrap_err()
                .to_string(),
            "detect.resolve_after_s = 2: give at least one window (5 s)"
        );
        assert_eq!(
            Config::parse("[alerts]\nwebhook_url = \"ftp://x/y\"\n").unwrap_err().to_string(),
            "alerts.webhook_url = \"ftp://x/y\": not an http or https URL: give http[s]://HOST[:PORT][/PATH]"
        );
        assert_eq!(
            Config::parse("[alerts.webhook_auth]\nusername = \"u\"\n")
                .unwrap_err()
                .to_string(),
            "alerts.webhook_auth: give both username and password_file"
        );
        assert_eq!(
            Config::parse("[alerts.alertmanager_auth]\nusername = \"u\"\npassword_file = \"p\"\nbearer_token_file = \"t\"\n").unwrap_err().to_string(),
            "alerts.alertmanager_auth: give username and password_file, or bearer_token_file, not both"
        );
        assert!(Config::parse("[detect]\nlevel_smoothing = 0\n")
            .unwrap_err()
            .to_string()
            .starts_with("detect.level_smoothing = 0:"));
    }

    #[test]
    fn detect_and_alert_tables() {
        let c = Config::parse("[detect]\nwindow_s = 10\npage = 0.8\n[alerts]\nalertmanager_url = \"http://127.0.0.1:9093\"\n").unwrap();
        assert_eq!(
            (c.detect.window_s, c.detect.page, c.detect.warning),
            (10, 0.8, 0.10)
        );
        assert_eq!(
            c.alerts.alertmanager_url.as_deref(),
            Some("http://127.0.0.1:9093")
        );
    }
}
