use super::*;

fn queue() -> (Queue, Arc<Stats>, Instant) {
    let stats = Arc::new(Stats::default());
    let now = Instant::now();
    (Queue::new(stats.clone(), now), stats, now)
}

#[test]
fn tenants_take_turns() {
    let (mut q, _, now) = queue();
    for pid in 1..=5 {
        q.offer(pid, 7, now);
    }
    q.offer(100, 9, now);
    q.offer(200, 11, now);
    let due = q.due(now);
    assert_eq!(due.len(), 7);
    // The first round has one process of each tenant: the other tenants' wait one read at
    // most behind the flooding one's, however many it queued.
    let first: std::collections::HashSet<u32> = due[..3].iter().copied().collect();
    assert!(first.contains(&100) && first.contains(&200), "{due:?}");
    // The next due list starts after the tenant served last.
    q.done(due[0], Some(true), now);
    let again = q.due(now);
    assert_ne!(q_tenant_of(again[0]), q_tenant_of(due[0]), "{again:?}");
}

fn q_tenant_of(pid: u32) -> u64 {
    match pid {
        100 => 9,
        200 => 11,
        _ => 7,
    }
}

#[test]
fn a_tenant_past_its_share_is_dropped_counted_and_asks_for_a_full_pass() {
    let (mut q, stats, now) = queue();
    for pid in 0..(MAX_PER_TENANT as u32 + 10) {
        q.offer(pid, 7, now);
    }
    assert_eq!(q.waiting(), MAX_PER_TENANT);
    assert_eq!(stats.dropped.load(Ordering::Relaxed), 10);
    assert!(q.take_overflow());
    assert!(!q.take_overflow(), "asked once");
    // Another tenant still gets in.
    q.offer(99_999, 8, now);
    assert_eq!(q.waiting(), MAX_PER_TENANT + 1);
}

#[test]
fn a_process_whose_reads_find_nothing_goes_quiet_doubling() {
    let (mut q, stats, mut now) = queue();
    q.offer(42, 7, now);
    // The first read and its five retries find nothing.
    for k in 0..=RETRIES.len() {
        if k > 0 {
            now += RETRIES[k - 1];
        }
        let due = q.due(now);
        assert_eq!(due, vec![42]);
        q.done(42, Some(false), now);
    }
    assert_eq!(q.waiting(), 0);
    // Opens meanwhile are deferred, and it is read once its quiet second is up.
    let quiet_from = now;
    q.offer(42, 7, now);
    q.offer(42, 7, now);
    assert_eq!(stats.deferred.load(Ordering::Relaxed), 2);
    assert!(q.due(now).is_empty());
    assert!(q.next_due(now).unwrap() <= FIRST_QUIET);
    now = quiet_from + FIRST_QUIET;
    assert_eq!(q.due(now), vec![42]);
    for _ in 0..=RETRIES.len() {
        q.done(42, Some(false), now);
    }
    assert_eq!(q.waiting(), 0);
    // Twice as long the second time.
    q.offer(42, 7, now + FIRST_QUIET);
    assert!(q.due(now + FIRST_QUIET).is_empty());
    assert_eq!(q.due(now + FIRST_QUIET * 2), vec![42]);
    // Mapping a libcuda ends its quiet.
    q.done(42, Some(true), now + FIRST_QUIET * 2);
    q.offer(42, 7, now + FIRST_QUIET * 2);
    assert_eq!(q.due(now + FIRST_QUIET * 2), vec![42]);
}

#[test]
fn the_budget_refills_at_its_rate_and_no_further() {
    let now = Instant::now();
    let mut b = Budget::new(now);
    assert_eq!(b.held(now), CPU_BURST);
    b.spend(CPU_BURST + CPU_PER_SECOND);
    assert!(!b.left_over(now, Duration::ZERO));
    // Overdrawn by a second's worth: a second to get back to zero.
    let w = b.wait(now, Duration::ZERO);
    assert!(
        w >= Duration::from_secs(1) && w <= Duration::from_millis(1002),
        "{w:?}"
    );
    assert!(b.left_over(now + Duration::from_millis(1100), Duration::ZERO));
    assert_eq!(b.held(now + Duration::from_secs(3600)), CPU_BURST);
}

#[test]
fn a_load_the_kernel_saw_is_read_at_once_even_when_quiet() {
    let (mut q, stats, mut now) = queue();
    q.offer(42, 7, now);
    for k in 0..=RETRIES.len() {
        if k > 0 {
            now += RETRIES[k - 1];
        }
        assert_eq!(q.due(now), vec![42]);
        q.done(42, Some(false), now);
    }
    // Quiet now: an open waits, a load of a libcuda does not.
    q.offer(42, 7, now);
    assert!(q.due(now).is_empty());
    assert_eq!(stats.deferred.load(Ordering::Relaxed), 1);
    q.offer_now(42, 7, now);
    assert_eq!(q.due(now), vec![42]);
    // Its tenant's share still holds.
    let (mut q, stats, now) = queue();
    for pid in 0..(MAX_PER_TENANT as u32 + 3) {
        q.offer_now(pid, 7, now);
    }
    assert_eq!(q.waiting(), MAX_PER_TENANT);
    assert_eq!(stats.dropped.load(Ordering::Relaxed), 3);
}
