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

use crate::event::{Detail, Event};

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
    /// Batches a wait closed.
    pub batches: u64,
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

/// Streams tracked per process at most; calls on further streams share one overflow entry.
pub const MAX_STREAMS: usize = 1024;
/// The stream key calls past [`MAX_STREAMS`] are accounted under.
const OVERFLOW_STREAM: (u64, u32) = (u64::MAX, 0);

/// The streams of one process (its registry entry holds them), kept together so that a
/// context-wide wait and the per-process total touch only that process.
#[derive(Default)]
pub struct Streams {
    /// Calls on streams past [`MAX_STREAMS`], accounted under one entry.
    pub overflowed: u64,
    /// By (stream handle, thread for the per-thread default stream).
    streams: HashMap<(u64, u32), StreamTime>,
    /// Sum of the streams' `gpu_ns_estimate`.
    gpu_ns_estimate: u64,
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

impl Streams {
    /// Accounts a launch or a wait; returns what a wait closed.
    pub fn observe(&mut self, ev: &Event) -> Option<BatchEstimate> {
        if ev.result != 0 {
            return None;
        }
        match ev.detail {
            Detail::Launch { stream, .. } | Detail::Graph { stream, .. } => {
                let k = self.bounded(key(ev, stream));
                let s = self.streams.entry(k).or_default();
                // A launch the kernel counted is written when it opens a batch (or as a sample):
                // it marks the batch's start; the launches are counted in-kernel.
                if !ev.counted {
                    s.launches += 1;
                    s.pending += 1;
                }
                s.batch_start.get_or_insert(ev.start_ns);
                None
            }
            Detail::Sync {
                stream: Some(stream),
                event: None,
            } => Some(self.close(ev, Some(key(ev, stream)))),
            Detail::Sync {
                stream: None,
                event: None,
            } if ev.api.info().shape == Shape::CtxSync => Some(self.close(ev, None)),
            Detail::Copy { stream: None, .. } if ev.api.info().kind == Kind::Memcpy => {
                Some(self.close(ev, Some(key(ev, 0))))
            }
            _ => None,
        }
    }

    /// Closes the batch of one stream, or of every stream of the process when `only` is None.
    fn close(&mut self, ev: &Event, only: Option<(u64, u32)>) -> BatchEstimate {
        let end = ev.start_ns.saturating_add(ev.duration_ns);
        let mut closed = BatchEstimate {
            launches: 0,
            gpu_ns_estimate: 0,
        };
        let mut account = |s: &mut StreamTime| {
            if let Some(start) = s.batch_start.take() {
                // Saturating: a tenant's calls can claim any start and duration.
                let est = end.saturating_sub(start);
                s.gpu_ns_estimate = s.gpu_ns_estimate.saturating_add(est);
                s.batches += 1;
                closed.gpu_ns_estimate = closed.gpu_ns_estimate.saturating_add(est);
            }
            closed.launches += s.pending;
            s.launches_completed += s.pending;
            s.pending = 0;
        };
        match only {
            Some(k) => {
                let k = self.bounded(k);
                let s = self.streams.entry(k).or_default();
                s.wait_ns = s.wait_ns.saturating_add(ev.duration_ns);
                account(s);
            }
            None => self.streams.values_mut().for_each(&mut account),
        }
        self.gpu_ns_estimate = self.gpu_ns_estimate.saturating_add(closed.gpu_ns_estimate);
        closed
    }

    /// When the oldest batch no wait has closed began (its first launch, CLOCK_MONOTONIC ns).
    pub fn open_since(&self) -> Option<u64> {
        self.streams.values().filter_map(|s| s.batch_start).min()
    }

    /// Every stream: ((stream, tid), totals), in key order.
    pub fn sorted(&self) -> Vec<((u64, u32), &StreamTime)> {
        let mut v: Vec<_> = self.streams.iter().map(|(k, s)| (*k, s)).collect();
        v.sort_by_key(|(k, _)| *k);
        v
    }

    /// `k`, or the overflow entry once [`MAX_STREAMS`] others are tracked.
    fn bounded(&mut self, k: (u64, u32)) -> (u64, u32) {
        if self.streams.len() < MAX_STREAMS || self.streams.contains_key(&k) {
            return k;
        }
        self.overflowed += 1;
        OVERFLOW_STREAM
    }

    /// Forgets the streams (the process exited); the total stays.
    pub fn release(&mut self) {
        self.streams = HashMap::default();
    }

    /// The process's estimated device time over all its streams, ns.
    pub fn estimate_ns(&self) -> u64 {
        self.gpu_ns_estimate
    }

    /// The `gpu-time estimate:` lines printed when the process exits or tracing stops. Launch
    /// counts are those written one record each (all of them in `trace`; `run` counts launches
    /// in-kernel, per kernel, not per stream).
    pub fn lines(&self, pid: u32) -> Vec<String> {
        self.sorted()
            .into_iter()
            .map(|((stream, tid), s)| {
                format!(
                    "gpu-time estimate: pid={pid} stream={stream:#x}{} launches={} completed={} batches={} gpu_ns_estimate={} wait_ns={}",
                    if tid != 0 { format!(" tid={tid}") } else { String::new() },
                    s.launches,
                    s.launches_completed,
                    s.batches,
                    s.gpu_ns_estimate,
                    s.wait_ns
                )
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use tracer_common::Api;

    use super::*;

    fn launch(api: Api, start: u64, stream: u64) -> Event {
        Event::launch(api, 1, 1, stream).timed(start, 10)
    }

    #[test]
    fn stream_sync_closes_its_batch() {
        let mut g = Streams::default();
        g.observe(&launch(Api::LaunchKernel, 1_000, 7));
        g.observe(&launch(Api::LaunchKernel, 2_000, 7));
        g.observe(&launch(Api::LaunchKernel, 2_500, 8));
        let sync = Event::of(
            Api::StreamSynchronize,
            1,
            Detail::Sync {
                stream: Some(7),
                event: None,
            },
        )
        .timed(3_000, 5_000);
        assert_eq!(
            g.observe(&sync),
            Some(BatchEstimate {
                launches: 2,
                gpu_ns_estimate: 7_000
            })
        );
        let s7 = g.sorted().into_iter().find(|(k, _)| k.0 == 7).unwrap().1;
        assert_eq!(
            (s7.launches_completed, s7.wait_ns, s7.gpu_ns_estimate),
            (2, 5_000, 7_000)
        );
        // The context wait closes stream 8 too; stream 7 has nothing pending.
        let ctx = Event::of(
            Api::CtxSynchronize,
            1,
            Detail::Sync {
                stream: None,
                event: None,
            },
        )
        .timed(9_000, 1_000);
        assert_eq!(
            g.observe(&ctx),
            Some(BatchEstimate {
                launches: 1,
                gpu_ns_estimate: 7_500
            })
        );
        assert_eq!(g.estimate_ns(), 14_500);
        assert_eq!(g.sorted().len(), 2);
        assert_eq!(g.lines(1)[0], "gpu-time estimate: pid=1 stream=0x7 launches=2 completed=2 batches=1 gpu_ns_estimate=7000 wait_ns=5000");
    }

    #[test]
    fn streams_past_the_cap_share_one_entry() {
        let mut g = Streams::default();
        for s in 10..(10 + MAX_STREAMS as u64 + 7) {
            g.observe(&launch(Api::LaunchKernel, 1, s));
        }
        assert_eq!((g.sorted().len(), g.overflowed), (MAX_STREAMS + 1, 7));
        let sync = Event::of(
            Api::CtxSynchronize,
            1,
            Detail::Sync {
                stream: None,
                event: None,
            },
        )
        .timed(100, 10);
        assert_eq!(
            g.observe(&sync).map(|b| b.launches),
            Some(MAX_STREAMS as u64 + 7),
            "every launch still closed"
        );
    }

    #[test]
    fn per_thread_default_stream_is_its_own() {
        let mut g = Streams::default();
        g.observe(&launch(Api::LaunchKernelPtsz, 100, 0));
        g.observe(&launch(Api::LaunchKernel, 100, 0));
        let sync = Event::of(
            Api::StreamSynchronizePtsz,
            1,
            Detail::Sync {
                stream: Some(0),
                event: None,
            },
        )
        .timed(200, 50);
        assert_eq!(
            g.observe(&sync),
            Some(BatchEstimate {
                launches: 1,
                gpu_ns_estimate: 150
            })
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
        .timed(300, 50);
        assert_eq!(
            g.observe(&copy),
            Some(BatchEstimate {
                launches: 1,
                gpu_ns_estimate: 250
            })
        );
    }
}
