//! Latency sketches of one (process, api) over sliding windows: 10 s slices for the last minute,
//! 60 s slices for the last five, and the total since start.
use std::collections::VecDeque;

use hdrhistogram::Histogram;

use super::sketch::AGGREGATE;

/// Latency sketches of one (process, api): per 10 s slice for the 1-minute window, per 60 s slice
/// for the 5-minute one, and since start. A call is recorded once, in its 10 s slice; a slice is
/// added into its minute and into the total when the next one begins (or at scrape time, for the
/// newest), which keeps the cost per event to one record.
pub struct Windows {
    all: Histogram<u32>,
    /// 10-second slices, newest last, covering at most the last minute.
    short: VecDeque<(u64, Histogram<u32>)>,
    /// 60-second slices, newest last, covering at most the last five minutes.
    long: VecDeque<(u64, Histogram<u32>)>,
}

fn slice_for(
    slices: &mut VecDeque<(u64, Histogram<u32>)>,
    index: u64,
    keep: u64,
) -> &mut Histogram<u32> {
    while slices.front().is_some_and(|(i, _)| *i + keep <= index) {
        slices.pop_front();
    }
    if slices.back().is_none_or(|(i, _)| *i != index) {
        slices.push_back((index, AGGREGATE.sketch()));
    }
    &mut slices.back_mut().expect("just pushed").1
}

impl Windows {
    pub fn new() -> Self {
        Windows {
            all: AGGREGATE.sketch(),
            short: VecDeque::new(),
            long: VecDeque::new(),
        }
    }

    /// Records a call that ended `secs` after start (non-decreasing from call to call).
    pub fn record(&mut self, secs: u64, ns: u64) {
        self.record_n(secs, ns, 1);
    }

    /// Records `n` calls of `ns` each that ended `secs` after start.
    pub fn record_n(&mut self, secs: u64, ns: u64, n: u64) {
        let units = AGGREGATE.units(ns);
        let index = secs / 10;
        if self.short.back().is_some_and(|(i, _)| *i != index) {
            // The newest slice is complete: fold it into its minute and the total.
            let (i, done) = self.short.back().expect("checked");
            let _ = self.all.add(done);
            let _ = slice_for(&mut self.long, i / 6, 5).add(done);
        }
        let _ = slice_for(&mut self.short, index, 6)
            .record_n(units, u32::try_from(n).unwrap_or(u32::MAX));
    }

    /// The sketch over the last `window` seconds (60 or 300), or since start.
    pub fn merged(&self, now_secs: u64, window: Option<u64>) -> Option<Histogram<u32>> {
        let newest = self.short.back();
        let mut h = AGGREGATE.sketch();
        match window {
            None => {
                h.add(&self.all).ok()?;
                if let Some((_, s)) = newest {
                    h.add(s).ok()?;
                }
            }
            Some(60) => {
                for (i, s) in &self.short {
                    // A slice counts while any of it lies inside the window.
                    if (i + 1) * 10 + 60 > now_secs {
                        h.add(s).ok()?;
                    }
                }
            }
            Some(horizon) => {
                for (i, s) in &self.long {
                    if (i + 1) * 60 + horizon > now_secs {
                        h.add(s).ok()?;
                    }
                }
                // The newest 10 s slice is not folded into its minute yet.
                if let Some((_, s)) = newest.filter(|(i, _)| (i + 1) * 10 + horizon > now_secs) {
                    h.add(s).ok()?;
                }
            }
        }
        (!h.is_empty()).then_some(h)
    }
}

impl Default for Windows {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use hdrhistogram::Histogram;

    use super::*;

    #[test]
    fn slices_fold_into_minutes_and_the_total() {
        let mut w = Windows::new();
        for (secs, ns) in [
            (5, 1_000),
            (15, 2_000),
            (65, 3_000),
            (130, 4_000),
            (400, 5_000),
        ] {
            w.record(secs, ns);
        }
        let count = |h: Option<Histogram<u32>>| h.map_or(0, |h| h.len());
        assert_eq!(count(w.merged(405, None)), 5);
        // The last minute: the call at 400 s only.
        assert_eq!(count(w.merged(405, Some(60))), 1);
        // The last five minutes: minutes 1 and 2 (folded) and the newest slice; minute 0 is out.
        assert_eq!(count(w.merged(405, Some(300))), 3);
        assert_eq!(
            w.merged(405, Some(300)).unwrap().min(),
            30,
            "3 µs in 100 ns units"
        );
        assert_eq!(count(w.merged(1000, Some(60))), 0);
    }
}
