//! The registry's tests: admission, eviction, retention, bounds.
use super::*;

fn limits(max: usize, retain_s: u64) -> RegistryLimits {
    RegistryLimits {
        max_processes: max,
        retain_exited: Duration::from_secs(retain_s),
    }
}

fn add(r: &mut Registry, pid: u32, last_seen_ns: u64) {
    r.insert(pid, Comm::from("job"), Identity::default())
        .last_seen_ns = last_seen_ns;
}

#[test]
fn the_exited_go_first_then_the_longest_idle() {
    let mut r = Registry::new(limits(3, 600));
    add(&mut r, 1, 10);
    add(&mut r, 2, 5);
    add(&mut r, 3, 20);
    assert!(r.exit(3, |_| {}));
    add(&mut r, 4, 30);
    assert_eq!((r.len(), r.evicted), (3, 1));
    assert!(
        r.get(3).is_none(),
        "the exited process goes before idle live ones"
    );
    add(&mut r, 5, 40);
    assert!(r.get(2).is_none(), "then the longest idle");
    assert_eq!(r.evicted, 2);
}

#[test]
fn a_lost_exit_or_a_reused_pid_is_found_by_the_start_time() {
    let mut r = Registry::new(limits(10, 600));
    for (pid, start) in [(1, 100), (2, 200), (3, 300)] {
        r.insert(
            pid,
            Comm::from("job"),
            Identity {
                start_time: start,
                ..Identity::default()
            },
        );
    }
    r.insert(4, Comm::from("job"), Identity::default());
    // 1 runs on, 2's pid is another process now, 3 is gone; 4's start time is unknown.
    let now = |pid| match pid {
        1 => Some(100),
        2 => Some(250),
        _ => None,
    };
    let mut stale = r.stale(now);
    stale.sort();
    assert_eq!(stale, vec![2, 3]);
}

#[test]
fn table_overflows_outlive_the_process() {
    let mut r = Registry::new(limits(10, 0));
    add(&mut r, 1, 1);
    r.live_mut(1).unwrap().streams.overflowed = 4;
    add(&mut r, 2, 1);
    r.live_mut(2).unwrap().kernels.overflowed = 2;
    assert_eq!(r.overflows(), [2, 0, 4, 0, 0, 0]);
    r.exit(1, |_| {});
    assert_eq!(
        (r.len(), r.overflows()),
        (1, [2, 0, 4, 0, 0, 0]),
        "released, still counted"
    );
}

#[test]
fn exit_marks_then_retention_drops_and_a_reused_pid_is_new() {
    let mut r = Registry::new(limits(10, 600));
    add(&mut r, 7, 1);
    let mut seen = 0;
    assert!(r.exit(7, |p| seen = p.pid));
    assert_eq!(seen, 7);
    assert!(!r.exit(7, |_| {}), "an exit is handled once");
    assert!(
        r.live_mut(7).is_none() && r.get(7).is_some(),
        "kept for the retention time"
    );
    add(&mut r, 7, 2);
    assert!(
        r.live_mut(7).is_some(),
        "the pid was reused by a new process"
    );
    let mut gone = Registry::new(limits(10, 0));
    add(&mut gone, 1, 1);
    gone.exit(1, |_| {});
    assert_eq!(
        gone.len(),
        0,
        "without retention an exited process goes at once"
    );
}

#[test]
fn kernel_names_of_all_processes_stay_within_the_total() {
    use crate::enrich::kernels::{MAX_PROCESS_BYTES, MAX_TOTAL_BYTES};
    use crate::event::Detail;
    let mut r = Registry::new(limits(10, 600));
    let name = "x".repeat(254);
    let lookup = |pid, handle| {
        let d = Detail::Lookup {
            handle,
            source: 1,
            name: Some(name.clone()),
        };
        Event::of(tracer_common::Api::ModuleGetFunction, pid, d)
    };
    add(&mut r, 1, 0);
    r.live_mut(1).unwrap().enrich(&lookup(1, 7));
    // Five tenants, each a new handle per lookup, each to its own limit.
    for pid in 2..=6 {
        add(&mut r, pid, 0);
        for h in 1..=(MAX_PROCESS_BYTES / 572 + 1) as u64 {
            r.live_mut(pid).unwrap().enrich(&lookup(pid, h));
            r.bound_kernel_names();
        }
    }
    let held: usize = r.by_pid.values().map(|p| p.kernels.bytes()).sum();
    assert_eq!(held, r.kernel_name_bytes());
    assert!(held <= MAX_TOTAL_BYTES, "{held}");
    assert_eq!(
        r.get(1).unwrap().kernels.bytes(),
        572,
        "the small table is untouched"
    );
    assert!(r.overflows()[0] > 0);
    assert!(r.exit(6, |_| {}));
    assert!(r.kernel_name_bytes() < held);
}
