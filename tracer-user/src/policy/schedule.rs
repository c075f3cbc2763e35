//! `[[detect.schedule]]`: periods (weekdays, hours, dates) that set the detector's tiers,
//! `min_increase_us` and debounce times in force. The first entry whose period holds wins;
//! outside every entry the `[detect]` values hold. Keys an entry leaves out keep `[detect]`'s.
use std::time::SystemTime;

use serde::Deserialize;

use super::period::{Period, PeriodKeys};
use crate::config::DetectConfig;

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
pub fn validate(detect: &DetectConfig) -> anyhow::Result<()> {
    super::check_entries(
        "detect.schedule",
        detect.schedule.iter().map(|e| e.name.as_str()),
    )?;
    for e in &detect.schedule {
        e.period()
            .map_err(|why| anyhow::anyhow!("detect.schedule {:?}: {why}", e.name))?;
        e.over(detect)
            .validate()
            .map_err(|why| anyhow::anyhow!("detect.schedule {:?}: {why}", e.name))?;
    }
    Ok(())
}

/// The schedule, parsed: each entry's period and the settings it puts in force.
#[derive(Clone, Debug)]
pub struct Schedule {
    base: DetectConfig,
    entries: Vec<(String, Period, DetectConfig)>,
}

impl Schedule {
    /// The schedule of a validated `[detect]` table (entries that do not parse are left out:
    /// `Config::parse` has refused them already).
    pub fn new(cfg: &DetectConfig) -> Schedule {
        let entries = cfg
            .schedule
            .iter()
            .filter_map(|e| Some((e.name.clone(), e.period().ok()?, e.over(cfg))))
            .collect();
        let mut base = cfg.clone();
        base.schedule = Vec::new();
        Schedule { base, entries }
    }

    /// The settings in force at `t`, and the name of the entry that put them there (None: the
    /// `[detect]` values).
    pub fn at(&self, t: SystemTime) -> (Option<&str>, &DetectConfig) {
        match self.entries.iter().find(|(_, p, _)| p.holds(t)) {
            Some((name, _, cfg)) => (Some(name), cfg),
            None => (None, &self.base),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;
    use crate::{config::Config, policy::period::days_from_civil};

    #[test]
    fn the_first_entry_that_holds_sets_the_tiers_at_its_minute() {
        let c = Config::parse(
            "[detect]\nwarning = 0.1\ncritical = 0.3\npage = 0.5\n\
             [[detect.schedule]]\nname = \"sale\"\ndates = \"2026-11-27..2026-11-30\"\nwarning = 0.05\ncritical = 0.1\npage = 0.2\nfiring_after_s = 10\n\
             [[detect.schedule]]\nname = \"night\"\nhours = \"22:00-07:00\"\nwarning = 0.3\ncritical = 0.6\npage = 1.0\nmin_increase_us = 50\n",
        )
        .unwrap();
        let s = Schedule::new(&c.detect);
        let at = |y, m, d, h: u64, min: u64| {
            UNIX_EPOCH
                + Duration::from_secs(
                    days_from_civil(y, m, d) as u64 * 86_400 + h * 3600 + min * 60,
                )
        };
        let tiers = |t| {
            let (name, cfg) = s.at(t);
            (
                name.map(str::to_owned),
                cfg.warning,
                cfg.page,
                cfg.min_increase_us,
                cfg.firing_after_s,
            )
        };
        assert_eq!(tiers(at(2026, 12, 3, 21, 59)), (None, 0.1, 0.5, 10.0, 30));
        assert_eq!(
            tiers(at(2026, 12, 3, 22, 0)),
            (Some("night".into()), 0.3, 1.0, 50.0, 30)
        );
        assert_eq!(
            tiers(at(2026, 12, 4, 6, 59)),
            (Some("night".into()), 0.3, 1.0, 50.0, 30)
        );
        assert_eq!(tiers(at(2026, 12, 4, 7, 0)), (None, 0.1, 0.5, 10.0, 30));
        // During the sale the sale's entry wins, nights included (it comes first).
        assert_eq!(
            tiers(at(2026, 11, 28, 23, 0)),
            (Some("sale".into()), 0.05, 0.2, 10.0, 10)
        );
        assert_eq!(
            tiers(at(2026, 11, 26, 23, 59)),
            (Some("night".into()), 0.3, 1.0, 50.0, 30)
        );
    }

    #[test]
    fn entries_are_validated_with_what_they_put_in_force() {
        let e = |text: &str| Config::parse(text).unwrap_err().to_string();
        assert_eq!(
            e("[[detect.schedule]]\nname = \"night\"\nwarning = 0.6\n"),
            "detect.schedule \"night\": detect thresholds warning = 0.6, critical = 0.3, page = 0.5: give fractions over the baseline p99 with 0 < warning < critical < page"
        );
        assert_eq!(
            e("[[detect.schedule]]\nname = \"night\"\nhours = \"22-6\"\n"),
            "detect.schedule \"night\": hours = \"22-6\": give \"HH:MM-HH:MM\" (24-hour clock, end excluded; \"22:00-06:00\" wraps past midnight)"
        );
        assert_eq!(
            e("[[detect.schedule]]\nhours = \"22:00-06:00\"\n"),
            "detect.schedule: give every entry a name"
        );
        assert_eq!(
            e("[[detect.schedule]]\nname = \"a\"\n[[detect.schedule]]\nname = \"a\"\n"),
            "detect.schedule \"a\": the name is taken by an earlier entry"
        );
        assert!(
            e("[[detect.schedule]]\nname = \"a\"\ncolour = 1\n").contains("unknown field `colour`")
        );
        let many: String = (0..65)
            .map(|i| format!("[[detect.schedule]]\nname = \"e{i}\"\n"))
            .collect();
        assert_eq!(e(&many), "detect.schedule: 65 entries: give at most 64");
        let long = format!("[[detect.schedule]]\nname = \"{}\"\n", "n".repeat(100));
        assert!(
            e(&long).ends_with(": give at most 64 printable characters"),
            "{}",
            e(&long)
        );
    }
}
