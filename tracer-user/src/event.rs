//! Decodes ring-buffer records into owned events with typed arguments.
use serde::Serialize;
use thiserror::Error;

use crate::identity::Comm;
use tracer_common::{
    api::{Direction, Shape, CU_MEM_LOCATION_TYPE_DEVICE},
    launches::{FLAG_AFTER_NOT_READY, FLAG_COUNTED, FLAG_UNTIMED, POLLS_SHIFT},
    Api, CallEvent, EventTag, ExitEvent, LongLookupEvent, LookupEvent, NameEvent,
};

/// A record that could not be decoded (an ABI mismatch between the two sides).
#[derive(Debug, Error, PartialEq, Eq)]
pub enum DecodeError {
    /// Shorter than its tag says.
    #[error("record of {0} bytes is too short")]
    Short(usize),
    /// Unknown tag.
    #[error("unknown record tag {0}")]
    Tag(u32),
    /// Unknown api id.
    #[error("unknown api id {0}")]
    Api(u32),
}

/// One completed driver call.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    /// The exact entry point that was called.
    pub api: Api,
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Its process's name (records carry none; the session fills it in).
    pub comm: Comm,
    /// CLOCK_MONOTONIC nanoseconds at entry.
    pub start_ns: u64,
    /// Nanoseconds from entry to return.
    pub duration_ns: u64,
    /// `CUresult` (0 is success).
    pub result: i32,
    /// The call's arguments.
    pub detail: Detail,
    /// A launch the kernel counted already (`LAUNCHES`): this record is a sample of it, for
    /// its arguments and stream batch, and is not counted again.
    pub counted: bool,
    /// A launch written at its entry outside a window of the pair (`FLAG_UNTIMED`): its start
    /// is true, its duration (0) and result unknown.
    pub untimed: bool,
    /// For a wait or a poll: when its thread's last launch returned (CLOCK_MONOTONIC ns; 0:
    /// none seen), which tells a host gap before the wait.
    pub thread_launch_ns: u64,
    /// For a successful poll: the `CUDA_ERROR_NOT_READY` answers its thread had before it
    /// (filtered in the kernel, one count each): the work finished while polled.
    pub not_ready: u32,
    /// The context the call went to, as the process's context calls tell (0: unknown); set
    /// by the pipeline (`enrich::devices`).
    pub context: u64,
}

#[cfg(test)]
impl Event {
    /// A successful call of `api` by process `pid` (its main thread, comm `job<pid>`), at 0,
    /// lasting 1 ns: the one event builder of the unit tests.
    pub fn of(api: Api, pid: u32, detail: Detail) -> Event {
        Event {
            api,
            pid,
            tid: pid,
            comm: Comm::from(format!("job{pid}")),
            start_ns: 0,
            duration_ns: 1,
            result: 0,
            detail,
            counted: false,
            untimed: false,
            thread_launch_ns: 0,
            not_ready: 0,
            context: 0,
        }
    }

    /// A launch of `function` on `stream` (a 1x1x1 grid of 1x1x1 blocks).
    pub fn launch(api: Api, pid: u32, function: u64, stream: u64) -> Event {
        Event::of(
            api,
            pid,
            Detail::Launch {
                function,
                grid: [1; 3],
                block: [1; 3],
                shared_mem_bytes: 0,
                stream,
            },
        )
    }

    /// The same call, starting at `start_ns` and lasting `duration_ns`.
    pub fn timed(mut self, start_ns: u64, duration_ns: u64) -> Event {
        self.start_ns = start_ns;
        self.duration_ns = duration_ns;
        self
    }
}

/// Arguments of a call, by shape.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Detail {
    /// A kernel launch.
    Launch {
        /// `CUfunction` handle (or a `CUkernel` cast to one).
        function: u64,
        /// Grid dimensions.
        grid: [u32; 3],
        /// Block dimensions.
        block: [u32; 3],
        /// Dynamic shared memory per block.
        shared_mem_bytes: u32,
        /// `CUstream` handle (0 is the default stream).
        stream: u64,
    },
    /// A graph launch.
    Graph {
        /// `CUgraphExec` handle.
        graph_exec: u64,
        /// `CUstream` handle.
        stream: u64,
    },
    /// A copy.
    Copy {
        /// Bytes copied.
        bytes: u64,
        /// Direction.
        direction: &'static str,
        /// Destination pointer.
        dst: u64,
        /// Source pointer.
        src: u64,
        /// Stream of an asynchronous copy.
        #[serde(skip_serializing_if = "Option::is_none")]
        stream: Option<u64>,
    },
    /// A wait.
    Sync {
        /// Stream waited on (or made to wait).
        #[serde(skip_serializing_if = "Option::is_none")]
        stream: Option<u64>,
        /// Event waited on.
        #[serde(skip_serializing_if = "Option::is_none")]
        event: Option<u64>,
    },
    /// An allocation.
    Alloc {
        /// Device pointer returned (0 on failure).
        dptr: u64,
        /// Bytes asked for.
        bytes: u64,
        /// Stream of an asynchronous allocation.
        #[serde(skip_serializing_if = "Option::is_none")]
        stream: Option<u64>,
        /// The CUDA ordinal the allocation names (`cuMemCreate`'s location), when it names one.
        #[serde(skip_serializing_if = "Option::is_none")]
        device: Option<i32>,
    },
    /// A free.
    Free {
        /// Device pointer freed.
        dptr: u64,
        /// Stream of an asynchronous free.
        #[serde(skip_serializing_if = "Option::is_none")]
        stream: Option<u64>,
    },
    /// An event recorded on a stream.
    Record {
        /// `CUevent` handle.
        event: u64,
        /// `CUstream` handle.
        stream: u64,
    },
    /// A poll of an event or a stream.
    Poll {
        /// Stream polled.
        #[serde(skip_serializing_if = "Option::is_none")]
        stream: Option<u64>,
        /// Event polled.
        #[serde(skip_serializing_if = "Option::is_none")]
        event: Option<u64>,
    },
    /// A stream capture begun, or ended with its graph.
    Capture {
        /// `CUstream` handle.
        stream: u64,
        /// The `CUgraph` an end made (0 on failure or at a begin).
        graph: u64,
    },
    /// A graph instantiated, or an executable graph updated from one.
    GraphBuild {
        /// `CUgraphExec` handle (made or updated; 0 on a failed instantiation).
        graph_exec: u64,
        /// `CUgraph` it comes from.
        graph: u64,
    },
    /// An entry point looked up by name (`cuGetProcAddress_v2`).
    Resolve {
        /// The name asked for.
        #[serde(skip_serializing_if = "Option::is_none")]
        symbol: Option<String>,
        /// The address returned (0 on failure).
        address: u64,
    },
    /// A name lookup or kernel-to-function conversion.
    Lookup {
        /// Handle returned (`CUfunction` or `CUkernel`; 0 on failure).
        handle: u64,
        /// Module, library or kernel it came from.
        source: u64,
        /// The name asked for (mangled), for lookups by name.
        #[serde(skip_serializing_if = "Option::is_none")]
        name: Option<String>,
    },
    /// Which device later calls go to (see `event::context`).
    Context(context::ContextCall),
}

fn read<T: Copy>(bytes: &[u8]) -> Result<T, DecodeError> {
    if bytes.len() < size_of::<T>() {
        return Err(DecodeError::Short(bytes.len()));
    }
    // SAFETY: length checked; T is a plain #[repr(C)] record, read unaligned.
    Ok(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
}

/// What one cell gained since the last read: launches of one (api, kernel) in one latency bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchDelta {
    /// The launch entry point.
    pub api: Api,
    /// `CUfunction` handle launched.
    pub function: u64,
    /// Latency bucket (`tracer_common::launches::latency_bucket`).
    pub bucket: u32,
    /// Launches.
    pub count: u64,
    /// Of which failed.
    pub errors: u64,
    /// Sum of their durations, ns.
    pub sum_ns: u64,
    /// Threads the successful ones asked for (grid x block, summed).
    pub threads: u64,
    /// Of `count`, launches counted without their return (uprobe sessions): placed in this
    /// bucket in proportion to the sampled ones (`pipeline::untimed`).
    pub untimed: u64,
    /// Failures estimated among the untimed ones (the sample's rate; not in `errors`).
    pub estimated_errors: u64,
}

fn cstr(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// One ring-buffer record.
#[derive(Clone, Debug, PartialEq)]
pub enum RingRecord {
    /// A completed call.
    Call(Event),
    /// A tracked process exited: (pid, its `wait(2)` status when the kernel's BTF located it).
    Exit(u32, Option<i32>),
    /// A thread's name: (pid, tid, renamed, name), at its first call or when a tracked
    /// process's leader is renamed.
    Name(u32, u32, bool, Comm),
    /// A synchronous fault of a thread that hit a probe (the harm check's evidence).
    Fault(tracer_common::FaultEvent),
}

/// Decodes one ring-buffer record.
pub fn decode_record(bytes: &[u8]) -> Result<RingRecord, DecodeError> {
    let tag: u32 = read(bytes)?;
    if tag == EventTag::Exit as u32 {
        let e = read::<ExitEvent>(bytes)?;
        let status = (e.flags & tracer_common::EXIT_STATUS_KNOWN != 0).then_some(e.status);
        return Ok(RingRecord::Exit(e.pid, status));
    }
    if tag == EventTag::Fault as u32 {
        return Ok(RingRecord::Fault(read::<tracer_common::FaultEvent>(bytes)?));
    }
    if tag == EventTag::Name as u32 {
        let n = read::<NameEvent>(bytes)?;
        return Ok(RingRecord::Name(
            n.pid,
            n.tid,
            n.renamed != 0,
            Comm::from_raw(&n.comm),
        ));
    }
    decode(bytes).map(RingRecord::Call)
}

/// The threads of a launch of `grid` blocks of `block` threads, capped as the kernel caps them.
pub fn launch_threads(grid: [u32; 3], block: [u32; 3]) -> u64 {
    use tracer_common::event::pack;
    tracer_common::launches::threads(&[
        0,
        pack(grid[0], grid[1]),
        pack(grid[2], block[0]),
        pack(block[1], block[2]),
        0,
        0,
    ])
}

/// CLOCK_MONOTONIC now, in ns: the clock of `start_ns`.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Decodes a call record.
pub fn decode(bytes: &[u8]) -> Result<Event, DecodeError> {
    let tag: u32 = read(bytes)?;
    let (call, name) = match tag {
        t if t == EventTag::Call as u32 => (read::<CallEvent>(bytes)?, None),
        t if t == EventTag::Lookup as u32 => {
            let l: LookupEvent = read(bytes)?;
            (l.call, Some(cstr(&l.name)))
        }
        t if t == EventTag::LongLookup as u32 => {
            let l: LongLookupEvent = read(bytes)?;
            (l.call, Some(cstr(&l.name)))
        }
        t => return Err(DecodeError::Tag(t)),
    };
    let api = Api::from_id(call.api).ok_or(DecodeError::Api(call.api))?;
    Ok(Event {
        api,
        pid: call.pid,
        tid: call.tid,
        comm: Comm::default(),
        start_ns: call.start_ns,
        duration_ns: call.duration_ns,
        result: call.result,
        detail: detail(api, &call, name),
        counted: call.flags & FLAG_COUNTED != 0,
        untimed: call.flags & FLAG_UNTIMED != 0,
        thread_launch_ns: if api.info().kind.waits() { call.out } else { 0 },
        not_ready: if call.flags & FLAG_AFTER_NOT_READY != 0 {
            (call.flags >> POLLS_SHIFT).max(1)
        } else {
            0
        },
        context: 0,
    })
}

fn detail(api: Api, c: &CallEvent, name: Option<String>) -> Detail {
    let info = api.info();
    let a = &c.args;
    let stream_at = |i: usize| info.has_stream.then_some(a[i]);
    let direction = info.direction.unwrap_or(Direction::Default).as_str();
    match info.shape {
        Shape::Launch => Detail::Launch {
            function: a[0],
            grid: c.grid(),
            block: c.block(),
            shared_mem_bytes: a[4] as u32,
            stream: a[5],
        },
        Shape::Graph => Detail::Graph {
            graph_exec: a[0],
            stream: a[1],
        },
        Shape::Copy => Detail::Copy {
            dst: a[0],
            src: a[1],
            bytes: a[2],
            direction,
            stream: stream_at(3),
        },
        Shape::CopyPeer => Detail::Copy {
            dst: a[0],
            src: a[2],
            bytes: a[4],
            direction,
            stream: stream_at(5),
        },
        Shape::StreamSync => Detail::Sync {
            stream: Some(a[0]),
            event: None,
        },
        Shape::CtxSync => Detail::Sync {
            stream: None,
            event: None,
        },
        Shape::EventSync => Detail::Sync {
            stream: None,
            event: Some(a[0]),
        },
        Shape::StreamWaitEvent => Detail::Sync {
            stream: Some(a[0]),
            event: Some(a[1]),
        },
        Shape::Alloc => Detail::Alloc {
            dptr: c.out,
            bytes: a[1],
            stream: stream_at(2),
            device: None,
        },
        Shape::Free => Detail::Free {
            dptr: a[0],
            stream: stream_at(1),
        },
        // A VMM handle is memory held (a separate key space: see `enrich::memory`).
        Shape::VmmCreate => Detail::Alloc {
            dptr: c.out,
            bytes: a[1],
            stream: None,
            // The eBPF return probe put the `CUmemLocation` (type, id) in the flags' place.
            device: (c.out != 0 && a[3] as u32 == CU_MEM_LOCATION_TYPE_DEVICE)
                .then_some((a[3] >> 32) as i32),
        },
        Shape::VmmRelease => Detail::Free {
            dptr: a[0],
            stream: None,
        },
        Shape::AllocFromPool => Detail::Alloc {
            dptr: c.out,
            bytes: a[1],
            stream: stream_at(3),
            device: None,
        },
        // Width x height: the pitch the driver chose (at least the width) is not read.
        Shape::AllocPitch => Detail::Alloc {
            dptr: c.out,
            bytes: a[2].saturating_mul(a[3]),
            stream: None,
            device: None,
        },
        Shape::ModuleGetFunction | Shape::LibraryGetKernel => Detail::Lookup {
            handle: c.out,
            source: a[1],
            name,
        },
        Shape::KernelGetFunction => Detail::Lookup {
            handle: c.out,
            source: a[1],
            name: None,
        },
        Shape::EventRecord => Detail::Record {
            event: a[0],
            stream: a[1],
        },
        Shape::EventQuery => Detail::Poll {
            stream: None,
            event: Some(a[0]),
        },
        Shape::StreamQuery => Detail::Poll {
            stream: Some(a[0]),
            event: None,
        },
        Shape::BeginCapture => Detail::Capture {
            stream: a[0],
            graph: 0,
        },
        Shape::EndCapture => Detail::Capture {
            stream: a[0],
            graph: c.out,
        },
        Shape::Instantiate => Detail::GraphBuild {
            graph_exec: c.out,
            graph: a[1],
        },
        Shape::ProcAddress => Detail::Resolve {
            symbol: name,
            address: c.out,
        },
        Shape::ExecUpdate => Detail::GraphBuild {
            graph_exec: a[0],
            graph: a[1],
        },
        Shape::Memset | Shape::Memset2D | Shape::Copy2D | Shape::Copy3D | Shape::CopyBatch => {
            sized::detail(api, a)
        }
        _ => Detail::Context(context::decode(info.shape, a, c.out)),
    }
}

pub mod context;
mod sized;
#[cfg(test)]
mod tests;
