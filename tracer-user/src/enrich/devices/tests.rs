use tracer_common::Api;

use super::*;
use crate::event::context::{nvml_uuid_key, uuid_text};

const CTX_A: u64 = 0xa000;
const CTX_B: u64 = 0xb000;

fn ctx(api: Api, tid: u32, c: ContextCall) -> Event {
    let mut e = Event::of(api, 7, Detail::Context(c));
    e.tid = tid;
    e
}

fn on(tid: u32, mut e: Event) -> Event {
    e.tid = tid;
    e
}

fn lookup(tid: u32, handle: u64) -> Event {
    on(
        tid,
        Event::of(
            Api::ModuleGetFunction,
            7,
            Detail::Lookup {
                handle,
                source: 1,
                name: None,
            },
        ),
    )
}

fn copy(tid: u32, bytes: u64, stream: Option<u64>) -> Event {
    on(
        tid,
        Event::of(
            Api::MemcpyHtoDAsync,
            7,
            Detail::Copy {
                dst: 1,
                src: 2,
                bytes,
                direction: "htod",
                stream,
            },
        ),
    )
}

/// Two primary contexts on ordinals 0 and 1, thread 1 on A (set), thread 2 on B (pushed).
fn two_devices() -> ProcessDevices {
    let mut d = ProcessDevices::default();
    for (c, dev) in [(CTX_A, 0), (CTX_B, 1)] {
        d.observe(&ctx(
            Api::DevicePrimaryCtxRetain,
            1,
            ContextCall::Bind {
                context: c,
                device: dev,
                created: false,
            },
        ));
    }
    d.observe(&ctx(
        Api::CtxSetCurrent,
        1,
        ContextCall::Set { context: CTX_A },
    ));
    d.observe(&ctx(
        Api::CtxPushCurrent,
        2,
        ContextCall::Push { context: CTX_B },
    ));
    d
}

#[test]
fn launches_and_copies_go_to_their_threads_devices() {
    let mut d = two_devices();
    assert_eq!(
        d.observe(&Event::launch(Api::LaunchKernel, 7, 0x10, 0)),
        0,
        "tid 7 has none"
    );
    for _ in 0..3 {
        assert_eq!(
            d.observe(&on(1, Event::launch(Api::LaunchKernel, 7, 0x10, 0))),
            CTX_A
        );
    }
    for _ in 0..5 {
        assert_eq!(
            d.observe(&on(2, Event::launch(Api::LaunchKernel, 7, 0x20, 0))),
            CTX_B
        );
    }
    d.observe(&copy(1, 100, None));
    d.observe(&copy(2, 1000, Some(0)));
    let w = |launches, bytes| DeviceWork { launches, bytes };
    assert_eq!(
        d.work(),
        vec![
            (Some(0), None, w(3, 100)),
            (Some(1), None, w(5, 1000)),
            (None, None, w(1, 0))
        ]
    );
}

#[test]
fn a_function_and_a_stream_keep_the_context_they_were_made_in() {
    let mut d = two_devices();
    d.observe(&lookup(2, 0xf00));
    d.observe(&ctx(
        Api::StreamCreate,
        2,
        ContextCall::Stream { stream: 0x5000 },
    ));
    // Thread 1 (on A) launches B's function and copies on B's stream: both are B's work.
    assert_eq!(
        d.observe(&on(1, Event::launch(Api::LaunchKernel, 7, 0xf00, 0))),
        CTX_B
    );
    assert_eq!(d.observe(&copy(1, 64, Some(0x5000))), CTX_B);
    // Counted in the kernel: by the function's context.
    d.observe_launches(&LaunchDelta {
        api: Api::LaunchKernel,
        function: 0xf00,
        bucket: 0,
        count: 10,
        errors: 2,
        sum_ns: 0,
        threads: 0,
        untimed: 0,
        estimated_errors: 0,
    });
    assert_eq!(
        d.work(),
        vec![(
            Some(1),
            None,
            DeviceWork {
                launches: 9,
                bytes: 64
            }
        )]
    );
}

#[test]
fn push_pop_set_and_destroy_follow_cudas_stack() {
    let mut d = two_devices();
    let current =
        |d: &mut ProcessDevices| d.observe(&on(1, Event::launch(Api::LaunchKernel, 7, 1, 0)));
    d.observe(&ctx(
        Api::CtxPushCurrent,
        1,
        ContextCall::Push { context: CTX_B },
    ));
    assert_eq!(current(&mut d), CTX_B);
    d.observe(&ctx(
        Api::CtxPopCurrent,
        1,
        ContextCall::Pop { context: CTX_B },
    ));
    assert_eq!(current(&mut d), CTX_A);
    // Setting NULL pops; setting replaces the top.
    d.observe(&ctx(Api::CtxSetCurrent, 1, ContextCall::Set { context: 0 }));
    assert_eq!(current(&mut d), 0);
    d.observe(&ctx(
        Api::CtxCreate,
        1,
        ContextCall::Bind {
            context: 0xc000,
            device: 3,
            created: true,
        },
    ));
    assert_eq!(current(&mut d), 0xc000, "a created context is made current");
    d.observe(&ctx(
        Api::CtxDestroy,
        1,
        ContextCall::Destroy { context: 0xc000 },
    ));
    assert_eq!(current(&mut d), 0);
    // A failed call changes nothing.
    let mut failed = ctx(Api::CtxSetCurrent, 1, ContextCall::Set { context: CTX_B });
    failed.result = 201;
    d.observe(&failed);
    assert_eq!(current(&mut d), 0);
}

#[test]
fn uuids_name_devices_as_nvml_prints_them() {
    let low = u64::from_le_bytes([0x89, 0x32, 0xf9, 0x37, 0xd7, 0x2c, 0x41, 0x06]);
    let high = u64::from_le_bytes([0xc1, 0x2f, 0x20, 0xbd, 0x9f, 0xae, 0xd9, 0xf6]);
    let text = uuid_text(low, high);
    assert_eq!(text, "8932f937-d72c-4106-c12f-20bd9faed9f6");
    assert_eq!(
        nvml_uuid_key("GPU-8932F937-D72C-4106-C12F-20BD9FAED9F6"),
        text
    );
    assert_eq!(
        nvml_uuid_key("MIG-8932f937-d72c-4106-c12f-20bd9faed9f6"),
        text
    );
    let mut d = two_devices();
    d.observe(&ctx(
        Api::DeviceGetUuid,
        1,
        ContextCall::Uuid {
            device: 1,
            uuid: text.clone(),
        },
    ));
    d.observe(&on(2, Event::launch(Api::LaunchKernel, 7, 1, 0)));
    assert_eq!(d.work()[0].1, Some(text.as_str()));
}

#[test]
fn a_tenant_binding_endless_contexts_stays_bounded() {
    let mut d = ProcessDevices::default();
    for i in 0..(MAX_CONTEXTS as u64 * 4) {
        let c = 0x1_0000 + i;
        d.observe(&ctx(
            Api::CtxCreate,
            1,
            ContextCall::Bind {
                context: c,
                device: i as i32,
                created: true,
            },
        ));
        d.observe(&on(1, Event::launch(Api::LaunchKernel, 7, 1, 0)));
        d.observe(&ctx(
            Api::CtxDestroy,
            1,
            ContextCall::Destroy { context: c },
        ));
    }
    let work = d.work();
    assert_eq!(work.len(), MAX_CONTEXTS + 1);
    assert_eq!(
        work.iter().map(|w| w.2.launches).sum::<u64>(),
        MAX_CONTEXTS as u64 * 4
    );
    assert_eq!(work.last().unwrap().0, None);
    for tid in 0..(MAX_THREADS as u32 + 10) {
        d.observe(&ctx(
            Api::CtxPushCurrent,
            tid,
            ContextCall::Push { context: CTX_A },
        ));
    }
    assert_eq!(d.threads.len(), MAX_THREADS);
    assert_eq!(d.overflowed, 10);
}
