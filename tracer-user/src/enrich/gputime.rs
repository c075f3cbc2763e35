//! Device time per stream, from host-side calls alone, in two measures said for what they are.
//!
//! Work queued on a stream since its last completed wait forms a batch: launches, graph
//! launches and asynchronous copies. A batch closes when the host learns it is done: a stream
//! or context synchronize, a synchronous copy, an event synchronize on an event recorded on the
//! stream, or a successful poll (`cuEventQuery`, `cuStreamQuery`). Two measures come of it:
//! - `host_wait`: the time the host spent blocked in waits (measured);
//! - `batch_span`: from a batch's first submission to its close, except that when the close did
//!   not wait (the call returned at once and no poll answered `CUDA_ERROR_NOT_READY`), the work
//!   was done before the host asked, so the host gap before it is left out: the span then ends
//!   at the stream's last submission plus the call itself.
//!
//! Neither is a bound on a shared GPU (another process's work delays the batch's end), and
//! gaps in the middle of a batch, between two submissions, are not seen. Launches made while
//! their stream captures a graph run nothing and open no batch (`enrich::graphs`).

use foldhash::HashMap;
use serde::Serialize;
use tracer_common::api::{Kind, Shape};

use crate::event::{Detail, Event};

/// `CU_STREAM_LEGACY`: what stream 0 means for the plain entry points.
const STREAM_LEGACY: u64 = 1;
/// `CU_STREAM_PER_THREAD`: what stream 0 means for `_ptsz`/`_ptds` entry points.
const STREAM_PER_THREAD: u64 = 2;
/// A blocking wait shorter than this did not wait for device work: the call's own cost.
pub const BLOCKED_NS: u64 = 20_000;

/// Totals for one stream of one process.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct StreamTime {
    /// Launches seen on the stream (written one record each).
    pub launches: u64,
    /// Launches whose batch a wait or a poll has closed.
    pub launches_completed: u64,
    /// Sum of the spans of closed batches (`batch_span`), ns.
    pub span_ns: u64,
    /// Time the host was blocked waiting for this stream (`host_wait`, measured), ns.
    pub wait_ns: u64,
    /// Batches closed.
    pub batches: u64,
    #[serde(skip)]
    pending: u64,
    #[serde(skip)]
    batch_start: Option<u64>,
    /// When the latest submission on the stream returned.
    #[serde(skip)]
    last_submit: u64,
    /// Closes so far: an event recorded under an older generation covers nothing open.
    #[serde(skip)]
    generation: u64,
    /// Asynchronous copies of the open batch: (bytes, first start, copies).
    #[serde(skip)]
    copies: Option<(u64, u64, u64)>,
}

/// Asynchronous copies a close completed: for the user, one synchronous copy each batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct SyncedCopies {
    /// Bytes copied.
    pub bytes: u64,
    /// From the first copy's call to the close's return, ns.
    pub ns: u64,
    /// Copies.
    pub copies: u64,
}

/// What a wait or a poll closed, reported on its event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct BatchEstimate {
    /// Launches in the closed batches.
    pub launches: u64,
    /// The closed batches' `batch_span`, ns.
    pub span_ns: u64,
    /// Batches closed.
    pub batches: u64,
    /// Asynchronous copies completed by it, when there were.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub copies: Option<SyncedCopies>,
}

/// Streams tracked per process at most; calls on further streams share one overflow entry.
pub const MAX_STREAMS: usize = 1024;
/// Events mapped to their stream per process at most; past it, new events are not mapped
/// (their waits close nothing, and are counted in [`Streams::unmapped_waits`]).
pub const MAX_EVENTS: usize = 16_384;
/// The stream key calls past [`MAX_STREAMS`] are accounted under.
const OVERFLOW_STREAM: (u64, u32) = (u64::MAX, 0);

/// The key of `stream` as `ev`'s thread names it: (handle, 0) for a created stream; a default
/// stream is its context's (legacy) or its thread's in its context (per-thread): (context,
/// thread or 0) when the context is known, so that two devices' default streams never meet.
pub fn stream_key(ev: &Event, stream: u64) -> (u64, u32) {
    let per_thread = ev.api.info().per_thread;
    let default = |tid: u32| match (ev.context, tid) {
        (0, 0) => (STREAM_LEGACY, 0),
        (0, t) => (STREAM_PER_THREAD, t),
        (c, t) => (c, t),
    };
    match stream {
        0 if per_thread => default(ev.tid),
        0 | STREAM_LEGACY => default(0),
        STREAM_PER_THREAD => default(ev.tid),
        s => (s, 0),
    }
}

/// Where a close applies.
enum Closes {
    Stream((u64, u32)),
    Event(u64),
    All,
}

/// The streams of one process (its registry entry holds them), kept together so that a
/// context-wide wait and the per-process total touch only that process.
#[derive(Default)]
pub struct Streams {
    /// Calls on streams past [`MAX_STREAMS`], accounted under one entry.
    pub overflowed: u64,
    /// Event waits and polls that closed nothing: the event's record was not seen (recorded
    /// before tracing began, or past [`MAX_EVENTS`]).
    pub unmapped_waits: u64,
    /// By (stream handle, thread for the per-thread default stream).
    streams: HashMap<(u64, u32), StreamTime>,
    /// Event to (stream, the stream's generation when it was recorded).
    events: HashMap<u64, ((u64, u32), u64)>,
    /// Sum of the streams' `span_ns`.
    span_ns: u64,
    /// Sum of the streams' `wait_ns`.
    wait_ns: u64,
}

impl Streams {
    /// Accounts a call (`captured`: made on a stream that captures a graph, so it ran nothing);
    /// returns what a wait or a poll closed.
    pub fn observe(&mut self, ev: &Event, captured: bool) -> Option<BatchEstimate> {
        if ev.result != 0 || captured {
            return None;
        }
        let info = ev.api.info();
        match ev.detail {
            Detail::Launch { stream, .. } | Detail::Graph { stream, .. } => {
                let s = self.stream(stream_key(ev, stream));
                // A launch the kernel counted is written when it opens a batch (or as a sample):
                // it marks the batch's start; the launches are counted in-kernel.
                if !ev.counted {
                    s.launches += 1;
                    s.pending += 1;
                }
                s.submitted(ev);
                None
            }
            Detail::Copy {
                stream: Some(stream),
                bytes,
                ..
            } => {
                let s = self.stream(stream_key(ev, stream));
                s.submitted(ev);
                let c = s.copies.get_or_insert((0, ev.start_ns, 0));
                c.0 = c.0.saturating_add(bytes);
                c.2 += 1;
                None
            }
            Detail::Record { event, stream } => {
                let k = self.bounded(stream_key(ev, stream));
                let generation = self.streams.entry(k).or_default().generation;
                if self.events.len() < MAX_EVENTS || self.events.contains_key(&event) {
                    self.events.insert(event, (k, generation));
                }
                None
            }
            Detail::Sync {
                stream: Some(stream),
                event: None,
            }
            | Detail::Poll {
                stream: Some(stream),
                event: None,
            } => Some(self.close(ev, Closes::Stream(stream_key(ev, stream)))),
            Detail::Sync {
                stream: None,
                event: Some(e),
            }
            | Detail::Poll {
                stream: None,
                event: Some(e),
            } => Some(self.close(ev, Closes::Event(e))),
            Detail::Sync {
                stream: None,
                event: None,
            } if info.shape == Shape::CtxSync => Some(self.close(ev, Closes::All)),
            Detail::Copy { stream: None, .. } if info.kind == Kind::Memcpy => {
                Some(self.close(ev, Closes::Stream(stream_key(ev, 0))))
            }
            _ => None,
        }
    }

    fn stream(&mut self, k: (u64, u32)) -> &mut StreamTime {
        let k = self.bounded(k);
        self.streams.entry(k).or_default()
    }

    /// Closes the batch of one stream, of an event's stream, or of every stream.
    fn close(&mut self, ev: &Event, which: Closes) -> BatchEstimate {
        let mut closed = BatchEstimate {
            launches: 0,
            span_ns: 0,
            batches: 0,
            copies: None,
        };
        let blocking = matches!(ev.api.info().kind, Kind::Sync | Kind::Memcpy);
        let waited = if blocking {
            ev.duration_ns >= BLOCKED_NS
        } else {
            ev.not_ready > 0
        };
        let wait_ns = if blocking { ev.duration_ns } else { 0 };
        let mut account = |s: &mut StreamTime| s.close(ev, waited, &mut closed);
        match which {
            Closes::Stream(k) => {
                let s = self.stream(k);
                s.wait_ns = s.wait_ns.saturating_add(wait_ns);
                account(s);
            }
            Closes::Event(e) => match self.events.get(&e).copied() {
                Some((k, generation)) => {
                    let s = self.streams.entry(k).or_default();
                    s.wait_ns = s.wait_ns.saturating_add(wait_ns);
                    // An event recorded before the stream's last close covers nothing open.
                    if s.generation == generation {
                        account(s);
                    }
                }
                None => self.unmapped_waits += 1,
            },
            Closes::All => self.streams.values_mut().for_each(&mut account),
        }
        self.span_ns = self.span_ns.saturating_add(closed.span_ns);
        self.wait_ns = self.wait_ns.saturating_add(wait_ns);
        closed
    }

    /// When the oldest batch nothing has closed began (its first submission, CLOCK_MONOTONIC ns).
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

    /// Forgets the streams and events (the process exited); the totals stay.
    pub fn release(&mut self) {
        self.streams = HashMap::default();
        self.events = HashMap::default();
    }

    /// The process's `batch_span` over all its streams, ns.
    pub fn span_ns(&self) -> u64 {
        self.span_ns
    }

    /// The process's `host_wait` over all its streams, ns.
    pub fn wait_ns(&self) -> u64 {
        self.wait_ns
    }

    /// The `device time:` lines printed when the process exits or tracing stops. Launch counts
    /// are those written one record each (all of them in `trace`; `run` counts launches
    /// in-kernel, per kernel, not per stream).
    pub fn lines(&self, pid: u32) -> Vec<String> {
        self.sorted()
            .into_iter()
            .map(|((stream, tid), s)| {
                format!(
                    "device time: pid={pid} stream={stream:#x}{} launches={} completed={} batches={} batch_span_ns={} host_wait_ns={}",
                    if tid != 0 { format!(" tid={tid}") } else { String::new() },
                    s.launches,
                    s.launches_completed,
                    s.batches,
                    s.span_ns,
                    s.wait_ns
                )
            })
            .collect()
    }
}

impl StreamTime {
    /// A submission (launch, graph launch, asynchronous copy) returned.
    fn submitted(&mut self, ev: &Event) {
        self.batch_start.get_or_insert(ev.start_ns);
        self.last_submit = self
            .last_submit
            .max(ev.start_ns.saturating_add(ev.duration_ns));
    }

    /// Closes the open batch by `ev` (`waited`: the call waited for the work, so it ran until
    /// the call returned).
    fn close(&mut self, ev: &Event, waited: bool, closed: &mut BatchEstimate) {
        let end = ev.start_ns.saturating_add(ev.duration_ns);
        if let Some(start) = self.batch_start.take() {
            // Saturating: a tenant's calls can claim any start and duration.
            let span = if waited {
                end.saturating_sub(start)
            } else {
                // Done before the host asked: up to the last submission, plus the call itself.
                let last = self.last_submit.max(ev.thread_launch_ns).min(ev.start_ns);
                last.saturating_sub(start).saturating_add(ev.duration_ns)
            };
            self.span_ns = self.span_ns.saturating_add(span);
            self.batches += 1;
            closed.span_ns = closed.span_ns.saturating_add(span);
            closed.batches += 1;
        }
        if let Some((bytes, first, copies)) = self.copies.take() {
            let c = closed.copies.get_or_insert(SyncedCopies {
                bytes: 0,
                ns: 0,
                copies: 0,
            });
            c.bytes = c.bytes.saturating_add(bytes);
            c.ns = c.ns.saturating_add(end.saturating_sub(first));
            c.copies += copies;
        }
        closed.launches += self.pending;
        self.launches_completed += self.pending;
        self.pending = 0;
        self.generation += 1;
    }
}

#[cfg(test)]
mod tests;
