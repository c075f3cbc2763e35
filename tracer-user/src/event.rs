//! Decodes ring-buffer records into owned events with typed arguments.
use serde::Serialize;
use thiserror::Error;

use crate::identity::Comm;
use tracer_common::{
    api::{Direction, Shape},
    launches::FLAG_COUNTED,
    Api, CallEvent, EventTag, ExitEvent, LookupEvent, NameEvent,
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
    },
    /// A free.
    Free {
        /// Device pointer freed.
        dptr: u64,
        /// Stream of an asynchronous free.
        #[serde(skip_serializing_if = "Option::is_none")]
        stream: Option<u64>,
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
}

/// Decodes one ring-buffer record.
pub fn decode_record(bytes: &[u8]) -> Result<RingRecord, DecodeError> {
    let tag: u32 = read(bytes)?;
    if tag == EventTag::Exit as u32 {
        let e = read::<ExitEvent>(bytes)?;
        let status = (e.flags & tracer_common::EXIT_STATUS_KNOWN != 0).then_some(e.status);
        return Ok(RingRecord::Exit(e.pid, status));
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
        },
        Shape::Free => Detail::Free {
            dptr: a[0],
            stream: stream_at(1),
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
    }
}

#[cfg(test)]
mod tests {
    use tracer_common::{event::pack, NAME_MAX};

    use super::*;

    fn raw(api: Api, args: [u64; 6], out: u64) -> CallEvent {
        CallEvent {
            tag: EventTag::Call as u32,
            api: api as u32,
            pid: 7,
            tid: 8,
            start_ns: 100,
            duration_ns: 50,
            result: 0,
            flags: 0,
            args,
            out,
        }
    }

    fn bytes<T>(v: &T) -> &[u8] {
        // SAFETY: test-only view of a plain record.
        unsafe { std::slice::from_raw_parts((v as *const T).cast(), size_of::<T>()) }
    }

    #[test]
    fn launch_unpacks_dimensions() {
        let ev = raw(
            Api::LaunchKernelPtsz,
            [0xf00, pack(1, 2), pack(3, 4), pack(5, 6), 48, 0x5a],
            0,
        );
        let e = decode(bytes(&ev)).unwrap();
        assert_eq!((e.api, e.counted), (Api::LaunchKernelPtsz, false));
        assert_eq!(
            e.detail,
            Detail::Launch {
                function: 0xf00,
                grid: [1, 2, 3],
                block: [4, 5, 6],
                shared_mem_bytes: 48,
                stream: 0x5a
            }
        );
    }

    #[test]
    fn copies_know_their_direction_and_stream() {
        let sync = decode(bytes(&raw(Api::MemcpyDtoH, [1, 2, 4096, 99, 0, 0], 0))).unwrap();
        assert_eq!(
            sync.detail,
            Detail::Copy {
                dst: 1,
                src: 2,
                bytes: 4096,
                direction: "dtoh",
                stream: None
            }
        );
        let peer = decode(bytes(&raw(Api::MemcpyPeerAsync, [1, 10, 2, 20, 512, 3], 0))).unwrap();
        assert_eq!(
            peer.detail,
            Detail::Copy {
                dst: 1,
                src: 2,
                bytes: 512,
                direction: "peer",
                stream: Some(3)
            }
        );
    }

    #[test]
    fn lookup_carries_name() {
        let mut name = [0u8; NAME_MAX];
        name[..17].copy_from_slice(b"_Z11hidden_gemmPf");
        let mut call = raw(Api::ModuleGetFunction, [0x10, 0x20, 0x30, 0, 0, 0], 0xabc);
        call.tag = EventTag::Lookup as u32;
        let e = decode(bytes(&LookupEvent { call, name })).unwrap();
        assert_eq!(
            e.detail,
            Detail::Lookup {
                handle: 0xabc,
                source: 0x20,
                name: Some("_Z11hidden_gemmPf".into())
            }
        );
    }

    #[test]
    fn comm_is_held_inline_as_the_kernel_gives_it() {
        let mut raw = [0u8; 16];
        raw[..6].copy_from_slice(b"python");
        raw[7] = b'x'; // after the NUL: not part of the name
        let c = Comm::from_raw(&raw);
        assert_eq!((&*c, c.to_string()), ("python", "python".to_owned()));
        assert_eq!(c, Comm::from("python"));
        assert_eq!(Comm::from_raw(&[b'a'; 16]).len(), 16);
        raw[..3].copy_from_slice(&[0xff, b'o', b'k']);
        assert_eq!(&*Comm::from_raw(&raw), "\u{fffd}okhon");
        // A longer name is cut at a character boundary within 16 bytes.
        assert_eq!(&*Comm::from("ééééééééé"), "éééééééé");
        assert_eq!(serde_json::to_string(&c).unwrap(), "\"python\"");
    }

    #[test]
    fn bad_records_are_errors() {
        assert_eq!(decode(&[1, 0]), Err(DecodeError::Short(2)));
        assert_eq!(decode(&[9, 0, 0, 0]), Err(DecodeError::Tag(9)));
        let mut ev = raw(Api::MemFree, [0; 6], 0);
        ev.api = 999;
        assert_eq!(decode(bytes(&ev)), Err(DecodeError::Api(999)));
        let exit = ExitEvent {
            tag: EventTag::Exit as u32,
            pid: 42,
            status: 3 << 8,
            flags: tracer_common::EXIT_STATUS_KNOWN,
        };
        assert_eq!(
            decode_record(bytes(&exit)),
            Ok(RingRecord::Exit(42, Some(768)))
        );
        let unknown = ExitEvent { flags: 0, ..exit };
        assert_eq!(
            decode_record(bytes(&unknown)),
            Ok(RingRecord::Exit(42, None))
        );
        let mut comm = [0u8; 16];
        comm[..6].copy_from_slice(b"worker");
        let name = NameEvent {
            tag: EventTag::Name as u32,
            pid: 42,
            tid: 43,
            renamed: 1,
            comm,
        };
        assert_eq!(
            decode_record(bytes(&name)),
            Ok(RingRecord::Name(42, 43, true, Comm::from("worker")))
        );
        assert_eq!(
            decode_record(&bytes(&name)[..20]),
            Err(DecodeError::Short(20))
        );
        let mut sample = raw(Api::LaunchKernel, [0; 6], 0);
        sample.flags = FLAG_COUNTED;
        assert!(decode(bytes(&sample)).unwrap().counted);
    }
}
