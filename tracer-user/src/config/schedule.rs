//! `[[detect.schedule]]`: periods (weekdays, hours, dates) that set the detector's tiers,
//! `min_increase_us` and debounce times in force. The first entry whose period holds wins;
//! outside every entry the `[detect]` values hold. Keys an entry leaves out keep `[detect]`'s.
use serde::Deserialize;

use super::{
    period::{Period, PeriodKeys},
    ConfigError, DetectConfig,
};

/// One `[[detect.schedule]]` entry as written.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ScheduleEntry {
    /// Its name: in the log when it takes over, and the `schedule` label of
    /// `cudatrace_detect_schedule`.
    #[serde(default)]
    pub name: String,
    /// Weekdays (`"mon"` .. `"sun"`); none: every day.
    #[serde(default)]
    pub days: Vec<String>,
    /// `"HH:MM-HH:MM"`, end excluded, may wrap past midnight; none: the whole day.
    pub hours: Option<String>,
    /// `"YYYY-MM-DD..YYYY-MM-DD"`, both days in; none: any date.
    pub dates: Option<String>,
    /// `"+HH:MM"` the days, hours and dates are in (default UTC).
    pub utc_offset: Option<String>,
    /// Warning tier in force (fraction over the baseline p99).
    pub warning: Option<f64>,
    /// Critical tier in force.
    pub critical: Option<f64>,
    /// Page tier in force.
    pub page: Option<f64>,
    /// Smallest rise that breaches, microseconds.
    pub min_increase_us: Option<f64>,
    /// Breaching windows before pending.
    pub pending_windows: Option<u32>,
    /// Seconds of breach before firing.
    pub firing_after_s: Option<u64>,
    /// Seconds without a breach before resolving.
    pub resolve_after_s: Option<u64>,
}

impl ScheduleEntry {
    /// The entry's period.
    pub fn period(&self) -> Result<Period, String> {
        Period::parse(PeriodKeys {
            days: &self.days,
            hours: self.hours.as_deref(),
            dates: self.dates.as_deref(),
            utc_offset: self.utc_offset.as_deref(),
        })
    }

    /// `base` with this entry's values over it.
    pub fn over(&self, base: &DetectConfig) -> DetectConfig {
        let mut c = base.clone();
        c.warning = self.warning.unwrap_or(c.warning);
        c.critical = self.critical.unwrap_or(c.critical);
        c.page = self.page.unwrap_or(c.page);
        c.min_increase_us = self.min_increase_us.unwrap_or(c.min_increase_us);
        c.pending_windows = self.pending_windows.unwrap_or(c.pending_windows);
        c.firing_after_s = self.firing_after_s.unwrap_or(c.firing_after_s);
        c.resolve_after_s = self.resolve_after_s.unwrap_or(c.resolve_after_s);
        c.schedule = Vec::new();
        c
    }
}

/// Checks `[[detect.schedule]]`: names, each entry's period, and the settings it puts in force
/// over `[detect]`'s; the error is the whole line.
pub fn validate(detect: &DetectConfig) -> Result<(), ConfigError> {
    super::entries::check(
        "detect.schedule",
        detect.schedule.iter().map(|e| e.name.as_str()),
    )?;
    for e in &detect.schedule {
        e.period().map_err(|why| {
            ConfigError::invalid(
                "detect.schedule",
                format!("detect.schedule {:?}: {why}", e.name),
            )
        })?;
        e.over(detect).validate().map_err(|why| {
            ConfigError::invalid(
                "detect.schedule",
                format!("detect.schedule {:?}: {why}", e.name),
            )
        })?;
    }
    Ok(())
}
