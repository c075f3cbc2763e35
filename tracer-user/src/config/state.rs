//! The `[state]` table (where per-workload baselines are saved) and the checks of `[detect]`'s
//! season and drift keys.
use std::path::PathBuf;

use serde::Deserialize;

use super::{ConfigError, DetectConfig, Result};

/// Most workloads a state file may hold.
pub const MOST_WORKLOADS: usize = 4096;

/// The `[state]` table: per-workload baselines, seasons and history saved across restarts.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct StateConfig {
    /// The directory (`DIR/baselines/baselines.json`); none: baselines live in memory only.
    pub dir: Option<PathBuf>,
    /// Seconds between saves (and one at stop).
    pub save_every_s: u64,
    /// Workloads kept; past it the longest unseen are dropped (said once).
    pub max_workloads: usize,
}

impl Default for StateConfig {
    fn default() -> Self {
        StateConfig {
            dir: None,
            save_every_s: 60,
            max_workloads: 256,
        }
    }
}

impl StateConfig {
    /// Checks the table's values.
    pub(crate) fn validate(&self) -> Result<()> {
        if !(1..=60).contains(&self.save_every_s) {
            return Err(ConfigError::invalid(
                "state.save_every_s",
                format!(
                    "state.save_every_s = {}: give 1 to 60 seconds",
                    self.save_every_s
                ),
            ));
        }
        if !(1..=MOST_WORKLOADS).contains(&self.max_workloads) {
            return Err(ConfigError::invalid(
                "state.max_workloads",
                format!(
                    "state.max_workloads = {}: give 1 to {MOST_WORKLOADS}",
                    self.max_workloads
                ),
            ));
        }
        if let Some(dir) = &self.dir {
            if !dir.is_absolute() {
                return Err(ConfigError::invalid(
                    "state.dir",
                    format!(
                        "state.dir = {:?}: give an absolute path",
                        dir.display().to_string()
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// Checks `[detect]`'s season, history and drift keys.
pub(crate) fn validate_memory(d: &DetectConfig) -> Result<()> {
    let bad = |key: &str, msg: String| Err(ConfigError::invalid(format!("detect.{key}"), msg));
    if d.season_bucket_s < d.window_s || d.season_bucket_s > 86_400 {
        return bad(
            "season_bucket_s",
            format!(
                "detect.season_bucket_s = {}: give one window ({} s) to 86400",
                d.season_bucket_s, d.window_s
            ),
        );
    }
    if d.season_s < d.season_bucket_s
        || !d.season_s.is_multiple_of(d.season_bucket_s)
        || d.season_s / d.season_bucket_s > 2016
        || d.season_s > 7 * 86_400
    {
        return bad(
            "season_s",
            format!(
                "detect.season_s = {}: give a whole number of season_bucket_s ({}), at most 2016 of them and at most a week (604800)",
                d.season_s, d.season_bucket_s
            ),
        );
    }
    if !(1..=31).contains(&d.season_history) {
        return bad(
            "season_history",
            format!(
                "detect.season_history = {}: give 1 to 31 seasons",
                d.season_history
            ),
        );
    }
    if !(1..=90).contains(&d.history_days) {
        return bad(
            "history_days",
            format!("detect.history_days = {}: give 1 to 90", d.history_days),
        );
    }
    if !(1..=d.history_days).contains(&d.drift_window_days) {
        return bad(
            "drift_window_days",
            format!(
                "detect.drift_window_days = {}: give 1 to history_days ({})",
                d.drift_window_days, d.history_days
            ),
        );
    }
    if !(d.drift_pct_per_week > 0.0 && d.drift_pct_per_week <= 1000.0) {
        return bad(
            "drift_pct_per_week",
            format!(
                "detect.drift_pct_per_week = {}: give a percentage above 0 (3: the seeds' figure)",
                d.drift_pct_per_week
            ),
        );
    }
    Ok(())
}
