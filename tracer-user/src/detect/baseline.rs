//! What normal looks like for one series of per-window values (a process's launch latency p99,
//! wait per launch, or copy time per MiB): Holt's linear trend, damped, over Hampel-filtered
//! values, with an EWMA of squared forecast errors for the spread. The baseline p99 is the forecast
//! plus 2.326 spreads: the value a normal window stays under 99 times in 100.
//!
//! It learns values with the season taken out ([`super::season`]); [`super::memory::Series`]
//! puts the season back into its forecast. A slow trend is followed; a step is not (the caller
//! keeps breaching windows out, so contention never becomes the new normal).
use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

/// z of the normal distribution's 99th percentile.
const Z99: f64 = 2.326;
/// MAD to standard deviation, for normally distributed values.
const MAD_TO_SIGMA: f64 = 1.4826;

/// Smoothing and filtering parameters (from the config file's `[detect]` table).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Params {
    /// Windows learned before the baseline is used.
    pub warmup: usize,
    /// Level smoothing (Holt's alpha).
    pub alpha: f64,
    /// Trend smoothing (Holt's beta).
    pub beta: f64,
    /// Trend damping per window (phi); 1 is an undamped trend.
    pub phi: f64,
    /// EWMA weight of the newest squared forecast error.
    pub gamma: f64,
    /// Lowest spread, as a fraction of the forecast: a perfectly steady series still tolerates
    /// this much jitter.
    pub min_spread_ratio: f64,
    /// Windows the Hampel filter compares a new value with.
    pub hampel_windows: usize,
    /// A value further than this many (MAD-estimated) deviations from their median is an outlier.
    pub hampel_k: f64,
}

/// How [`Baseline::learn`] took a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Learned {
    /// Still warming up.
    Warming,
    /// The value was the last one of the warm-up: the baseline is ready from now on.
    Ready,
    /// Taken as it is.
    Taken,
    /// An isolated outlier: the recent median was learned in its place.
    Replaced,
}

/// The baseline of one series; saved without its parameters (the config's, at load).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Baseline {
    #[serde(skip)]
    params: Params,
    /// The last `hampel_windows` values offered, newest last.
    recent: VecDeque<f64>,
    warm: Vec<f64>,
    level: f64,
    trend: f64,
    var: f64,
    ready: bool,
}

/// Median of a non-empty slice (sorted in place).
fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

/// (median, median absolute deviation).
fn median_mad(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let mut v: Vec<f64> = values.collect();
    let m = median(&mut v);
    let mut dev: Vec<f64> = v.iter().map(|x| (x - m).abs()).collect();
    (m, median(&mut dev))
}

impl Baseline {
    /// An empty baseline.
    pub fn new(params: Params) -> Self {
        Baseline {
            params,
            recent: VecDeque::new(),
            warm: Vec::new(),
            level: 0.0,
            trend: 0.0,
            var: 0.0,
            ready: false,
        }
    }

    /// Takes the config's parameters (after a load), dropping what they no longer hold.
    pub fn set_params(&mut self, params: Params) {
        self.params = params;
        while self.recent.len() > params.hampel_windows {
            self.recent.pop_front();
        }
        self.warm.truncate(params.warmup.saturating_sub(1));
    }

    /// Whether every number in it is finite and not negative where values are: a saved
    /// baseline that is not is dropped at load.
    pub fn sane(&self) -> bool {
        let ok = |x: f64| x.is_finite() && x >= 0.0;
        self.recent.iter().chain(&self.warm).all(|x| ok(*x))
            && ok(self.level)
            && ok(self.var)
            && self.trend.is_finite()
    }

    /// Multiplies everything it learned by `k` (when a season starts to be taken out).
    pub fn rescale(&mut self, k: f64) {
        for x in self.recent.iter_mut().chain(self.warm.iter_mut()) {
            *x *= k;
        }
        self.level *= k;
        self.trend *= k;
        self.var *= k * k;
    }

    /// The expected value of the next window.
    pub fn forecast(&self) -> f64 {
        (self.level + self.params.phi * self.trend).max(0.0)
    }

    /// The spread (standard deviation) of normal windows around the forecast.
    pub fn spread(&self) -> f64 {
        self.var
            .sqrt()
            .max(self.params.min_spread_ratio * self.forecast())
    }

    /// The value a normal window stays under 99 times in 100; `None` while warming up.
    pub fn p99(&self) -> Option<f64> {
        self.ready.then(|| self.forecast() + Z99 * self.spread())
    }

    /// The recent median when `v` is an isolated outlier: further than `hampel_k` deviations from
    /// the median of the recent values, while few of those are far out themselves. When a third
    /// of the recent windows are far out, that is how this series behaves, and values are learned
    /// as they are (so that its spread widens instead of alerts firing on it).
    fn outlier(&self, v: f64) -> Option<f64> {
        if self.recent.len() < 3 {
            return None;
        }
        let (m, mad) = median_mad(self.recent.iter().copied());
        let scale = (MAD_TO_SIGMA * mad)
            .max(self.params.min_spread_ratio * m.abs())
            .max(f64::MIN_POSITIVE);
        let limit = self.params.hampel_k * scale;
        let far = self
            .recent
            .iter()
            .filter(|x| (*x - m).abs() > limit)
            .count();
        if far * 3 >= self.recent.len() {
            return None;
        }
        ((v - m).abs() > limit).then_some(m)
    }

    /// Learns a window's value (the caller offers only windows that did not breach).
    pub fn learn(&mut self, v: f64) -> Learned {
        let replaced = self.outlier(v);
        self.recent.push_back(v);
        while self.recent.len() > self.params.hampel_windows {
            self.recent.pop_front();
        }
        if !self.ready {
            self.warm.push(v);
            if self.warm.len() < self.params.warmup {
                return Learned::Warming;
            }
            // Start from robust estimates of the warm-up, so that one odd first window (start-up
            // work, module loading) does not set the level.
            let (m, mad) = median_mad(self.warm.drain(..));
            self.level = m;
            self.trend = 0.0;
            self.var = (MAD_TO_SIGMA * mad).powi(2);
            self.ready = true;
            return Learned::Ready;
        }
        let x = replaced.unwrap_or(v);
        let p = self.params;
        let forecast = self.level + p.phi * self.trend;
        let err = x - forecast;
        self.var = (1.0 - p.gamma) * self.var + p.gamma * err * err;
        let level = p.alpha * x + (1.0 - p.alpha) * forecast;
        self.trend = p.beta * (level - self.level) + (1.0 - p.beta) * p.phi * self.trend;
        self.level = level;
        if replaced.is_some() {
            Learned::Replaced
        } else {
            Learned::Taken
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn params() -> Params {
        Params {
            warmup: 6,
            alpha: 0.1,
            beta: 0.02,
            phi: 0.9,
            gamma: 0.1,
            min_spread_ratio: 0.02,
            hampel_windows: 9,
            hampel_k: 3.0,
        }
    }

    #[test]
    fn warms_up_from_the_median() {
        let mut b = Baseline::new(params());
        // An odd first window (10x) does not set the level.
        for v in [1000.0, 100.0, 102.0, 98.0, 101.0] {
            assert_eq!(b.learn(v), Learned::Warming);
            assert_eq!(b.p99(), None);
        }
        assert_eq!(b.learn(99.0), Learned::Ready);
        // median 100.5; MAD of [899.5, 0.5, 1.5, 2.5, 0.5, 1.5] = 1.5.
        assert_eq!(b.forecast(), 100.5);
        assert!((b.spread() - 1.4826 * 1.5).abs() < 1e-9, "{}", b.spread());
        assert!((b.p99().unwrap() - (100.5 + 2.326 * 1.4826 * 1.5)).abs() < 1e-9);
    }

    #[test]
    fn an_isolated_outlier_does_not_move_the_baseline() {
        let mut b = Baseline::new(params());
        for v in [100.0, 101.0, 99.0, 100.0, 100.0, 101.0, 99.0, 100.0] {
            b.learn(v);
        }
        let (level, spread) = (b.forecast(), b.spread());
        assert_eq!(b.learn(1000.0), Learned::Replaced);
        assert!(
            (b.forecast() - level).abs() < 0.5,
            "{} vs {level}",
            b.forecast()
        );
        assert!(b.spread() < spread * 1.2, "{} vs {spread}", b.spread());
        assert_eq!(b.learn(100.0), Learned::Taken);
    }

    #[test]
    fn a_series_that_is_often_far_out_widens_instead() {
        let mut b = Baseline::new(params());
        for v in [100.0; 8] {
            b.learn(v);
        }
        // Every other window 10x: after a third of the Hampel window is flagged, they count.
        let mut taken_high = 0;
        for i in 0..40 {
            let v = if i % 2 == 0 { 1000.0 } else { 100.0 };
            if b.learn(v) == Learned::Taken && v > 500.0 {
                taken_high += 1;
            }
        }
        assert!(taken_high >= 15, "{taken_high}");
        assert!(
            b.p99().unwrap() > 1000.0,
            "p99 {} covers the high windows",
            b.p99().unwrap()
        );
    }

    #[test]
    fn follows_a_slow_trend() {
        let mut b = Baseline::new(params());
        for i in 0..200 {
            b.learn(100.0 + i as f64 * 0.5);
        }
        // The series is at ~200 now; the damped trend keeps the forecast close behind it.
        let f = b.forecast();
        assert!((190.0..=205.0).contains(&f), "forecast {f}");
        assert!(b.p99().unwrap() > f);
    }
}
