//! CUDA graphs of one process: what stream capture recorded, what each executable graph runs.
//!
//! A launch made while its stream captures (`cuStreamBeginCapture_v2` to `cuStreamEndCapture`,
//! and streams joined to the capture by waiting on an event recorded in it) returns at once
//! and runs nothing: it becomes a node of the graph the end returns. `cuGraphInstantiate*`
//! makes an executable graph of it, `cuGraphExecUpdate_v2` gives an executable graph another
//! graph's nodes, and each `cuGraphLaunch` runs them all. A graph captured before tracing began
//! (vLLM captures at start-up), or built node by node, has an unknown composition: its replays
//! are counted as such, never guessed.
use std::sync::Arc;

use foldhash::HashMap;

use super::gputime::stream_key;
use crate::event::{launch_threads, Detail, Event};

/// Graphs and executable graphs remembered per process at most (each); later ones have an
/// unknown composition.
pub const MAX_GRAPHS: usize = 4096;
/// Kernel nodes recorded per capture at most; a larger capture's composition is unknown.
pub const MAX_NODES: usize = 65_536;
/// Kernel nodes recorded per process over its life at most (4 MiB of nodes): a tenant that
/// captures graph after graph cannot grow the agent; past it, new captures have an unknown
/// composition.
pub const MAX_RECORDED_NODES: usize = 262_144;
/// Captures in progress per process at most.
const MAX_CAPTURES: usize = 256;

/// One kernel node: the function it runs and the threads it asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Node {
    /// `CUfunction` handle (or a `CUkernel` cast to one).
    pub function: u64,
    /// Grid x block threads.
    pub threads: u64,
}

/// The kernel nodes of a graph, shared by the executable graphs made of it.
pub type Composition = Arc<[Node]>;

/// What one call meant for the graphs.
#[derive(Default)]
pub struct GraphEffect {
    /// Made on a capturing stream: recorded into a graph, ran nothing.
    pub captured: bool,
    /// A graph launch of known composition: the kernels it ran.
    pub runs: Option<Composition>,
}

/// The graphs of one process (its registry entry holds them).
#[derive(Default)]
pub struct Graphs {
    /// Graph launches.
    pub replays: u64,
    /// Of which of unknown composition.
    pub unknown_replays: u64,
    /// Graphs, executable graphs or captures not remembered, past the bounds.
    pub overflowed: u64,
    /// Capturing stream to its capture.
    capturing: HashMap<(u64, u32), u64>,
    /// Capture to its nodes so far (`None`: too many, or a node of unknown composition).
    captures: HashMap<u64, Option<Vec<Node>>>,
    /// Events recorded on capturing streams, to their capture (a wait on one joins it).
    capture_events: HashMap<u64, u64>,
    next_capture: u64,
    /// Kernel nodes recorded so far (see [`MAX_RECORDED_NODES`]).
    recorded: usize,
    /// `CUgraph` to its composition (`None`: unknown).
    graphs: HashMap<u64, Option<Composition>>,
    /// `CUgraphExec` to its composition (`None`: unknown).
    execs: HashMap<u64, Option<Composition>>,
}

impl Graphs {
    /// Accounts one call.
    pub fn observe(&mut self, ev: &Event) -> GraphEffect {
        let mut effect = GraphEffect::default();
        let capture_of =
            |g: &Graphs, stream: u64| g.capturing.get(&stream_key(ev, stream)).copied();
        match ev.detail {
            Detail::Capture { stream, graph: 0 } if ev.result == 0 && !self.is_end(ev) => {
                if self.captures.len() >= MAX_CAPTURES {
                    self.overflowed += 1;
                    return effect;
                }
                self.next_capture += 1;
                self.capturing
                    .insert(stream_key(ev, stream), self.next_capture);
                self.captures.insert(self.next_capture, Some(Vec::new()));
            }
            Detail::Capture { stream, graph } => self.end(ev, stream, graph),
            Detail::Launch {
                function,
                grid,
                block,
                stream,
                ..
            } => {
                if let Some(id) = capture_of(self, stream) {
                    effect.captured = true;
                    if ev.result == 0 {
                        self.add(
                            id,
                            &[Node {
                                function,
                                threads: launch_threads(grid, block),
                            }],
                        );
                    }
                }
            }
            Detail::Graph { graph_exec, stream } => {
                let known = self.execs.get(&graph_exec).cloned().flatten();
                if let Some(id) = capture_of(self, stream) {
                    // A graph launched into a capture becomes a child graph of it.
                    effect.captured = true;
                    match known {
                        Some(c) => self.add(id, &c),
                        None => self.unknown(id),
                    }
                } else if ev.result == 0 {
                    self.replays += 1;
                    match known {
                        Some(c) => effect.runs = Some(c),
                        None => self.unknown_replays += 1,
                    }
                }
            }
            Detail::Copy {
                stream: Some(stream),
                ..
            } => effect.captured = capture_of(self, stream).is_some(),
            Detail::Record { event, stream } => {
                if let Some(id) = capture_of(self, stream) {
                    effect.captured = true;
                    if self.capture_events.len() < MAX_GRAPHS {
                        self.capture_events.insert(event, id);
                    }
                }
            }
            Detail::Sync {
                stream: Some(stream),
                event: Some(event),
            } => {
                // `cuStreamWaitEvent` on an event of a capture: the stream joins it.
                if let Some(id) = self.capture_events.get(&event).copied() {
                    effect.captured = true;
                    self.capturing.insert(stream_key(ev, stream), id);
                } else {
                    effect.captured = capture_of(self, stream).is_some();
                }
            }
            Detail::GraphBuild { graph_exec, graph } if ev.result == 0 && graph_exec != 0 => {
                let c = self.graphs.get(&graph).cloned().flatten();
                if self.execs.len() < MAX_GRAPHS || self.execs.contains_key(&graph_exec) {
                    self.execs.insert(graph_exec, c);
                } else {
                    self.overflowed += 1;
                }
            }
            _ => {}
        }
        effect
    }

    fn is_end(&self, ev: &Event) -> bool {
        ev.api.info().shape == tracer_common::api::Shape::EndCapture
    }

    /// A capture ended (whatever the result: a failed end ends it too).
    fn end(&mut self, ev: &Event, stream: u64, graph: u64) {
        if !self.is_end(ev) {
            return;
        }
        let Some(id) = self.capturing.remove(&stream_key(ev, stream)) else {
            return;
        };
        self.capturing.retain(|_, c| *c != id);
        self.capture_events.retain(|_, c| *c != id);
        let nodes = self.captures.remove(&id).flatten();
        if ev.result != 0 || graph == 0 {
            return;
        }
        if self.graphs.len() < MAX_GRAPHS || self.graphs.contains_key(&graph) {
            self.graphs.insert(graph, nodes.map(Composition::from));
        } else {
            self.overflowed += 1;
        }
    }

    fn add(&mut self, id: u64, nodes: &[Node]) {
        if let Some(slot) = self.captures.get_mut(&id) {
            let full = slot
                .as_ref()
                .is_some_and(|v| v.len().saturating_add(nodes.len()) > MAX_NODES)
                || self.recorded.saturating_add(nodes.len()) > MAX_RECORDED_NODES;
            if full {
                *slot = None;
            } else if let Some(v) = slot {
                v.extend_from_slice(nodes);
                self.recorded += nodes.len();
            }
        }
    }

    fn unknown(&mut self, id: u64) {
        if let Some(slot) = self.captures.get_mut(&id) {
            *slot = None;
        }
    }

    /// Forgets the graphs (the process exited); the counts stay.
    pub fn release(&mut self) {
        let (replays, unknown, overflowed) = (self.replays, self.unknown_replays, self.overflowed);
        *self = Graphs {
            replays,
            unknown_replays: unknown,
            overflowed,
            ..Graphs::default()
        };
    }

    /// The `graphs:` line printed when the process exits or tracing stops, once it launched
    /// or captured a graph.
    pub fn line(&self, pid: u32) -> Option<String> {
        (self.replays > 0 || !self.graphs.is_empty()).then(|| {
            format!(
                "graphs: pid={pid} captured={} replays={} unknown_composition={}",
                self.graphs.len(),
                self.replays,
                self.unknown_replays
            )
        })
    }
}

#[cfg(test)]
mod tests;
