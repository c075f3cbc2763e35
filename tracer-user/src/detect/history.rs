//! The hourly summaries of one series over the last `history_days` (the seeds' 7-day baseline),
//! and the drift of its level, the season removed, estimated from them: the least-squares slope
//! of the logarithm of the hourly means, as a rate per week.
use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

/// Seconds in an hour.
const HOUR_S: f64 = 3600.0;
/// Hours in a week.
const WEEK_H: f64 = 168.0;

/// One hour of a series.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Hour {
    /// Hours since the epoch.
    pub hour: u64,
    /// Windows learned in it.
    pub n: u32,
    /// Their sum.
    pub sum: f64,
    /// Their sum with the season removed.
    pub sum_d: f64,
}

/// A drift estimate over a span of hours.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Drift {
    /// Rise per week, as a fraction (0.03: 3% a week).
    pub per_week: f64,
    /// The fitted level (season removed) at the span's start and at its end.
    pub from: f64,
    /// At its end.
    pub to: f64,
    /// Hours with values in the span.
    pub hours: usize,
}

/// The hourly summaries of one series.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct History {
    /// Closed hours, oldest first.
    hours: VecDeque<Hour>,
    /// The hour being filled.
    open: Option<Hour>,
}

impl History {
    /// Learns value `v` (`d` with the season removed) at wall time `t`, keeping `keep` hours;
    /// true when this closed an hour.
    pub fn learn(&mut self, v: f64, d: f64, t: f64, keep: usize) -> bool {
        let hour = (t.max(0.0) / HOUR_S) as u64;
        if let Some(h) = self.open.as_mut().filter(|h| h.hour == hour) {
            h.n += 1;
            h.sum += v;
            h.sum_d += d;
            return false;
        }
        let closed = self.open.replace(Hour {
            hour,
            n: 1,
            sum: v,
            sum_d: d,
        });
        let Some(h) = closed else {
            return false;
        };
        self.hours.push_back(h);
        while self.hours.len() > keep
            || self
                .hours
                .front()
                .is_some_and(|f| f.hour + keep as u64 <= hour)
        {
            self.hours.pop_front();
        }
        true
    }

    /// The closed hours, oldest first.
    pub fn hours(&self) -> impl Iterator<Item = &Hour> {
        self.hours.iter()
    }

    /// The drift over the `window` hours before hour `now`, once the hours with values span at
    /// least six sevenths of it and fill a third of it.
    pub fn drift(&self, now: u64, window: u64) -> Option<Drift> {
        let pts: Vec<(f64, f64)> = self
            .hours
            .iter()
            .filter(|h| h.hour + window > now && h.n > 0 && h.sum_d > 0.0)
            .map(|h| (h.hour as f64, (h.sum_d / h.n as f64).ln()))
            .collect();
        let (first, last) = (pts.first()?.0, pts.last()?.0);
        if (last - first) * 7.0 < (window as f64 - 1.0) * 6.0 || (pts.len() as u64) * 3 < window {
            return None;
        }
        let n = pts.len() as f64;
        let mx = pts.iter().map(|p| p.0).sum::<f64>() / n;
        let my = pts.iter().map(|p| p.1).sum::<f64>() / n;
        let sxx: f64 = pts.iter().map(|p| (p.0 - mx).powi(2)).sum();
        let sxy: f64 = pts.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
        if sxx <= 0.0 {
            return None;
        }
        let slope = sxy / sxx;
        let at = |x: f64| (my + slope * (x - mx)).exp();
        Some(Drift {
            per_week: (slope * WEEK_H).exp() - 1.0,
            from: at(first),
            to: at(last),
            hours: pts.len(),
        })
    }

    /// Whether a loaded history holds at most `keep` hours of sane numbers, in order.
    pub fn fits(&self, keep: usize) -> bool {
        let ok = |h: &Hour| h.sum.is_finite() && h.sum_d.is_finite() && h.sum >= 0.0;
        self.hours.len() <= keep
            && self.hours.iter().all(ok)
            && self.open.as_ref().is_none_or(ok)
            && self
                .hours
                .iter()
                .zip(self.hours.iter().skip(1))
                .all(|(a, b)| a.hour < b.hour)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `days` of one value a minute from `f(t)`.
    fn fill(days: f64, f: impl Fn(f64) -> f64) -> History {
        let mut h = History::default();
        let mut t = 0.0;
        while t < days * 86_400.0 {
            let v = f(t);
            h.learn(v, v, t, 7 * 24);
            t += 60.0;
        }
        h
    }

    #[test]
    fn ten_percent_a_week_is_measured() {
        let h = fill(8.0, |t| 100.0 * 1.1f64.powf(t / (7.0 * 86_400.0)));
        let d = h.drift(8 * 24, 7 * 24).unwrap();
        assert!((d.per_week - 0.10).abs() < 0.002, "{d:?}");
        // Hours 25 to 190 (191 is still open): those within the window.
        assert_eq!(d.hours, 166);
        // A week: 167 closed hours and the open one.
        assert_eq!(h.hours().count(), 7 * 24 - 1);
    }

    #[test]
    fn a_stable_series_has_no_drift() {
        let h = fill(8.0, |t| {
            100.0
                + if (t as u64 / 60).is_multiple_of(2) {
                    5.0
                } else {
                    -5.0
                }
        });
        let d = h.drift(8 * 24, 7 * 24).unwrap();
        assert!(d.per_week.abs() < 0.001, "{d:?}");
    }

    #[test]
    fn too_short_a_history_says_nothing() {
        let h = fill(5.0, |t| 100.0 * 1.1f64.powf(t / (7.0 * 86_400.0)));
        assert_eq!(h.drift(5 * 24, 7 * 24), None);
    }
}
