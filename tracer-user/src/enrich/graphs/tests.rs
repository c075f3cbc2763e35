use tracer_common::Api;

use super::*;

fn call(api: Api, tid: u32, detail: Detail) -> Event {
    let mut e = Event::of(api, 1, detail);
    e.tid = tid;
    e
}

fn launch(function: u64, stream: u64, tid: u32) -> Event {
    let mut e = Event::launch(Api::LaunchKernel, 1, function, stream);
    e.tid = tid;
    e
}

fn begin(stream: u64) -> Event {
    call(
        Api::StreamBeginCapture,
        1,
        Detail::Capture { stream, graph: 0 },
    )
}

fn end(stream: u64, graph: u64) -> Event {
    call(Api::StreamEndCapture, 1, Detail::Capture { stream, graph })
}

fn build(api: Api, graph_exec: u64, graph: u64) -> Event {
    call(api, 1, Detail::GraphBuild { graph_exec, graph })
}

fn replay(graph_exec: u64, stream: u64) -> Event {
    call(Api::GraphLaunch, 1, Detail::Graph { graph_exec, stream })
}

fn functions(c: &Composition) -> Vec<u64> {
    c.iter().map(|n| n.function).collect()
}

#[test]
fn captured_launches_run_at_each_replay_and_not_at_capture() {
    let mut g = Graphs::default();
    assert!(!g.observe(&begin(7)).captured);
    for f in 1..=5 {
        assert!(
            g.observe(&launch(f, 7, 1)).captured,
            "kernel {f} is recorded, not run"
        );
    }
    // Another thread launching on another stream meanwhile runs its kernel.
    assert!(!g.observe(&launch(9, 8, 2)).captured);
    g.observe(&end(7, 0x6a));
    g.observe(&build(Api::GraphInstantiateWithFlags, 0xe0, 0x6a));
    for _ in 0..3 {
        let runs = g.observe(&replay(0xe0, 7)).runs.expect("known composition");
        assert_eq!(functions(&runs), vec![1, 2, 3, 4, 5]);
    }
    // After the end, launches on the stream run.
    assert!(!g.observe(&launch(1, 7, 1)).captured);
    assert_eq!((g.replays, g.unknown_replays), (3, 0));
    assert_eq!(
        g.line(1).as_deref(),
        Some("graphs: pid=1 captured=1 replays=3 unknown_composition=0")
    );
}

#[test]
fn a_stream_joined_by_an_event_captures_into_the_same_graph() {
    let mut g = Graphs::default();
    g.observe(&begin(7));
    g.observe(&launch(1, 7, 1));
    assert!(
        g.observe(&call(
            Api::EventRecord,
            1,
            Detail::Record {
                event: 0xaa,
                stream: 7
            }
        ))
        .captured
    );
    let join = call(
        Api::StreamWaitEvent,
        1,
        Detail::Sync {
            stream: Some(8),
            event: Some(0xaa),
        },
    );
    assert!(g.observe(&join).captured);
    assert!(
        g.observe(&launch(2, 8, 1)).captured,
        "stream 8 joined the capture"
    );
    g.observe(&end(7, 0x6a));
    assert!(
        !g.observe(&launch(3, 8, 1)).captured,
        "the end releases joined streams"
    );
    g.observe(&build(Api::GraphInstantiateWithParams, 0xe0, 0x6a));
    let runs = g.observe(&replay(0xe0, 0)).runs.unwrap();
    assert_eq!(functions(&runs), vec![1, 2]);
}

#[test]
fn an_unknown_graph_is_counted_not_guessed_and_an_update_gives_a_new_composition() {
    let mut g = Graphs::default();
    // Captured before tracing began: nothing known of 0xe9.
    assert!(g.observe(&replay(0xe9, 7)).runs.is_none());
    assert_eq!((g.replays, g.unknown_replays), (1, 1));
    g.observe(&begin(7));
    g.observe(&launch(4, 7, 1));
    g.observe(&end(7, 0x6b));
    g.observe(&build(Api::GraphExecUpdate, 0xe9, 0x6b));
    assert_eq!(
        functions(&g.observe(&replay(0xe9, 7)).runs.unwrap()),
        vec![4]
    );
    // A failed end makes no graph; the stream's capture is over all the same.
    g.observe(&begin(7));
    g.observe(&launch(5, 7, 1));
    let mut failed = end(7, 0);
    failed.result = 901;
    g.observe(&failed);
    assert!(!g.observe(&launch(5, 7, 1)).captured);
}

#[test]
fn per_thread_default_streams_capture_apart() {
    let mut g = Graphs::default();
    let mut b = call(
        Api::StreamBeginCapturePtsz,
        1,
        Detail::Capture {
            stream: 0,
            graph: 0,
        },
    );
    b.tid = 11;
    g.observe(&b);
    let mut on = Event::launch(Api::LaunchKernelPtsz, 1, 1, 0);
    on.tid = 11;
    let mut other = Event::launch(Api::LaunchKernelPtsz, 1, 1, 0);
    other.tid = 12;
    assert!(g.observe(&on).captured);
    assert!(
        !g.observe(&other).captured,
        "another thread's default stream"
    );
}

#[test]
fn captures_and_graphs_are_bounded() {
    let mut g = Graphs::default();
    for s in 0..(MAX_CAPTURES as u64 + 3) {
        g.observe(&begin(100 + s));
    }
    assert_eq!(g.overflowed, 3);
    let mut g = Graphs::default();
    g.observe(&begin(7));
    for f in 0..(MAX_NODES as u64 + 1) {
        g.observe(&launch(f, 7, 1));
    }
    g.observe(&end(7, 0x6a));
    g.observe(&build(Api::GraphInstantiateWithFlags, 0xe0, 0x6a));
    assert!(
        g.observe(&replay(0xe0, 7)).runs.is_none(),
        "too large: unknown"
    );
    assert_eq!(g.unknown_replays, 1);
}

#[test]
fn the_nodes_a_process_records_over_its_life_are_bounded() {
    let mut g = Graphs::default();
    let per = MAX_NODES as u64;
    let graphs = (MAX_RECORDED_NODES / MAX_NODES) as u64;
    for i in 0..=graphs {
        g.observe(&begin(7));
        for f in 0..per {
            g.observe(&launch(f, 7, 1));
        }
        g.observe(&end(7, 0x100 + i));
        g.observe(&build(Api::GraphInstantiateWithFlags, 0xe00 + i, 0x100 + i));
    }
    assert!(
        g.observe(&replay(0xe00, 7)).runs.is_some(),
        "within the budget"
    );
    assert!(
        g.observe(&replay(0xe00 + graphs, 7)).runs.is_none(),
        "past the budget: unknown"
    );
    assert_eq!(g.recorded, MAX_RECORDED_NODES);
}
