//! The season of one series (Holt-Winters' third component): a factor for each part
//! (`season_bucket_s`) of the season (`season_s`, a day by default), the part's usual value over
//! the season's mean. Each part keeps its ratio (its mean over the season's mean) in each of the
//! last `season_history` seasons, and its factor is their median: a peak seen every day is
//! expected from the second day, while a one-off incident at some hour is outvoted once three
//! seasons are known. The season's mean follows about the last season, so a slow drift moves the
//! mean, not the factors. It learns every window but stuck ones, breaching windows included (a
//! daily peak breaches the first day; were it not learned it would never be expected). Until a
//! whole season is learned every factor is 1: no season is assumed from part of one.
use serde::{Deserialize, Serialize};

/// Factors are kept within these bounds (a part twenty times the mean is not a season).
const FACTOR_RANGE: (f64, f64) = (0.05, 20.0);

/// The season's settings (from `[detect]`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SeasonParams {
    /// Its length, seconds.
    pub len_s: u64,
    /// One part, seconds.
    pub bucket_s: u64,
    /// Seasons each part's factor is the median of.
    pub history: usize,
}

impl SeasonParams {
    /// Parts in a season.
    pub fn parts(&self) -> usize {
        (self.len_s / self.bucket_s.max(1)).max(1) as usize
    }

    /// The part (since the epoch) that wall time `t` (seconds since the epoch) is in.
    fn part(&self, t: f64) -> u64 {
        (t.max(0.0) / self.bucket_s.max(1) as f64) as u64
    }
}

fn one() -> f64 {
    1.0
}

/// The median of a part's ratios (1 when it has none).
fn median(r: &[f64]) -> f64 {
    let mut r = r.to_vec();
    if r.is_empty() {
        return 1.0;
    }
    r.sort_by(f64::total_cmp);
    let n = r.len();
    if n % 2 == 1 {
        r[n / 2]
    } else {
        (r[n / 2 - 1] + r[n / 2]) / 2.0
    }
}

/// What a season has learned.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Season {
    /// Each part's ratios in the last seasons, newest last, once a whole season is learned
    /// (empty before).
    factors: Vec<Vec<f64>>,
    /// During the first season: each part's sum of values and their count.
    first: Vec<(f64, u32)>,
    /// When it began learning, seconds since the epoch.
    began: Option<f64>,
    /// The mean of the parts' medians: factors are over it, so that they average 1.
    #[serde(default = "one")]
    norm: f64,
    /// The part being filled: its number since the epoch, the sum of its values, their count.
    open: Option<(u64, f64, u32)>,
    /// The mean of the parts' means over about the last season.
    mean: f64,
}

impl Default for Season {
    fn default() -> Self {
        Season {
            factors: Vec::new(),
            first: Vec::new(),
            began: None,
            norm: 1.0,
            open: None,
            mean: 0.0,
        }
    }
}

impl Season {
    /// Whether a whole season is learned (the factors are in use).
    pub fn ready(&self) -> bool {
        !self.factors.is_empty()
    }

    /// The factor at wall time `t`: 1 until a whole season is learned.
    pub fn factor(&self, t: f64, p: &SeasonParams) -> f64 {
        if self.factors.is_empty() {
            return 1.0;
        }
        let i = (p.part(t) % self.factors.len() as u64) as usize;
        if self.factors[i].is_empty() {
            return 1.0;
        }
        median(&self.factors[i]) / self.norm
    }

    /// The factors' mean again, after a part changed.
    fn renorm(&mut self) {
        let known: Vec<f64> = self
            .factors
            .iter()
            .filter(|r| !r.is_empty())
            .map(|r| median(r))
            .collect();
        let m = known.iter().sum::<f64>() / known.len().max(1) as f64;
        self.norm = if m > 0.0 && m.is_finite() { m } else { 1.0 };
    }

    /// Learns value `v` at wall time `t`; true when this made a whole season learned.
    pub fn learn(&mut self, v: f64, t: f64, p: &SeasonParams) -> bool {
        let began = *self.began.get_or_insert(t);
        let part = p.part(t);
        match &mut self.open {
            Some((b, sum, n)) if *b == part => {
                *sum += v;
                *n += 1;
                false
            }
            open => {
                let closed = open.replace((part, v, 1));
                match closed {
                    Some((b, sum, n)) if n > 0 => self.close(b, sum / n as f64, t - began, p),
                    _ => false,
                }
            }
        }
    }

    /// Part `b` ended with mean `m`, `learned` seconds after learning began; true when that
    /// completed the first season.
    fn close(&mut self, b: u64, m: f64, learned: f64, p: &SeasonParams) -> bool {
        let parts = p.parts();
        let i = (b % parts as u64) as usize;
        if self.factors.is_empty() {
            self.first.resize(parts, (0.0, 0));
            self.first[i].0 += m;
            self.first[i].1 += 1;
            if learned < p.len_s as f64 {
                return false;
            }
            let means: Vec<Option<f64>> = self
                .first
                .iter()
                .map(|(s, n)| (*n > 0).then(|| s / *n as f64))
                .collect();
            let known: Vec<f64> = means.iter().flatten().copied().collect();
            self.mean = known.iter().sum::<f64>() / known.len().max(1) as f64;
            self.factors = means
                .iter()
                .map(|m| match m {
                    Some(m) if self.mean > 0.0 => {
                        vec![(m / self.mean).clamp(FACTOR_RANGE.0, FACTOR_RANGE.1)]
                    }
                    _ => Vec::new(),
                })
                .collect();
            self.first = Vec::new();
            self.renorm();
            return true;
        }
        self.mean += (m - self.mean) / parts as f64;
        if self.mean > 0.0 {
            let r = &mut self.factors[i];
            r.push((m / self.mean).clamp(FACTOR_RANGE.0, FACTOR_RANGE.1));
            while r.len() > p.history.max(1) {
                r.remove(0);
            }
            self.renorm();
        }
        false
    }

    /// Whether a loaded season fits these settings and holds only sane numbers; one that does
    /// not is started over.
    pub fn fits(&self, p: &SeasonParams) -> bool {
        let parts = p.parts();
        let ok = |x: f64| x.is_finite() && x >= 0.0;
        (self.factors.is_empty() || self.factors.len() == parts)
            && (self.first.is_empty() || self.first.len() == parts)
            && self
                .factors
                .iter()
                .all(|r| r.len() <= 31 && r.iter().all(|f| ok(*f)))
            && self.first.iter().all(|(s, _)| ok(*s))
            && ok(self.mean)
            && self.began.is_none_or(ok)
            && ok(self.norm)
            && self.norm > 0.0
            && self.open.is_none_or(|(_, s, _)| ok(s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: SeasonParams = SeasonParams {
        len_s: 86_400,
        bucket_s: 3600,
        history: 3,
    };

    /// 100 all day but 150 from 09:00 to 10:00.
    fn daily(t: f64) -> f64 {
        let hour = (t / 3600.0) as u64 % 24;
        if hour == 9 {
            150.0
        } else {
            100.0
        }
    }

    #[test]
    fn learns_a_daily_peak_after_a_whole_day() {
        let mut s = Season::default();
        let mut ready_at = None;
        let mut t = 0.0;
        while t < 2.0 * 86_400.0 {
            if s.learn(daily(t), t, &DAY) && ready_at.is_none() {
                ready_at = Some(t);
            }
            if ready_at.is_none() {
                assert_eq!(s.factor(t, &DAY), 1.0);
            }
            t += 60.0;
        }
        // Ready at the first part to close a day after the first value.
        assert_eq!(ready_at, Some(86_400.0));
        // Mean of the hours: (23 * 100 + 150) / 24.
        let mean = (23.0 * 100.0 + 150.0) / 24.0;
        let peak = s.factor(9.5 * 3600.0, &DAY);
        let quiet = s.factor(3.0 * 3600.0, &DAY);
        assert!((peak - 150.0 / mean).abs() < 0.01, "{peak}");
        assert!((quiet - 100.0 / mean).abs() < 0.01, "{quiet}");
    }

    #[test]
    fn a_drift_moves_the_mean_not_the_factors() {
        let mut s = Season::default();
        let mut t = 0.0;
        // 14 days, the whole series rising 10% a week.
        while t < 14.0 * 86_400.0 {
            let grow = 1.0 + 0.1 * t / (7.0 * 86_400.0);
            s.learn(daily(t) * grow, t, &DAY);
            t += 60.0;
        }
        let mean = (23.0 * 100.0 + 150.0) / 24.0;
        let peak = s.factor(9.5 * 3600.0, &DAY);
        assert!((peak - 150.0 / mean).abs() < 0.03, "{peak}");
    }

    #[test]
    fn a_one_off_hour_is_outvoted() {
        let mut s = Season::default();
        let mut t = 0.0;
        // Four days; on the third, 03:00 to 04:00 is 3x.
        while t < 4.0 * 86_400.0 {
            let odd = (t / 86_400.0) as u64 == 2 && (t / 3600.0) as u64 % 24 == 3;
            s.learn(if odd { 300.0 } else { daily(t) }, t, &DAY);
            t += 60.0;
        }
        let mean = (23.0 * 100.0 + 150.0) / 24.0;
        let three = s.factor(3.5 * 3600.0, &DAY);
        assert!((three - 100.0 / mean).abs() < 0.02, "{three}");
    }

    #[test]
    fn a_season_of_other_settings_does_not_fit() {
        let mut s = Season::default();
        let mut t = 0.0;
        while t <= 86_400.0 {
            s.learn(100.0, t, &DAY);
            t += 600.0;
        }
        assert!(s.ready() && s.fits(&DAY));
        let other = SeasonParams {
            bucket_s: 900,
            ..DAY
        };
        assert!(!s.fits(&other));
    }
}
