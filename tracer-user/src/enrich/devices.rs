//! Which device a process's calls go to, for a process that drives several (JAX, tensor
//! parallelism in one process, a copy between two GPUs' contexts).
//!
//! A thread's calls go to its current context's device. The process's own context calls say
//! which that is: `cuDevicePrimaryCtxRetain` and `cuCtxCreate` bind a context to a CUDA ordinal,
//! `cuCtxSetCurrent`, `cuCtxPushCurrent` and `cuCtxPopCurrent` change a thread's stack, and
//! `cuDeviceGetUuid` names an ordinal's device by UUID (which NVML prints: CUDA's ordinals are not
//! NVML's indices). A function handle belongs to the context current when it was looked up, and
//! a stream to the context current when it was created, so a launch or copy on them goes to that
//! device whichever thread makes it. Nothing is read from the driver's memory: a context bound
//! before cudatrace attached is unknown, and its work is counted under an unknown device.
use std::collections::BTreeMap;

use foldhash::HashMap;

use tracer_common::api::Shape;

use crate::event::{context::ContextCall, Detail, Event, LaunchDelta};

/// Threads with a context stack kept per process.
pub const MAX_THREADS: usize = 4096;
/// Contexts per thread stack (CUDA's own stacks are shallow; deeper pushes are not kept).
pub const MAX_DEPTH: usize = 16;
/// Contexts, and devices, kept per process.
pub const MAX_CONTEXTS: usize = 256;
/// Function handles and streams kept per process, each.
pub const MAX_HANDLES: usize = 65_536;

/// `CU_STREAM_LEGACY` and `CU_STREAM_PER_THREAD`: the default streams, of the current context.
const DEFAULT_STREAMS: [u64; 3] = [0, 1, 2];

/// The work a process submitted to one device while traced.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceWork {
    /// Successful kernel launches (records and in-kernel counts alike).
    pub launches: u64,
    /// Bytes of successful copies and memsets submitted from this device's contexts.
    pub bytes: u64,
}

/// One process's contexts and devices (its registry entry holds them).
#[derive(Default)]
pub struct ProcessDevices {
    threads: HashMap<u32, Vec<u64>>,
    contexts: HashMap<u64, i32>,
    uuids: HashMap<i32, String>,
    functions: HashMap<u64, u64>,
    streams: HashMap<u64, u64>,
    /// By CUDA ordinal; `None`: a context cudatrace never saw bound.
    work: BTreeMap<Option<i32>, DeviceWork>,
    /// Entries not kept, a table being full.
    pub overflowed: u64,
}

impl ProcessDevices {
    /// Accounts one call and returns the context it went to (0 when unknown).
    pub fn observe(&mut self, ev: &Event) -> u64 {
        match &ev.detail {
            Detail::Context(c) if ev.result == 0 => {
                self.context_call(ev.tid, c);
                self.current(ev.tid)
            }
            Detail::Lookup { handle, .. }
                if ev.result == 0 && ev.api.info().shape != Shape::LibraryGetKernel =>
            {
                // A CUfunction is its context's; a CUkernel (a library's) is nobody's.
                let ctx = self.current(ev.tid);
                if ctx != 0 {
                    insert(
                        &mut self.functions,
                        MAX_HANDLES,
                        *handle,
                        ctx,
                        &mut self.overflowed,
                    );
                }
                ctx
            }
            Detail::Launch {
                function, stream, ..
            } => {
                let ctx = match self.functions.get(function) {
                    Some(c) => *c,
                    None => self.of_stream(ev.tid, *stream),
                };
                if ev.result == 0 && !ev.counted {
                    self.work_of(ctx).launches += 1;
                }
                ctx
            }
            Detail::Copy { bytes, stream, .. } => {
                let ctx = self.of_stream(ev.tid, stream.unwrap_or(0));
                if ev.result == 0 {
                    let w = self.work_of(ctx);
                    w.bytes = w.bytes.saturating_add(*bytes);
                }
                ctx
            }
            Detail::Graph { stream, .. } | Detail::Record { stream, .. } => {
                self.of_stream(ev.tid, *stream)
            }
            Detail::Sync { stream, .. } | Detail::Poll { stream, .. } => {
                self.of_stream(ev.tid, stream.unwrap_or(0))
            }
            Detail::Alloc { stream, .. } | Detail::Free { stream, .. } => {
                self.of_stream(ev.tid, stream.unwrap_or(0))
            }
            Detail::Capture { stream, .. } => self.of_stream(ev.tid, *stream),
            _ => self.current(ev.tid),
        }
    }

    /// Accounts launches the kernel counted, by the context their function was looked up in.
    pub fn observe_launches(&mut self, d: &LaunchDelta) {
        let ctx = self.functions.get(&d.function).copied().unwrap_or(0);
        self.work_of(ctx).launches += d.count.saturating_sub(d.errors);
    }

    /// The work per device: (CUDA ordinal, its UUID as `event::context::uuid_text` writes it,
    /// the work), ordinals in order and the unknown device last (the tests' view).
    #[cfg(test)]
    pub fn work(&self) -> Vec<(Option<i32>, Option<&str>, DeviceWork)> {
        self.work_with(&BTreeMap::new())
            .into_iter()
            .map(|(d, u, w, _)| (d, u, w))
            .collect()
    }

    /// [`ProcessDevices::work`] with the bytes held per device (`ProcessMemory::by_device`),
    /// over the devices of either.
    pub fn work_with(
        &self,
        held: &BTreeMap<Option<i32>, u64>,
    ) -> Vec<(Option<i32>, Option<&str>, DeviceWork, u64)> {
        let mut all: BTreeMap<Option<i32>, (DeviceWork, u64)> = BTreeMap::new();
        for (d, w) in &self.work {
            all.entry(*d).or_default().0 = *w;
        }
        for (d, h) in held {
            all.entry(*d).or_default().1 = *h;
        }
        let mut out: Vec<_> = all
            .into_iter()
            .map(|(d, (w, h))| (d, d.and_then(|d| self.uuid_of_device(d)), w, h))
            .collect();
        let unknown_first = out.first().is_some_and(|(d, ..)| d.is_none());
        out.rotate_left(usize::from(unknown_first));
        out
    }

    /// The UUID of a context's device, when the process read it.
    pub fn uuid_of_context(&self, ctx: u64) -> Option<&str> {
        self.uuid_of_device(*self.contexts.get(&ctx)?)
    }

    /// The UUID of a CUDA ordinal, when the process read it.
    pub fn uuid_of_device(&self, device: i32) -> Option<&str> {
        self.uuids.get(&device).map(String::as_str)
    }

    /// The CUDA ordinal of a context, when its binding was seen.
    pub fn device_of_context(&self, ctx: u64) -> Option<i32> {
        self.contexts.get(&ctx).copied()
    }

    /// Forgets the tables (the process exited); the work stays.
    pub fn release(&mut self) {
        self.threads = HashMap::default();
        self.functions = HashMap::default();
        self.streams = HashMap::default();
    }

    fn context_call(&mut self, tid: u32, c: &ContextCall) {
        match *c {
            ContextCall::Set { context } => {
                let Some(stack) = self.stack(tid) else { return };
                stack.pop();
                if context != 0 {
                    stack.push(context);
                }
            }
            ContextCall::Push { context } => {
                if let Some(stack) = self.stack(tid) {
                    if stack.len() < MAX_DEPTH {
                        stack.push(context);
                    }
                }
            }
            ContextCall::Pop { .. } => {
                if let Some(stack) = self.threads.get_mut(&tid) {
                    stack.pop();
                }
            }
            ContextCall::Bind {
                context,
                device,
                created,
            } => {
                insert(
                    &mut self.contexts,
                    MAX_CONTEXTS,
                    context,
                    device,
                    &mut self.overflowed,
                );
                if created {
                    self.context_call(tid, &ContextCall::Push { context });
                }
            }
            ContextCall::Destroy { context } => {
                self.contexts.remove(&context);
                if let Some(stack) = self.threads.get_mut(&tid) {
                    if stack.last() == Some(&context) {
                        stack.pop();
                    }
                }
            }
            ContextCall::Uuid { device, ref uuid } if !uuid.is_empty() => {
                if self.uuids.len() < MAX_CONTEXTS || self.uuids.contains_key(&device) {
                    self.uuids.insert(device, uuid.clone());
                } else {
                    self.overflowed += 1;
                }
            }
            ContextCall::Uuid { .. } => {}
            ContextCall::Stream { stream } => {
                let ctx = self.current(tid);
                if ctx != 0 {
                    insert(
                        &mut self.streams,
                        MAX_HANDLES,
                        stream,
                        ctx,
                        &mut self.overflowed,
                    );
                }
            }
        }
    }

    /// The thread's context stack, made when there is room.
    fn stack(&mut self, tid: u32) -> Option<&mut Vec<u64>> {
        if self.threads.len() >= MAX_THREADS && !self.threads.contains_key(&tid) {
            self.overflowed += 1;
            return None;
        }
        Some(self.threads.entry(tid).or_default())
    }

    /// The thread's current context, 0 when unknown.
    fn current(&self, tid: u32) -> u64 {
        self.threads
            .get(&tid)
            .and_then(|s| s.last().copied())
            .unwrap_or(0)
    }

    /// The context of a stream as the thread names it: a created stream's own, else (a default
    /// stream) the thread's current one.
    fn of_stream(&self, tid: u32, stream: u64) -> u64 {
        if DEFAULT_STREAMS.contains(&stream) {
            return self.current(tid);
        }
        self.streams
            .get(&stream)
            .copied()
            .unwrap_or_else(|| self.current(tid))
    }

    fn work_of(&mut self, ctx: u64) -> &mut DeviceWork {
        let mut device = self.contexts.get(&ctx).copied();
        // Devices a tenant names (any int, context after context) stay within the bound.
        if self.work.len() >= MAX_CONTEXTS && !self.work.contains_key(&device) {
            device = None;
        }
        self.work.entry(device).or_default()
    }
}

/// Inserts within `cap` entries, counting what is left out.
fn insert<V>(map: &mut HashMap<u64, V>, cap: usize, key: u64, value: V, overflowed: &mut u64) {
    if map.len() < cap || map.contains_key(&key) {
        map.insert(key, value);
    } else {
        *overflowed += 1;
    }
}

#[cfg(test)]
mod tests;
