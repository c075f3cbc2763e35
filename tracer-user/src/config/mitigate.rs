//! The `[mitigate]` table: automatic degradation, the answer of the top tier (P99 +50%, `page`)
//! that is a machine's, not a person's. Off by default; when on, a dry run unless told
//! otherwise. Its primary form is a webhook to the victim's platform (shed load, fall back, move
//! the aggressor); beside it, the CPU caps cudatrace would put on preemptible aggressors.
use serde::Deserialize;

use super::{check_url, ConfigError, Result};

/// The `[mitigate]` table.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct MitigateConfig {
    /// Whether page-tier verdicts are acted on at all (default false).
    pub enabled: bool,
    /// Say what would be done, do nothing to any workload (default true).
    pub dry_run: bool,
    /// The victim's platform: told of every page-tier verdict and of its end, with the planned
    /// actions (none: only the log says).
    pub webhook: Option<String>,
    /// Globs on the workload (`namespace/owner/container`, `EXE:comm`...) of the aggressors
    /// that may be capped; a CPU preemptor named only by its cgroup matches as `cgroup:PATH`.
    /// Empty: nobody may be.
    pub preemptible: Vec<String>,
    /// The `cpu.max` a capped aggressor's cgroup gets: `QUOTA PERIOD` in µs (default
    /// `"20000 100000"`: a fifth of a CPU).
    pub cpu_max: String,
    /// Seconds a cap is held at most (default 600).
    pub max_hold_s: u64,
    /// Seconds between two actions on one workload (default 300): no flapping cap.
    pub min_interval_s: u64,
    /// The socket of `cudatrace actuator`, which takes the caps when `dry_run = false`.
    pub actuator: Option<std::path::PathBuf>,
}

impl Default for MitigateConfig {
    fn default() -> MitigateConfig {
        MitigateConfig {
            enabled: false,
            dry_run: true,
            webhook: None,
            preemptible: Vec::new(),
            cpu_max: "20000 100000".into(),
            max_hold_s: 600,
            min_interval_s: 300,
            actuator: None,
        }
    }
}

impl MitigateConfig {
    /// Checks the table: one line naming the key at fault and what to give.
    pub fn validate(&self) -> Result<()> {
        let bad =
            |key: &str, msg: String| Err(ConfigError::invalid(format!("mitigate.{key}"), msg));
        if let Some(url) = &self.webhook {
            if let Err(e) = check_url(url) {
                return bad("webhook", format!("mitigate.webhook = {url:?}: {e}"));
            }
        }
        for g in &self.preemptible {
            if glob::Pattern::new(g).is_err() {
                return bad(
                    "preemptible",
                    format!(
                        "mitigate.preemptible: {g:?} is not a glob: give globs on workload names"
                    ),
                );
            }
        }
        let parts: Vec<&str> = self.cpu_max.split_whitespace().collect();
        let quota_ok = |q: &str| q.parse::<u64>().is_ok_and(|q| q >= 1000);
        let period_ok = |p: &str| {
            p.parse::<u64>()
                .is_ok_and(|p| (1000..=1_000_000).contains(&p))
        };
        if !(parts.len() == 2 && quota_ok(parts[0]) && period_ok(parts[1])) {
            return bad(
                "cpu_max",
                format!(
                    "mitigate.cpu_max = {:?}: give \"QUOTA PERIOD\" in microseconds (quota at least 1000, period 1000 to 1000000), as cgroup v2's cpu.max",
                    self.cpu_max
                ),
            );
        }
        if !(1..=86_400).contains(&self.max_hold_s) {
            return bad(
                "max_hold_s",
                format!(
                    "mitigate.max_hold_s = {}: give 1 to 86400 seconds",
                    self.max_hold_s
                ),
            );
        }
        if self.min_interval_s > 86_400 {
            return bad(
                "min_interval_s",
                format!(
                    "mitigate.min_interval_s = {}: give 0 to 86400 seconds",
                    self.min_interval_s
                ),
            );
        }
        if let Some(a) = self.actuator.as_ref().filter(|a| !a.is_absolute()) {
            return bad(
                "actuator",
                format!(
                    "mitigate.actuator = {:?}: give the absolute path of `cudatrace actuator`'s socket",
                    a.display()
                ),
            );
        }
        if self.enabled && !self.dry_run && self.actuator.is_none() {
            return bad(
                "dry_run",
                "mitigate.dry_run = false needs mitigate.actuator, the socket of `cudatrace actuator` (the separate process that writes cgroups): set it, or dry_run = true".into(),
            );
        }
        Ok(())
    }
}
