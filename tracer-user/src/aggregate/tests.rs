use std::time::Duration;

use super::*;
use crate::{
    identity::Identity,
    registry::{Registry, RegistryLimits},
};

fn launch(pid: u32, ns: u64, function: u64) -> Event {
    Event::launch(Api::LaunchKernel, pid, function, 0).timed(0, ns)
}

fn registry(max_processes: usize) -> Registry {
    Registry::new(RegistryLimits {
        max_processes,
        retain_exited: Duration::from_secs(600),
    })
}

/// Counts one call the way the daemon does: into the process's entry, made on first sight.
fn observe(a: &mut Aggregator, r: &mut Registry, ev: &Event, kernel: Option<&KernelName>) {
    if r.live_mut(ev.pid).is_none() {
        r.insert(ev.pid, ev.comm, Identity::default());
    }
    a.observe(
        &mut r.live_mut(ev.pid).expect("inserted").series,
        ev,
        kernel,
        false,
    );
}

#[test]
fn counts_buckets_and_quantiles() {
    let mut a = Aggregator::new(SeriesLimits {
        top_kernels: 10,
        max_kernels: 100,
    });
    let mut r = registry(10);
    let k = KernelName::new("_Z3addv");
    for i in 0..1000u64 {
        // 990 calls of 2 µs, 10 of 800 µs: p99 falls at the boundary, p50 at 2 µs.
        let ns = if i % 100 == 0 { 800_000 } else { 2_000 };
        observe(&mut a, &mut r, &launch(1, ns, 0x10), Some(&k));
    }
    let series = a.series(r.series());
    assert_eq!(series.len(), 1);
    let s = &series[0];
    assert_eq!((s.series.calls, &*s.kernel), (1000, "add()"));
    assert_eq!(s.series.buckets[1], 990, "2 µs falls in the 2.5 µs bucket");
    assert_eq!(s.series.buckets[9], 10, "800 µs falls in the 1 ms bucket");
    let q = a.quantiles(r.series());
    let get = |w: &str, q0: f64| {
        q.iter()
            .find(|v| v.window == w && v.quantile == q0)
            .unwrap()
            .seconds
    };
    assert!(
        (get("1m", 0.5) - 2e-6).abs() < 0.05e-6,
        "{}",
        get("1m", 0.5)
    );
    assert!((get("all", 0.99) - 2e-6).abs() < 0.05e-6);
    assert!((get("5m", 0.999_f64.min(0.99)) - 2e-6).abs() < 0.05e-6);
}

#[test]
fn kernels_past_the_limits_become_other() {
    let mut a = Aggregator::new(SeriesLimits {
        top_kernels: 2,
        max_kernels: 3,
    });
    let mut r = registry(10);
    // Kernel f spends (f+1) * 1000 ns per call; 5 kernels, the 4th and 5th past max_kernels.
    for f in 0..5u64 {
        let name = KernelName::new(&format!("k{f}"));
        observe(&mut a, &mut r, &launch(7, (f + 1) * 1000, f), Some(&name));
    }
    let mut got: Vec<(String, u64)> = a
        .series(r.series())
        .iter()
        .map(|s| (s.kernel.to_string(), s.series.calls))
        .collect();
    got.sort();
    // Top 2 by time among the 3 tracked are k2 and k1; k0 folds into other with k3 and k4.
    assert_eq!(
        got,
        vec![("k1".into(), 1), ("k2".into(), 1), ("other".into(), 3)]
    );
    r.exit(7, |_| {});
    assert_eq!(r.len(), 1, "kept for the retention time");
    // Past max_processes the exited one goes first.
    for pid in 100..110 {
        observe(&mut a, &mut r, &launch(pid, 1000, 1), None);
    }
    assert_eq!((r.len(), r.evicted), (10, 1));
    assert!(r.iter().all(|p| p.pid != 7));
    r.sweep();
    assert_eq!(r.len(), 10);
}

#[test]
fn untimed_records_count_without_a_duration() {
    let mut a = Aggregator::new(SeriesLimits {
        top_kernels: 10,
        max_kernels: 100,
    });
    let mut r = registry(10);
    let k = KernelName::new("_Z3addv");
    for _ in 0..99 {
        observe(&mut a, &mut r, &launch(1, 2_000, 0x10), Some(&k));
    }
    // A launch written at its entry outside a window, no cell counting it: one call more,
    // untimed, in the first bucket, and no quantile sample of 0 ns.
    let mut untimed = launch(1, 0, 0x10);
    untimed.untimed = true;
    observe(&mut a, &mut r, &untimed, Some(&k));
    let s = &a.series(r.series())[0].series;
    assert_eq!(
        (s.calls, s.untimed, s.buckets[0], s.buckets[1]),
        (100, 1, 1, 99)
    );
    let q = a.quantiles(r.series());
    let p1 = q
        .iter()
        .find(|v| v.window == "all" && v.quantile == 0.5)
        .unwrap()
        .seconds;
    assert!((p1 - 2e-6).abs() < 0.05e-6, "{p1}");
}
