//! When a policy applies: weekdays, a time of day (which may wrap past midnight), a range of
//! dates, all in one fixed UTC offset. Parsed once from the config file's strings; checked
//! against the wall clock with plain integer arithmetic (no time-zone database: the offset is
//! fixed, so a policy written for a zone with daylight saving is moved by hand twice a year).
use std::time::{SystemTime, UNIX_EPOCH};

/// The weekday names the config file takes, Monday first.
const DAYS: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];

/// A parsed period.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Period {
    /// Bit `d` set: weekday `d` (0 Monday) is in.
    days: u8,
    /// Minutes of the day [start, end); end < start wraps past midnight. None: the whole day.
    minutes: Option<(u16, u16)>,
    /// Days since 1970-01-01, both ends in. None: any date.
    dates: Option<(i64, i64)>,
    /// Seconds east of UTC.
    offset_s: i64,
}

/// The keys a period is written with, as strings from the config file.
#[derive(Clone, Copy, Debug, Default)]
pub struct PeriodKeys<'a> {
    /// `days = ["mon", ...]` (empty: every day).
    pub days: &'a [String],
    /// `hours = "HH:MM-HH:MM"`.
    pub hours: Option<&'a str>,
    /// `dates = "YYYY-MM-DD..YYYY-MM-DD"`.
    pub dates: Option<&'a str>,
    /// `utc_offset = "+HH:MM"`.
    pub utc_offset: Option<&'a str>,
}

fn minute_of_day(s: &str) -> Option<u16> {
    let (h, m) = s.trim().split_once(':')?;
    let (h, m): (u16, u16) = (h.parse().ok()?, m.parse().ok()?);
    if m >= 60 || h > 24 || (h == 24 && m != 0) || s.trim().len() != 5 {
        return None;
    }
    Some(h * 60 + m)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Hinnant's days_from_civil).
pub fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = i64::from((m + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn date(s: &str) -> Option<i64> {
    let s = s.trim();
    let mut parts = s.splitn(3, '-');
    let (y, m, d) = (parts.next()?, parts.next()?, parts.next()?);
    if y.len() != 4 || m.len() != 2 || d.len() != 2 {
        return None;
    }
    let (y, m, d): (i64, u32, u32) = (y.parse().ok()?, m.parse().ok()?, d.parse().ok()?);
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let len = [
        31,
        if leap { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    if !(1..=12).contains(&m) || d == 0 || d > len[m as usize - 1] {
        return None;
    }
    Some(days_from_civil(y, m, d))
}

fn offset(s: &str) -> Option<i64> {
    let s = s.trim();
    let sign = match s.as_bytes().first()? {
        b'+' => 1,
        b'-' => -1,
        _ => return None,
    };
    let (h, m) = s[1..].split_once(':')?;
    if h.len() != 2 || m.len() != 2 {
        return None;
    }
    let (h, m): (i64, i64) = (h.parse().ok()?, m.parse().ok()?);
    (h <= 14 && m < 60).then_some(sign * (h * 3600 + m * 60))
}

impl Period {
    /// Parses the keys; the error names the key, what it got and what it takes.
    pub fn parse(k: PeriodKeys<'_>) -> Result<Period, String> {
        let mut days = 0u8;
        for d in k.days {
            let Some(i) = DAYS.iter().position(|n| n.eq_ignore_ascii_case(d.trim())) else {
                return Err(format!("days: {d:?} is not a weekday: give some of \"mon\", \"tue\", \"wed\", \"thu\", \"fri\", \"sat\", \"sun\""));
            };
            days |= 1 << i;
        }
        if days == 0 {
            days = 0x7f;
        }
        let minutes = match k.hours {
            None => None,
            Some(h) => {
                let bad = || {
                    format!("hours = {h:?}: give \"HH:MM-HH:MM\" (24-hour clock, end excluded; \"22:00-06:00\" wraps past midnight)")
                };
                let (a, b) = h.split_once('-').ok_or_else(bad)?;
                let (a, b) = (
                    minute_of_day(a).ok_or_else(bad)?,
                    minute_of_day(b).ok_or_else(bad)?,
                );
                if a == b || a == 1440 {
                    return Err(bad());
                }
                Some((a, b))
            }
        };
        let dates = match k.dates {
            None => None,
            Some(s) => {
                let bad =
                    || format!("dates = {s:?}: give \"YYYY-MM-DD..YYYY-MM-DD\" (both days in)");
                let (a, b) = s.split_once("..").ok_or_else(bad)?;
                let (a, b) = (date(a).ok_or_else(bad)?, date(b).ok_or_else(bad)?);
                if b < a {
                    return Err(format!("dates = {s:?}: the range ends before it starts"));
                }
                Some((a, b))
            }
        };
        let offset_s = match k.utc_offset {
            None => 0,
            Some(s) => offset(s).ok_or_else(|| {
                format!("utc_offset = {s:?}: give \"+HH:MM\" or \"-HH:MM\" (up to 14 hours)")
            })?,
        };
        Ok(Period {
            days,
            minutes,
            dates,
            offset_s,
        })
    }

    /// Whether `t` falls in the period.
    pub fn holds(&self, t: SystemTime) -> bool {
        let secs = match t.duration_since(UNIX_EPOCH) {
            Ok(d) => d.as_secs() as i64,
            Err(e) => -(e.duration().as_secs() as i64),
        } + self.offset_s;
        let day = secs.div_euclid(86_400);
        let minute = (secs.rem_euclid(86_400) / 60) as u16;
        // 1970-01-01 was a Thursday (weekday 3, Monday 0).
        let weekday = (day + 3).rem_euclid(7);
        if self.days & (1 << weekday) == 0 {
            return false;
        }
        if let Some((a, b)) = self.dates {
            if day < a || day > b {
                return false;
            }
        }
        match self.minutes {
            None => true,
            Some((a, b)) if a < b => (a..b).contains(&minute),
            Some((a, b)) => minute >= a || minute < b,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn keys<'a>(
        days: &'a [String],
        hours: Option<&'a str>,
        dates: Option<&'a str>,
        utc_offset: Option<&'a str>,
    ) -> PeriodKeys<'a> {
        PeriodKeys {
            days,
            hours,
            dates,
            utc_offset,
        }
    }

    /// 2026-12-07 (a Monday) at hh:mm:ss UTC.
    fn monday(h: u64, m: u64, s: u64) -> SystemTime {
        UNIX_EPOCH
            + Duration::from_secs(
                days_from_civil(2026, 12, 7) as u64 * 86_400 + h * 3600 + m * 60 + s,
            )
    }

    #[test]
    fn weekdays_hours_dates_and_offsets() {
        let work: Vec<String> = ["mon", "tue", "wed", "thu", "fri"]
            .map(String::from)
            .to_vec();
        let p = Period::parse(keys(&work, Some("09:00-18:00"), None, None)).unwrap();
        assert!(
            !p.holds(monday(8, 59, 59))
                && p.holds(monday(9, 0, 0))
                && p.holds(monday(17, 59, 59))
                && !p.holds(monday(18, 0, 0))
        );
        // Sunday 2026-12-06 at noon is not a working day.
        assert!(!p.holds(monday(12, 0, 0) - Duration::from_secs(86_400)));
        // Night, wrapping past midnight, every day.
        let night = Period::parse(keys(&[], Some("22:00-06:00"), None, None)).unwrap();
        assert!(
            night.holds(monday(23, 0, 0))
                && night.holds(monday(5, 59, 0))
                && !night.holds(monday(6, 0, 0))
        );
        // A sale, both days in, in UTC+01:00: Monday 23:30 UTC is Tuesday 00:30 there.
        let sale = Period::parse(keys(
            &[],
            None,
            Some("2026-12-08..2026-12-09"),
            Some("+01:00"),
        ))
        .unwrap();
        assert!(!sale.holds(monday(22, 59, 0)) && sale.holds(monday(23, 0, 0)));
        assert!(sale.holds(monday(23, 0, 0) + Duration::from_secs(2 * 86_400 - 1)));
        assert!(!sale.holds(monday(23, 0, 0) + Duration::from_secs(2 * 86_400)));
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
    }

    #[test]
    fn bad_keys_say_what_they_take() {
        let e = |k| Period::parse(k).unwrap_err();
        let monday = ["monday".to_owned()];
        assert_eq!(
            e(keys(&monday, None, None, None)),
            "days: \"monday\" is not a weekday: give some of \"mon\", \"tue\", \"wed\", \"thu\", \"fri\", \"sat\", \"sun\""
        );
        for h in ["9-17", "09:00-25:00", "09:00", "09:00-09:00", "09:60-10:00"] {
            assert!(
                e(keys(&[], Some(h), None, None))
                    .starts_with(&format!("hours = {h:?}: give \"HH:MM-HH:MM\"")),
                "{h}"
            );
        }
        assert_eq!(
            e(keys(&[], None, Some("2026-02-30..2026-03-01"), None)),
            "dates = \"2026-02-30..2026-03-01\": give \"YYYY-MM-DD..YYYY-MM-DD\" (both days in)"
        );
        assert_eq!(
            e(keys(&[], None, Some("2026-03-02..2026-03-01"), None)),
            "dates = \"2026-03-02..2026-03-01\": the range ends before it starts"
        );
        assert!(e(keys(&[], None, None, Some("CET"))).starts_with("utc_offset = \"CET\""));
        // Hostile sizes are refused, not overflowed.
        assert!(
            Period::parse(keys(&[], Some("99999999999999999999:00-01:00"), None, None)).is_err()
        );
    }
}
