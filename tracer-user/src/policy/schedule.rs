//! The detection schedule at work: which `[[detect.schedule]]` entry's settings are in force at
//! a given time (the first whose period holds; outside every entry, `[detect]`'s own).
use std::time::SystemTime;

use crate::config::{period::Period, DetectConfig};

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
    use crate::config::{period::days_from_civil, Config, ConfigError};

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
        // Every refusal of an entry is an invalid value of the list (or a syntax error).
        let e = |text: &str| match Config::parse(text) {
            Err(ConfigError::Invalid { key, message }) => {
                assert_eq!(key, "detect.schedule", "{text:?}");
                message
            }
            Err(err @ ConfigError::Syntax(_)) => err.to_string(),
            other => panic!("{text:?}: expected a refusal, got {other:?}"),
        };
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
