//! Launches a uprobe session counted at entry without their return (`UNTIMED_BUCKET` cells):
//! their count and threads are exact, their durations and results unknown. Each harvest spreads
//! them over the latency buckets of the sampled launches of the same kernel, in proportion, so
//! that counts stay exact and quantiles are those of the sample (the seeds' "1% above 100 QPS").
//! The shape is, first found: the kernel's sampled launches in this harvest, in all harvests so
//! far, then its process and entry point's in this harvest, in all. Their failures are estimates
//! (the sample's failure rate), kept apart from the failures seen.
use std::collections::BTreeMap;

use foldhash::HashMap;
use tracer_common::{
    launches::{LaunchCell, LaunchKey, OVERFLOW_BUCKET, UNTIMED_BUCKET},
    Api,
};

use crate::event::LaunchDelta;

/// One kernel's untimed launches gained in a harvest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Untimed {
    /// The process.
    pub pid: u32,
    /// The entry point.
    pub api: Api,
    /// The kernel handle.
    pub function: u64,
    /// Launches.
    pub count: u64,
    /// Threads they asked for.
    pub threads: u64,
}

/// Per latency bucket: (launches, their ns, their failures).
type Shape = BTreeMap<u32, (u64, u64, u64)>;
/// One bucket's part of a split: (bucket, launches given, remainder, the shape's counts).
type Part = (u32, u64, u128, (u64, u64, u64));
/// Shapes per (process, entry point, kernel or `None` for all of them).
type Shapes = HashMap<(u32, u16, Option<u64>), Shape>;

fn add_to(shapes: &mut Shapes, pid: u32, api: u16, function: u64, bucket: u32, c: (u64, u64, u64)) {
    for f in [Some(function), None] {
        let e = shapes
            .entry((pid, api, f))
            .or_default()
            .entry(bucket)
            .or_default();
        e.0 = e.0.saturating_add(c.0);
        e.1 = e.1.saturating_add(c.1);
        e.2 = e.2.saturating_add(c.2);
    }
}

/// The sampled launches of this harvest (`gained`) and of all so far (`all`, the last cells
/// read), as shapes.
fn shapes(gained: &[(u32, LaunchDelta)], all: &HashMap<LaunchKey, LaunchCell>) -> (Shapes, Shapes) {
    let mut now = Shapes::default();
    for (pid, d) in gained.iter().filter(|(_, d)| d.untimed == 0) {
        let c = (d.count, d.sum_ns, d.errors);
        add_to(&mut now, *pid, d.api as u16, d.function, d.bucket, c);
    }
    let mut ever = Shapes::default();
    for (k, c) in all {
        if k.bucket != UNTIMED_BUCKET && k.bucket != OVERFLOW_BUCKET {
            let c = (c.count, c.sum_ns, c.errors);
            add_to(&mut ever, k.pid, k.api, k.function, u32::from(k.bucket), c);
        }
    }
    (now, ever)
}

/// `untimed` spread over the shapes of `gained` and `all` (see the module's text).
pub fn spread(
    untimed: &[Untimed],
    gained: &[(u32, LaunchDelta)],
    all: &HashMap<LaunchKey, LaunchCell>,
) -> Vec<(u32, LaunchDelta)> {
    if untimed.is_empty() {
        return Vec::new();
    }
    let (now, ever) = shapes(gained, all);
    let mut out = Vec::new();
    for u in untimed {
        let (pid, api) = (u.pid, u.api as u16);
        let shape = [
            now.get(&(pid, api, Some(u.function))),
            ever.get(&(pid, api, Some(u.function))),
            now.get(&(pid, api, None)),
            ever.get(&(pid, api, None)),
        ]
        .into_iter()
        .flatten()
        .find(|s| s.values().any(|c| c.0 > 0));
        out.extend(split(u, shape).into_iter().map(|d| (pid, d)));
    }
    out
}

/// One kernel's untimed launches split by `shape` (largest remainders, so the parts add up to
/// the count); with no shape at all (nothing of its process ever sampled), in the first bucket.
fn split(u: &Untimed, shape: Option<&Shape>) -> Vec<LaunchDelta> {
    let delta = |bucket, count, sum_ns, errors| LaunchDelta {
        api: u.api,
        function: u.function,
        bucket,
        count,
        errors: 0,
        sum_ns,
        threads: 0,
        untimed: count,
        estimated_errors: errors,
    };
    let Some(shape) = shape else {
        return vec![LaunchDelta {
            threads: u.threads,
            ..delta(0, u.count, 0, 0)
        }];
    };
    let total: u128 = shape.values().map(|c| u128::from(c.0)).sum();
    let n = u128::from(u.count);
    let mut parts: Vec<Part> = shape
        .iter()
        .map(|(b, c)| {
            let exact = n * u128::from(c.0);
            (*b, (exact / total) as u64, exact % total, *c)
        })
        .collect();
    let mut left = u.count - parts.iter().map(|p| p.1).sum::<u64>();
    let mut order: Vec<usize> = (0..parts.len()).collect();
    order.sort_by(|a, b| parts[*b].2.cmp(&parts[*a].2).then(a.cmp(b)));
    for i in order {
        if left == 0 {
            break;
        }
        parts[i].1 += 1;
        left -= 1;
    }
    let mut out: Vec<LaunchDelta> = parts
        .into_iter()
        .filter(|p| p.1 > 0)
        .map(|(b, k, _, (count, sum, errors))| {
            let k128 = u128::from(k);
            let mean = u128::from(sum) / u128::from(count.max(1));
            let failed = k128 * u128::from(errors) / u128::from(count.max(1));
            delta(b, k, (k128 * mean) as u64, failed as u64)
        })
        .collect();
    // The threads are the kernel's, not a bucket's: carried by the largest part.
    if let Some(top) = out.iter_mut().max_by_key(|d| d.count) {
        top.threads = u.threads;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampled(function: u64, bucket: u32, count: u64, sum_ns: u64, errors: u64) -> LaunchDelta {
        LaunchDelta {
            api: Api::LaunchKernel,
            function,
            bucket,
            count,
            errors,
            sum_ns,
            threads: 0,
            untimed: 0,
            estimated_errors: 0,
        }
    }

    fn untimed(function: u64, count: u64) -> Untimed {
        Untimed {
            pid: 7,
            api: Api::LaunchKernel,
            function,
            count,
            threads: count * 64,
        }
    }

    #[test]
    fn the_count_is_spread_by_the_sample_and_adds_up() {
        // 99 launches sampled: 90 fast, 9 slow; 9,901 untimed: 9,001 fast and 900 slow.
        let gained = vec![
            (7, sampled(0xf, 300, 90, 90 * 4_000, 0)),
            (7, sampled(0xf, 500, 9, 9 * 40_000, 9)),
        ];
        let out = spread(&[untimed(0xf, 9_901)], &gained, &HashMap::default());
        let got: Vec<_> = out
            .iter()
            .map(|(p, d)| {
                (
                    *p,
                    d.bucket,
                    d.count,
                    d.sum_ns,
                    d.untimed,
                    d.estimated_errors,
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                (7, 300, 9_001, 9_001 * 4_000, 9_001, 0),
                (7, 500, 900, 900 * 40_000, 900, 900)
            ]
        );
        assert_eq!(out.iter().map(|(_, d)| d.threads).sum::<u64>(), 9_901 * 64);
        assert!(out.iter().all(|(_, d)| d.errors == 0));
    }

    #[test]
    fn a_kernel_not_sampled_now_takes_its_past_then_its_process() {
        let key = |function, bucket| LaunchKey {
            pid: 7,
            api: Api::LaunchKernel as u16,
            bucket,
            function,
        };
        let cell = |count, sum_ns| LaunchCell {
            count,
            errors: 0,
            sum_ns,
            threads: 0,
        };
        let mut all = HashMap::default();
        all.insert(key(0xa, 200), cell(10, 10 * 2_000));
        all.insert(key(0xa, UNTIMED_BUCKET), cell(1_000, 0));
        let gained = vec![(7, sampled(0xb, 400, 5, 5 * 30_000, 0))];
        let out = spread(&[untimed(0xa, 50), untimed(0xc, 6)], &gained, &all);
        let got: Vec<_> = out
            .iter()
            .map(|(_, d)| (d.function, d.bucket, d.count))
            .collect();
        // 0xa: its own past (bucket 200); 0xc, never sampled: its process's launches now.
        assert_eq!(got, [(0xa, 200, 50), (0xc, 400, 6)]);
        // Nothing of the process ever sampled: the first bucket, still counted.
        let lone = spread(&[untimed(0xd, 3)], &[], &HashMap::default());
        assert_eq!(lone[0].1.count, 3);
        assert_eq!(lone[0].1.bucket, 0);
    }

    #[test]
    fn remainders_go_to_the_largest_fractions() {
        let gained = vec![
            (7, sampled(1, 100, 1, 10, 0)),
            (7, sampled(1, 101, 1, 11, 0)),
            (7, sampled(1, 102, 1, 12, 0)),
        ];
        let out = spread(&[untimed(1, 10)], &gained, &HashMap::default());
        let counts: Vec<u64> = out.iter().map(|(_, d)| d.count).collect();
        assert_eq!(counts, [4, 3, 3]);
    }
}
