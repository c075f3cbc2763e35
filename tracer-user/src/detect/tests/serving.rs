//! What serving stacks call, as the detector's window counts it: stream joins are no wait, a
//! graph's kernels are work but no launches, and an async copy completed by a wait is a
//! synchronous copy.
use tracer_common::Api;

use crate::{
    detect::signals::{Signal, Window},
    enrich::{
        gputime::{BatchEstimate, SyncedCopies},
        graphs::Node,
    },
    event::{Detail, Event},
};

#[test]
fn stream_joins_alone_give_no_wait_per_launch() {
    let mut w = Window::new();
    for _ in 0..50 {
        w.observe(&Event::launch(Api::LaunchKernel, 1, 1, 7), None);
        let join = Event::of(
            Api::StreamWaitEvent,
            1,
            Detail::Sync {
                stream: Some(8),
                event: Some(0xe1),
            },
        )
        .timed(0, 3_000);
        w.observe(&join, None);
    }
    assert_eq!((w.launches, w.waits, w.wait_ns), (50, 0, 0));
    assert_eq!(w.value(Signal::WaitPerLaunch, 10), None);
}

#[test]
fn graph_kernels_are_work_not_launches() {
    let mut w = Window::new();
    let replay = Event::of(
        Api::GraphLaunch,
        1,
        Detail::Graph {
            graph_exec: 0xe0,
            stream: 7,
        },
    );
    w.observe(&replay, None);
    w.add_graph(&[
        Node {
            function: 1,
            threads: 512,
        },
        Node {
            function: 2,
            threads: 256,
        },
    ]);
    assert_eq!((w.launches, w.graph_launches, w.threads), (1, 1, 768));
    assert_eq!(w.kernels.get(&1), Some(&(1, 512)));
}

#[test]
fn async_copies_a_wait_completed_give_copy_time_per_mib() {
    let mut w = Window::new();
    let sync = Event::of(
        Api::StreamSynchronize,
        1,
        Detail::Sync {
            stream: Some(7),
            event: None,
        },
    );
    for _ in 0..10 {
        let closed = BatchEstimate {
            launches: 0,
            span_ns: 200_000,
            batches: 1,
            copies: Some(SyncedCopies {
                bytes: 2 << 20,
                ns: 200_000,
                copies: 1,
            }),
        };
        w.observe(&sync, Some(&closed));
    }
    let (per_mib, n) = w.value(Signal::CopyTime, 10).expect("a value");
    assert_eq!(n, 10);
    assert!((per_mib - 100_000.0).abs() < 1e-6, "{per_mib} ns per MiB");
}
