//! The failed calls of one series: how many per `CUresult` (bounded), and their durations, so
//! that latency splits by outcome (golden signals: a failing call's time is not the service's).
use super::{bucket_index, BUCKETS};

/// Distinct `CUresult`s kept per series; further ones are counted under [`RESULT_OTHER`] (one
/// more label value).
pub const MAX_RESULTS: usize = 8;
/// The result key of failures past [`MAX_RESULTS`] distinct ones.
pub const RESULT_OTHER: i32 = i32::MIN;

/// Failed calls of one series (made on the first failure).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Failed {
    /// Failures by result, as the records named them, first seen first.
    pub by_result: Vec<(i32, u64)>,
    /// Sum of failed calls' durations, ns.
    pub sum_ns: u64,
    /// Failed calls per bucket of [`BUCKETS`] (not cumulative), plus +Inf last.
    pub buckets: [u64; BUCKETS.len() + 1],
}

impl Failed {
    /// Counts `n` failures of `result` (None: counted in-kernel, the result not seen) taking
    /// `sum_ns` in all, in the bucket of `bucket_ns`.
    pub fn add(&mut self, result: Option<i32>, n: u64, sum_ns: u64, bucket_ns: u64) {
        self.sum_ns = self.sum_ns.saturating_add(sum_ns);
        self.buckets[bucket_index(bucket_ns)] += n;
        if let Some(result) = result {
            self.count(result, n);
        }
    }

    /// Counts `n` failures of `result` by name only (their time is counted elsewhere).
    pub fn count(&mut self, result: i32, n: u64) {
        let named = self
            .by_result
            .iter()
            .filter(|(r, _)| *r != RESULT_OTHER)
            .count();
        let key = if named < MAX_RESULTS || self.by_result.iter().any(|(r, _)| *r == result) {
            result
        } else {
            RESULT_OTHER
        };
        match self.by_result.iter_mut().find(|(r, _)| *r == key) {
            Some((_, c)) => *c += n,
            None => self.by_result.push((key, n)),
        }
    }

    /// Adds another series' failures.
    pub fn merge(&mut self, other: &Failed) {
        self.sum_ns = self.sum_ns.saturating_add(other.sum_ns);
        for (a, b) in self.buckets.iter_mut().zip(other.buckets.iter()) {
            *a += b;
        }
        for (r, n) in &other.by_result {
            self.count(*r, *n);
        }
    }

    /// The `result` label of a key: the `CUresult` name, its number when unknown, `other` past
    /// the bound.
    pub fn label(result: i32) -> String {
        match result {
            RESULT_OTHER => "other".to_owned(),
            r => {
                tracer_common::results::result_name(r).map_or_else(|| r.to_string(), str::to_owned)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_are_named_and_bounded() {
        let mut f = Failed::default();
        f.add(Some(2), 1, 500, 500);
        f.add(Some(2), 1, 500, 500);
        for r in 1000..1010 {
            f.add(Some(r), 1, 0, 0);
        }
        assert_eq!(f.by_result.len(), MAX_RESULTS + 1);
        assert_eq!(f.by_result[0], (2, 2));
        assert_eq!(f.by_result.last(), Some(&(RESULT_OTHER, 3)));
        assert_eq!(f.by_result.iter().map(|(_, n)| n).sum::<u64>(), 12);
        assert_eq!((f.sum_ns, f.buckets.iter().sum::<u64>()), (1000, 12));
        let labels: Vec<String> = [2, 1000, RESULT_OTHER].map(Failed::label).into();
        assert_eq!(labels, ["CUDA_ERROR_OUT_OF_MEMORY", "1000", "other"]);
    }
}
