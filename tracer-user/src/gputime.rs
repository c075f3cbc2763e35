//! A GPU-time estimate per stream, from host-side calls alone (an estimate, not a measurement).
//!
//! Model: work launched on a stream since its last completed wait forms a batch. When a wait
//! that covers the stream returns (`cuStreamSynchronize` on it, `cuCtxSynchronize`, or a
//! synchronous copy on it), the batch is known finished, so the device spent at most
//! `wait_return - first_launch_of_batch` on it: that upper bound is the estimate. It is exact
//! when the stream's queue never ran empty between the first launch and the wait's return, and
//! too high by the idle gaps otherwise. The time the host spent blocked in the wait is measured,
//! not estimated. Event waits and `cuStreamWaitEvent` do not close a batch (which stream an event
//! was recorded on is not traced), and the legacy default stream's implicit synchronization with
//! other streams is not modelled.

use foldhash::HashMap;
use serde::Serialize;
use tracer_common::api::{Kind, Shape};

use crate::events::{Detail, Event};

/// `CU_STREAM_LEGACY`: what stream 0 means for the plain entry points.
const STREAM_LEGACY: u64 = 1;
/// `CU_STREAM_PER_THREAD`: what stream 0 means for `_ptsz`/`_ptds` entry points.
const STREAM_PER_THREAD: u64 = 2;

/// Totals for one stream of one process.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct StreamTime {
    /// Launches seen on the stream.
    pub launches: u64,
    /// Launches whose batch a wait has closed.
    pub launches_completed: u64,
    /// Sum of the estimates of closed batches (upper bound of device time).
    pub gpu_ns_estimate: u64,
    /// Time the host was blocked waiting for this stream (measured).
    pub wait_ns: u64,
    #[serde(skip)]
    pending: u64,
    #[serde(skip)]
    batch_start: Option<u64>,
}

/// What a wait closed, reported on its event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct BatchEstimate {
    /// Launches in the closed batches.
    pub launches: u64,
    /// Estimated device time of those batches (upper bound).
    pub gpu_ns_estimate: u64,
}

/// Stream key: (pid, stream handle, thread for the per-thread default stream).
pub type Key = (u32, u64, u32);

/// The streams of one process, kept together so that a context-wide wait, the per-process total
/// and forgetting an exited process touch only that process.
#[derive(Default)]
struct ProcessStreams {
    /// By (stream handle, thread for the per-thread default stream).
    streams: HashMap<(u64, u32), StreamTime>,
    /// Sum of the streams' `gpu_ns_estimate`.
    gpu_ns_estimate: u64,
}

/// Per-stream estimates of every traced process.
#[derive(Default)]
pub struct GpuTime {
    by_pid: HashMap<u32, ProcessStreams>,
}

fn key(ev: &Event, stream: u64) -> (u64, u32) {
    let per_thread = ev.api.info().per_thread;
    match stream {
        0 if per_thread => (STREAM_PER_THREAD, ev.tid),
        0 => (STREAM_LEGACY, 0),
        STREAM_PER_THREAD => (STREAM_PER_THREAD, ev.tid),
        s => (s, 0),
    }
}

impl GpuTime {
    /// Accounts a launch or a wait; returns what a wait closed.
    pub fn observe(&mut self, ev: &Event) -> Option<BatchEstimate> {
        if ev.result != 0 {
            return None;
        }
        match ev.detail {
            Detail::Launch { stream, .. } | Detail::Graph { stream, .. } => {
                let s = self.by_pid.entry(ev.pid).or_default().streams.entry(key(ev, stream)).or_default();
                s.launches += 1;
                s.pending += 1;
                s.batch_start.get_or_insert(ev.start_ns);
                None
            }
            Detail::Sync { stream: Some(stream), event: None } => Some(self.close(ev, Some(key(ev, stream)))),
            Detail::Sync { stream: None, event: None } if ev.api.info().shape == Shape::CtxSync => {
                Some(self.close(ev, None))
            }
            Detail::Copy { stream: None, .. } if ev.api.info().kind == Kind::Memcpy => {
                Some(self.close(ev, Some(key(ev, 0))))
            }
            _ => None,
        }
    }

    /// Closes the batch of one stream, or of every stream of the process when `only` is None.
    fn close(&mut self, ev: &Event, only: Option<(u64, u32)>) -> BatchEstimate {
        let end = ev.start_ns + ev.duration_ns;
        let mut closed = BatchEstimate { launches: 0, gpu_ns_estimate: 0 };
        let mut account = |s: &mut StreamTime| {
            if let Some(start) = s.batch_start.take() {
                let est = end.saturating_sub(start);
                s.gpu_ns_estimate += est;
                closed.gpu_ns_estimate += est;
            }
            closed.launches += s.pending;
            s.launches_completed += s.pending;
            s.pending = 0;
        };
        let p = self.by_pid.entry(ev.pid).or_default();
        match only {
            Some(k) => {
                let s = p.streams.entry(k).or_default();
                s.wait_ns += ev.duration_ns;
                account(s);
            }
            None => p.streams.values_mut().for_each(&mut account),
        }
        p.gpu_ns_estimate += closed.gpu_ns_estimate;
        closed
    }

    /// Every stream: ((pid, stream, tid), totals).
    pub fn iter(&self) -> impl Iterator<Item = (Key, &StreamTime)> {
        self.by_pid.iter().flat_map(|(pid, p)| p.streams.iter().map(move |((s, t), v)| ((*pid, *s, *t), v)))
    }

    /// The streams of one process: ((pid, stream, tid), totals).
    pub fn of_process(&self, pid: u32) -> impl Iterator<Item = (Key, &StreamTime)> {
        self.by_pid.get(&pid).into_iter().flat_map(move |p| p.streams.iter().map(move |((s, t), v)| ((pid, *s, *t), v)))
    }

    /// A process's estimated device time over all its streams, ns.
    pub fn process_estimate(&self, pid: u32) -> u64 {
        self.by_pid.get(&pid).map_or(0, |p| p.gpu_ns_estimate)
    }

    /// Forgets an exited process.
    pub fn forget(&mut self, pid: u32) {
        self.by_pid.remove(&pid);
    }
}

#[cfg(test)]
mod tests {
    use tracer_common::Api;

    use super::*;

    fn ev(api: Api, start_ns: u64, duration_ns: u64, detail: Detail) -> Event {
        Event { api, pid: 1, tid: 5, comm: "".into(), start_ns, duration_ns, result: 0, detail }
    }
    fn launch(api: Api, start: u64, stream: u64) -> Event {
        ev(api, start, 10, Detail::Launch { function: 1, grid: [1; 3], block: [1; 3], shared_mem_bytes: 0, stream })
    }

    #[test]
    fn stream_sync_closes_its_batch() {
        let mut g = GpuTime::default();
        g.observe(&launch(Api::LaunchKernel, 1_000, 7));
        g.observe(&launch(Api::LaunchKernel, 2_000, 7));
        g.observe(&launch(Api::LaunchKernel, 2_500, 8));
        let sync = ev(Api::StreamSynchronize, 3_000, 5_000, Detail::Sync { stream: Some(7), event: None });
        assert_eq!(g.observe(&sync), Some(BatchEstimate { launches: 2, gpu_ns_estimate: 7_000 }));
        let s7 = g.iter().find(|(k, _)| k.1 == 7).unwrap().1;
        assert_eq!((s7.launches_completed, s7.wait_ns, s7.gpu_ns_estimate), (2, 5_000, 7_000));
        // The context wait closes stream 8 too; stream 7 has nothing pending.
        let ctx = ev(Api::CtxSynchronize, 9_000, 1_000, Detail::Sync { stream: None, event: None });
        assert_eq!(g.observe(&ctx), Some(BatchEstimate { launches: 1, gpu_ns_estimate: 7_500 }));
        assert_eq!(g.process_estimate(1), 14_500);
        assert_eq!(g.of_process(1).count(), 2);
        g.forget(1);
        assert_eq!((g.process_estimate(1), g.iter().count()), (0, 0));
    }

    #[test]
    fn per_thread_default_stream_is_its_own() {
        let mut g = GpuTime::default();
        g.observe(&launch(Api::LaunchKernelPtsz, 100, 0));
        g.observe(&launch(Api::LaunchKernel, 100, 0));
        let sync = ev(Api::StreamSynchronizePtsz, 200, 50, Detail::Sync { stream: Some(0), event: None });
        assert_eq!(g.observe(&sync), Some(BatchEstimate { launches: 1, gpu_ns_estimate: 150 }));
        let copy = ev(Api::MemcpyDtoH, 300, 50, Detail::Copy { bytes: 1, direction: "dtoh", dst: 0, src: 0, stream: None });
        assert_eq!(g.observe(&copy), Some(BatchEstimate { launches: 1, gpu_ns_estimate: 250 }));
    }
}
