use tracer_common::Api;

use super::*;

fn launch(api: Api, start: u64, stream: u64) -> Event {
    Event::launch(api, 1, 1, stream).timed(start, 10)
}

fn sync(api: Api, stream: Option<u64>, event: Option<u64>) -> Event {
    Event::of(api, 1, Detail::Sync { stream, event })
}

fn record(event: u64, stream: u64, at: u64) -> Event {
    Event::of(Api::EventRecord, 1, Detail::Record { event, stream }).timed(at, 10)
}

fn poll(event: u64, not_ready: u32) -> Event {
    let mut p = Event::of(
        Api::EventQuery,
        1,
        Detail::Poll {
            stream: None,
            event: Some(event),
        },
    );
    p.not_ready = not_ready;
    p
}

#[test]
fn stream_sync_closes_its_batch() {
    let mut g = Streams::default();
    g.observe(&launch(Api::LaunchKernel, 1_000, 7), false);
    g.observe(&launch(Api::LaunchKernel, 2_000, 7), false);
    g.observe(&launch(Api::LaunchKernel, 2_500, 8), false);
    let s = sync(Api::StreamSynchronize, Some(7), None).timed(3_000, 50_000);
    assert_eq!(
        g.observe(&s, false),
        Some(BatchEstimate {
            launches: 2,
            span_ns: 52_000,
            batches: 1,
            copies: None
        })
    );
    let s7 = g.sorted().into_iter().find(|(k, _)| k.0 == 7).unwrap().1;
    assert_eq!(
        (s7.launches_completed, s7.wait_ns, s7.span_ns),
        (2, 50_000, 52_000)
    );
    // The context wait closes stream 8 too; stream 7 has nothing pending.
    let ctx = sync(Api::CtxSynchronize, None, None).timed(60_000, 40_000);
    assert_eq!(
        g.observe(&ctx, false)
            .map(|b| (b.launches, b.span_ns, b.batches)),
        Some((1, 97_500, 1))
    );
    assert_eq!((g.span_ns(), g.wait_ns()), (149_500, 90_000));
    assert_eq!(g.sorted().len(), 2);
    assert_eq!(g.lines(1)[0], "device time: pid=1 stream=0x7 launches=2 completed=2 batches=1 batch_span_ns=52000 host_wait_ns=50000");
}

#[test]
fn a_wait_that_did_not_block_leaves_the_host_gap_out() {
    // One launch, 10 s of host work, then a wait that returns at once: the device ran the
    // launch, not the 10 s.
    let mut g = Streams::default();
    g.observe(&launch(Api::LaunchKernel, 1_000, 7), false);
    let s = sync(Api::StreamSynchronize, Some(7), None).timed(10_000_001_000, 2_000);
    assert_eq!(g.observe(&s, false).map(|b| b.span_ns), Some(2_010));
    assert_eq!(g.wait_ns(), 2_000);
    // The thread's last launch, which the kernel counted without a record, ends the span.
    g.observe(&launch(Api::LaunchKernel, 20_000_000_000, 7), false);
    let mut s = sync(Api::StreamSynchronize, Some(7), None).timed(30_000_000_000, 1_000);
    s.thread_launch_ns = 20_000_500_000;
    assert_eq!(g.observe(&s, false).map(|b| b.span_ns), Some(501_000));
}

#[test]
fn an_event_sync_closes_the_stream_it_was_recorded_on() {
    let mut g = Streams::default();
    g.observe(&launch(Api::LaunchKernel, 1_000, 7), false);
    g.observe(&launch(Api::LaunchKernel, 1_500, 8), false);
    g.observe(&record(0xe1, 7, 2_000), false);
    let s = sync(Api::EventSynchronize, None, Some(0xe1)).timed(2_100, 2_000_000);
    assert_eq!(
        g.observe(&s, false).map(|b| (b.launches, b.span_ns)),
        Some((1, 2_001_100))
    );
    // Stream 8 is still open; a second sync of the same event closes nothing new.
    assert_eq!(g.open_since(), Some(1_500));
    let again = sync(Api::EventSynchronize, None, Some(0xe1)).timed(3_000_000, 30_000);
    assert_eq!(g.observe(&again, false).map(|b| b.batches), Some(0));
    // An event whose record was not seen closes nothing, and is counted.
    let unknown = sync(Api::EventSynchronize, None, Some(0xe2)).timed(3_000_000, 30_000);
    assert_eq!(g.observe(&unknown, false).map(|b| b.batches), Some(0));
    assert_eq!(g.unmapped_waits, 1);
}

#[test]
fn a_successful_poll_closes_and_its_not_ready_answers_say_it_waited() {
    let mut g = Streams::default();
    g.observe(&launch(Api::LaunchKernel, 1_000, 7), false);
    g.observe(&record(0xe1, 7, 2_000), false);
    // Polled until done: the work ran to the poll's return.
    let p = poll(0xe1, 40).timed(5_000_000, 500);
    assert_eq!(
        g.observe(&p, false)
            .map(|b| (b.launches, b.span_ns, b.batches)),
        Some((1, 5_000_500 - 1_000, 1))
    );
    // A poll that found the work done at once: only up to the last submission.
    g.observe(&launch(Api::LaunchKernel, 6_000_000, 7), false);
    let q = Event::of(
        Api::StreamQuery,
        1,
        Detail::Poll {
            stream: Some(7),
            event: None,
        },
    )
    .timed(9_000_000, 300);
    assert_eq!(g.observe(&q, false).map(|b| b.span_ns), Some(310));
    assert_eq!(g.wait_ns(), 0, "polls are no host wait");
}

#[test]
fn stream_wait_event_and_captured_launches_close_and_open_nothing() {
    let mut g = Streams::default();
    g.observe(&launch(Api::LaunchKernel, 1_000, 7), true);
    assert_eq!(g.open_since(), None, "a captured launch runs nothing");
    let w = sync(Api::StreamWaitEvent, Some(7), Some(0xe1)).timed(2_000, 100);
    assert_eq!(g.observe(&w, false), None);
    assert_eq!(g.wait_ns(), 0);
}

#[test]
fn an_async_copy_then_its_stream_sync_is_one_synchronous_copy() {
    let mut g = Streams::default();
    let copy = Event::of(
        Api::MemcpyDtoHAsync,
        1,
        Detail::Copy {
            bytes: 1 << 20,
            direction: "dtoh",
            dst: 0,
            src: 0,
            stream: Some(7),
        },
    )
    .timed(1_000, 2_000);
    g.observe(&copy, false);
    let s = sync(Api::StreamSynchronize, Some(7), None).timed(3_000, 100_000);
    assert_eq!(
        g.observe(&s, false).and_then(|b| b.copies),
        Some(SyncedCopies {
            bytes: 1 << 20,
            ns: 102_000,
            copies: 1
        })
    );
}

#[test]
fn streams_past_the_cap_share_one_entry() {
    let mut g = Streams::default();
    for s in 10..(10 + MAX_STREAMS as u64 + 7) {
        g.observe(&launch(Api::LaunchKernel, 1, s), false);
    }
    assert_eq!((g.sorted().len(), g.overflowed), (MAX_STREAMS + 1, 7));
    let s = sync(Api::CtxSynchronize, None, None).timed(100, 10);
    assert_eq!(
        g.observe(&s, false).map(|b| b.launches),
        Some(MAX_STREAMS as u64 + 7),
        "every launch still closed"
    );
}

#[test]
fn per_thread_default_stream_is_its_own() {
    let mut g = Streams::default();
    g.observe(&launch(Api::LaunchKernelPtsz, 100, 0), false);
    g.observe(&launch(Api::LaunchKernel, 100, 0), false);
    let s = sync(Api::StreamSynchronizePtsz, Some(0), None).timed(200, 50_000);
    assert_eq!(
        g.observe(&s, false).map(|b| (b.launches, b.span_ns)),
        Some((1, 50_100))
    );
    let copy = Event::of(
        Api::MemcpyDtoH,
        1,
        Detail::Copy {
            bytes: 1,
            direction: "dtoh",
            dst: 0,
            src: 0,
            stream: None,
        },
    )
    .timed(300, 50_000);
    assert_eq!(
        g.observe(&copy, false).map(|b| (b.launches, b.span_ns)),
        Some((1, 50_200))
    );
}

#[test]
fn two_contexts_default_streams_are_apart() {
    let mut g = Streams::default();
    let on = |mut e: Event, context: u64| {
        e.context = context;
        e
    };
    // Stream 0 on two devices' contexts: a sync of one closes its own launch only.
    g.observe(&on(launch(Api::LaunchKernel, 1_000, 0), 0xa), false);
    g.observe(&on(launch(Api::LaunchKernel, 1_500, 0), 0xb), false);
    let s = on(
        sync(Api::StreamSynchronize, Some(0), None).timed(2_000, 8_000),
        0xa,
    );
    assert_eq!(g.observe(&s, false).map(|b| b.launches), Some(1));
    assert_eq!(stream_key(&s, 0), (0xa, 0));
    assert_eq!(stream_key(&on(s.clone(), 0), 0), (STREAM_LEGACY, 0));
    let ptsz = on(launch(Api::LaunchKernelPtsz, 0, 0), 0xb);
    assert_eq!(stream_key(&ptsz, 0), (0xb, 1));
    assert_eq!(stream_key(&ptsz, STREAM_PER_THREAD), (0xb, 1));
    assert_eq!(stream_key(&ptsz, 0x77), (0x77, 0));
    let pending: Vec<(u64, u64)> = g
        .sorted()
        .iter()
        .map(|(k, s)| (k.0, s.launches - s.launches_completed))
        .collect();
    assert_eq!(pending, vec![(0xa, 0), (0xb, 1)]);
}
