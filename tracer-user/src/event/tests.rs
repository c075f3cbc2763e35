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
    let ev = decode(bytes(&sample)).unwrap();
    assert_eq!((ev.counted, ev.untimed), (true, false));
    // Written at entry outside a window of the pair: counted, untimed.
    sample.flags = FLAG_COUNTED | tracer_common::launches::FLAG_UNTIMED;
    let ev = decode(bytes(&sample)).unwrap();
    assert_eq!((ev.counted, ev.untimed), (true, true));
}

#[test]
fn memsets_and_sized_copies_decode_their_bytes() {
    let copy = |api: Api, args: [u64; 6]| decode(bytes(&raw(api, args, 0))).unwrap().detail;
    let c = |dst, bytes, direction, stream| Detail::Copy {
        dst,
        src: 0,
        bytes,
        direction,
        stream,
    };
    // (dst, value, n[, stream]); 2-D: (dst, pitch, value, width, height[, stream]).
    assert_eq!(
        copy(Api::MemsetD16, [0xd0, 7, 100, 0xbad, 0, 0]),
        c(0xd0, 200, "memset", Some(0))
    );
    assert_eq!(
        copy(Api::MemsetD32AsyncPtsz, [0xd0, 7, 100, 0x5a, 0, 0]),
        c(0xd0, 400, "memset", Some(0x5a))
    );
    assert_eq!(
        copy(Api::MemsetD2D32Async, [0xd0, 4096, 7, 10, 4, 0x5a]),
        c(0xd0, 160, "memset", Some(0x5a))
    );
    // 2-D and 3-D: [types, width, height, depth, stream, params]; 1 host, 2 device.
    let types = |s: u64, d: u64| s | d << 32;
    assert_eq!(
        copy(Api::Memcpy2D, [types(1, 2), 100, 3, 1, 0xbad, 0x7f00]),
        c(0, 300, "htod", None)
    );
    assert_eq!(
        copy(
            Api::Memcpy3DAsyncPtsz,
            [types(2, 2), 100, 2, 3, 0x5a, 0x7f00]
        ),
        c(0, 600, "dtod", Some(0x5a))
    );
    // Batches: [sum read, count, read, 0, stream, sizes]; 1,000 copies, 128 read.
    assert_eq!(
        copy(Api::MemcpyBatchAsyncV2, [600, 3, 3, 0, 0x5a, 0x7f00]),
        c(0, 600, "default", Some(0x5a))
    );
    assert_eq!(
        copy(Api::MemcpyBatchAsync, [1_280, 1_000, 128, 0, 0x5a, 0x7f00]),
        c(0, 10_000, "default", Some(0x5a))
    );
}
