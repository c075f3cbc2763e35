//! The `cudatrace run` config file (TOML). Unknown keys and out-of-range values are errors that
//! say which key and what is allowed.
use std::{net::SocketAddr, path::{Path, PathBuf}};

use anyhow::{Result, bail};
use serde::Deserialize;

/// Settings of `cudatrace run`; every key is optional.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Address of the metrics server.
    pub listen: SocketAddr,
    /// NVML library to load instead of the loader's `libnvidia-ml.so.1`.
    pub nvml_library: Option<PathBuf>,
    /// How often to sample NVML, in milliseconds.
    pub nvml_period_ms: u64,
    /// Kernels per process with their own `kernel` label (the rest are "other").
    pub top_kernels: usize,
    /// Kernels per process tracked at all.
    pub max_kernels: usize,
    /// Ring-buffer size in MiB (a power of two).
    pub ringbuf_mib: u32,
    /// How often to look for newly mapped libcuda files, in milliseconds.
    pub rescan_ms: u64,
    /// How long an exited process's series stay in the metrics, in seconds.
    pub retain_exited_s: u64,
    /// Processes held at most (the longest-exited, else longest-idle, are dropped past it).
    pub max_processes: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: "127.0.0.1:9464".parse().expect("valid"),
            nvml_library: None,
            nvml_period_ms: 1000,
            top_kernels: 20,
            max_kernels: 500,
            ringbuf_mib: 8,
            rescan_ms: 250,
            retain_exited_s: 120,
            max_processes: 1024,
        }
    }
}

impl Config {
    /// Parses and validates a config file's text.
    pub fn parse(text: &str) -> Result<Config> {
        let c: Config = toml::from_str(text).map_err(|e| anyhow::anyhow!("{}", e.message()))?;
        if c.nvml_period_ms < 10 {
            bail!("nvml_period_ms = {}: sample at most every 10 ms", c.nvml_period_ms);
        }
        if c.top_kernels == 0 || c.top_kernels > c.max_kernels {
            bail!("top_kernels = {}: give 1 to max_kernels ({})", c.top_kernels, c.max_kernels);
        }
        if !c.ringbuf_mib.is_power_of_two() || c.ringbuf_mib > 1024 {
            bail!("ringbuf_mib = {}: a power of two up to 1024", c.ringbuf_mib);
        }
        if c.max_processes == 0 {
            bail!("max_processes = 0: give at least 1");
        }
        if c.rescan_ms == 0 {
            bail!("rescan_ms = 0: give a period of at least 1 ms");
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
        assert!(Config::parse("colour = 1").unwrap_err().to_string().contains("unknown field `colour`"));
        assert!(Config::parse("listen = \"nowhere\"").is_err());
        assert_eq!(Config::parse("top_kernels = 0").unwrap_err().to_string(), "top_kernels = 0: give 1 to max_kernels (500)");
        assert_eq!(Config::parse("ringbuf_mib = 3").unwrap_err().to_string(), "ringbuf_mib = 3: a power of two up to 1024");
    }
}
