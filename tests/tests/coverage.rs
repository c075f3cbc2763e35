//! End-to-end: every entry point, kernel names, device memory, and a shared device.
use std::collections::{BTreeMap, BTreeSet};

use integration_tests::{device_file, env, Cudatrace, Scenario, Workload};
use serde_json::{json, Value};

const N: u64 = 50;

/// Every entry point N times through function pointers: N events each, with exact arguments,
/// `_ptsz`/`_ptds` counted apart from the plain ones, and kernel names on every launch.
#[test]
fn every_entry_point_exact() {
    let Some(env) = env() else { return };
    let lib = env.libcuda();
    let tracer = Cudatrace::start(&env, &["--json", "--lib", lib.to_str().unwrap()]);
    let dev = device_file("each");
    let report = Workload::new(&env, Scenario::Each(N)).device(&dev).run();
    let traced = tracer.stop();
    assert_eq!(traced.code, Some(0), "{:?}", traced.stderr);
    let pid = report["pid"].as_u64().unwrap();
    let events = traced.of_pid(pid);

    // Counts per symbol, exactly as called.
    let mut want: BTreeMap<String, u64> = BTreeMap::new();
    for (api, n) in report["calls"].as_object().unwrap() {
        // `name(why)`: more calls of `name`, made for set-up or at the end.
        let api = api.split('(').next().unwrap_or(api);
        *want.entry(api.to_owned()).or_default() += n.as_u64().unwrap();
    }
    assert_eq!(
        want.len(),
        tracer_common::Api::ALL.len(),
        "the workload calls every entry point"
    );
    let mut got: BTreeMap<String, u64> = BTreeMap::new();
    for e in &events {
        *got.entry(e["api"].as_str().unwrap().to_owned())
            .or_default() += 1;
        assert_eq!(e["result"], 0, "{e}");
    }
    assert_eq!(got, want, "events per entry point");

    let stream = report["stream"].clone();
    let by_api = |api: &'static str| events.iter().filter(move |e| e["api"] == api).copied();
    let hidden_gemm = ("hidden_gemm(float*, float*, int)", "_Z11hidden_gemmPfS_i");
    let lib_axpy = ("lib_axpy(float, float const*, float*)", "_Z8lib_axpyfPKfPf");
    for (api, kernel, function) in [
        ("cuLaunchKernel", hidden_gemm, &report["function"]),
        ("cuLaunchKernel_ptsz", lib_axpy, &report["kernel_function"]),
        ("cuLaunchCooperativeKernel", lib_axpy, &report["kernel"]),
        (
            "cuLaunchCooperativeKernel_ptsz",
            lib_axpy,
            &report["kernel"],
        ),
        ("cuLaunchKernelEx", hidden_gemm, &report["function"]),
        (
            "cuLaunchKernelEx_ptsz",
            lib_axpy,
            &report["kernel_function"],
        ),
    ] {
        let mut seen = BTreeSet::new();
        for e in by_api(api) {
            assert_eq!(e["kind"], "launch");
            let i = e["grid"][0].as_u64().unwrap() - 1;
            assert_eq!(e["grid"], json!([i + 1, 2, 3]), "{e}");
            assert_eq!(e["block"], json!([4, 5, 6]), "{e}");
            assert_eq!(e["shared_mem_bytes"], json!(7 + i), "{e}");
            assert_eq!(e["stream"], stream, "{e}");
            assert_eq!(&e["function"], function, "{e}");
            assert_eq!(
                (e["kernel"].as_str(), e["kernel_mangled"].as_str()),
                (Some(kernel.0), Some(kernel.1)),
                "{e}"
            );
            seen.insert(i);
        }
        assert_eq!(seen, (0..N).collect(), "{api} launches");
    }
    for api in ["cuGraphLaunch", "cuGraphLaunch_ptsz"] {
        assert!(by_api(api).all(|e| e["kind"] == "graph_launch"
            && e["graph_exec"] == report["graph"]
            && e["stream"] == stream));
    }
    let directions = [
        ("cuMemcpyHtoD_v2", "htod", false),
        ("cuMemcpyHtoD_v2_ptds", "htod", false),
        ("cuMemcpyDtoH_v2", "dtoh", false),
        ("cuMemcpyDtoH_v2_ptds", "dtoh", false),
        ("cuMemcpyDtoD_v2", "dtod", false),
        ("cuMemcpyDtoD_v2_ptds", "dtod", false),
        ("cuMemcpyHtoDAsync_v2", "htod", true),
        ("cuMemcpyHtoDAsync_v2_ptsz", "htod", true),
        ("cuMemcpyDtoHAsync_v2", "dtoh", true),
        ("cuMemcpyDtoHAsync_v2_ptsz", "dtoh", true),
        ("cuMemcpyDtoDAsync_v2", "dtod", true),
        ("cuMemcpyDtoDAsync_v2_ptsz", "dtod", true),
        ("cuMemcpy", "default", false),
        ("cuMemcpy_ptds", "default", false),
        ("cuMemcpyAsync", "default", true),
        ("cuMemcpyAsync_ptsz", "default", true),
        ("cuMemcpyPeer", "peer", false),
        ("cuMemcpyPeer_ptds", "peer", false),
        ("cuMemcpyPeerAsync", "peer", true),
        ("cuMemcpyPeerAsync_ptsz", "peer", true),
    ];
    for (api, dir, asynchronous) in directions {
        let bytes: BTreeSet<u64> = by_api(api)
            .inspect(|e| {
                assert_eq!(
                    (e["kind"].as_str(), e["direction"].as_str()),
                    (Some("memcpy"), Some(dir)),
                    "{e}"
                );
                assert_eq!(e.get("stream"), asynchronous.then_some(&stream), "{e}");
            })
            .filter_map(|e| e["bytes"].as_u64())
            .collect();
        assert_eq!(bytes, (100..100 + N).collect(), "{api} bytes");
    }
    sized_calls_exact(&events, &stream);
    assert!(by_api("cuStreamSynchronize").all(|e| e["kind"] == "sync" && e["stream"] == stream));
    assert!(by_api("cuStreamSynchronize_ptsz").all(|e| e["stream"] == 0));
    assert!(by_api("cuEventSynchronize").all(|e| e["event"] == report["event"]));
    assert!(by_api("cuStreamWaitEvent_ptsz")
        .all(|e| e["stream"] == stream && e["event"] == report["event"]));
    assert!(by_api("cuModuleGetFunction").all(|e| e["kind"] == "lookup"
        && e["name"] == hidden_gemm.1
        && e["handle"] == report["function"]
        && e["kernel"] == hidden_gemm.0));
    assert!(by_api("cuLibraryGetKernel")
        .all(|e| e["name"] == lib_axpy.1 && e["handle"] == report["kernel"]));
    assert!(by_api("cuKernelGetFunction")
        .all(|e| e["handle"] == report["kernel_function"] && e["source"] == report["kernel"]));
    for api in ["cuMemAllocAsync", "cuMemAllocAsync_ptsz"] {
        let sizes: BTreeSet<u64> = by_api(api).map(|e| e["bytes"].as_u64().unwrap()).collect();
        assert_eq!(sizes, (1..=N).map(|i| 4096 * i).collect(), "{api} sizes");
        assert!(by_api(api).all(|e| e["dptr"].as_u64().unwrap() != 0 && e["stream"] == stream));
    }

    // Device memory: two 1 MiB buffers stay, and what the last phase leaves: N of 2 MiB from
    // each pool variant and managed, N pitched of 256 x 8 (the VMM handles are released, the
    // other frees matched), which is also the peak.
    let memory = traced
        .stderr
        .iter()
        .find(|l| l.starts_with(&format!("memory: pid={pid} ")))
        .expect("memory line");
    let current = (2 << 20) + 3 * N * (2 << 20) + N * 2048;
    let allocs = 2 + 8 * N;
    let frees = 4 * N;
    assert_eq!(
        memory,
        &format!("memory: pid={pid} current_bytes={current} peak_bytes={current} allocs={allocs} frees={frees} unknown_frees=1")
    );
    for (api, bytes) in [
        ("cuMemCreate", 2 << 20),
        ("cuMemAllocFromPoolAsync", 2 << 20),
        ("cuMemAllocFromPoolAsync_ptsz", 2 << 20),
        ("cuMemAllocManaged", 2 << 20),
        ("cuMemAllocPitch_v2", 2048),
    ] {
        assert!(
            by_api(api).all(|e| e["bytes"] == bytes && e["dptr"].as_u64().unwrap() != 0),
            "{api}: {bytes} bytes each"
        );
    }
    context_calls_exact(&events, &report["context"]);
    let summary = traced.summary();
    assert_eq!(summary["dropped"], 0);
    let launches = events.iter().filter(|e| e["kind"] == "launch").count();
    let named = events
        .iter()
        .filter(|e| e["kind"] == "launch" && e["kernel"].is_string())
        .count();
    eprintln!(
        "e2e every_entry_point_exact: {} entry points, calls in={} events out={} launches named={named}/{launches} dropped=0",
        want.len(),
        want.values().sum::<u64>(),
        events.len()
    );
}

/// The context calls' arguments: device 0's primary context, its UUID read whole (16 bytes, the
/// stand-in's default: every byte 1), created contexts of device 0, streams returned.
fn context_calls_exact(events: &[&Value], ctx: &Value) {
    let of = |api: &'static str| events.iter().filter(move |e| e["api"] == api).copied();
    let uuid = "01010101-0101-0101-0101-010101010101";
    for e in of("cuDeviceGetUuid").chain(of("cuDeviceGetUuid_v2")) {
        assert_eq!(
            (&e["op"], &e["device"], e["uuid"].as_str()),
            (&json!("uuid"), &json!(0), Some(uuid)),
            "{e}"
        );
    }
    for e in of("cuDevicePrimaryCtxRetain") {
        assert_eq!(
            (&e["op"], &e["context"], &e["device"], &e["created"]),
            (&json!("bind"), ctx, &json!(0), &json!(false)),
            "{e}"
        );
    }
    for api in [
        "cuCtxSetCurrent",
        "cuCtxPushCurrent_v2",
        "cuCtxPopCurrent_v2",
    ] {
        let op = api
            .trim_start_matches("cuCtx")
            .trim_end_matches("Current_v2")
            .trim_end_matches("Current");
        for e in of(api) {
            assert_eq!(
                (e["op"].as_str(), &e["context"]),
                (Some(op.to_lowercase().as_str()), ctx),
                "{e}"
            );
        }
    }
    for api in ["cuCtxCreate_v2", "cuCtxCreate_v4"] {
        for e in of(api) {
            assert!(
                e["op"] == "bind"
                    && e["created"] == true
                    && e["device"] == 0
                    && e["context"] != *ctx
                    && e["context"] != 0,
                "{e}"
            );
        }
    }
    for e in of("cuCtxDestroy_v2") {
        assert!(e["op"] == "destroy" && e["context"] != *ctx, "{e}");
    }
    for e in of("cuStreamCreate").chain(of("cuStreamCreateWithPriority")) {
        assert!(
            e["op"] == "stream" && e["stream"].as_u64().unwrap() != 0,
            "{e}"
        );
    }
}

fn mean_wait(events: &[&Value], pid: u64) -> (f64, usize) {
    let waits: Vec<u64> = events
        .iter()
        .filter(|e| e["pid"].as_u64() == Some(pid) && e["api"] == "cuStreamSynchronize")
        .map(|e| e["duration_ns"].as_u64().unwrap())
        .collect();
    (
        waits.iter().sum::<u64>() as f64 / waits.len().max(1) as f64,
        waits.len(),
    )
}

/// Two processes on one simulated device: the measured wait of a light job rises while a heavy
/// job keeps the device busy.
#[test]
fn waits_rise_under_a_busy_neighbour() {
    let Some(env) = env() else { return };
    let lib = env.libcuda();
    let dev = device_file("shared");
    let vars = [
        ("CUDA_STANDIN_DEVICE", dev.as_str()),
        ("CUDA_STANDIN_NS_PER_BLOCK", "1000"),
    ];
    let tracer = Cudatrace::start(&env, &["--json", "--lib", lib.to_str().unwrap()]);
    // Light: 10-block kernels (10 us each), a wait after each.
    let light = || {
        Workload::new(
            &env,
            Scenario::Loop {
                seconds: 1.5,
                grid: 10,
                sync_every: 1,
            },
        )
        .vars(&vars)
    };
    let alone = light().run();
    let heavy = Workload::new(
        &env,
        Scenario::Loop {
            seconds: 3.0,
            grid: 2000,
            sync_every: 4,
        },
    )
    .vars(&vars)
    .spawn();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let shared = light().run();
    let heavy = heavy.finish();
    let traced = tracer.stop();
    let events: Vec<&Value> = traced.events.iter().collect();
    let (alone_ns, alone_n) = mean_wait(&events, alone["pid"].as_u64().unwrap());
    let (shared_ns, shared_n) = mean_wait(&events, shared["pid"].as_u64().unwrap());
    assert_eq!(alone_n as u64, alone["syncs"].as_u64().unwrap());
    assert_eq!(shared_n as u64, shared["syncs"].as_u64().unwrap());
    let heavy_launches = events
        .iter()
        .filter(|e| e["pid"] == heavy["pid"] && e["api"] == "cuLaunchKernel")
        .count() as u64;
    assert_eq!(heavy_launches, heavy["launches"].as_u64().unwrap());
    eprintln!(
        "e2e waits_rise_under_a_busy_neighbour: mean wait alone={alone_ns:.0} ns ({alone_n} waits), \
         beside the heavy job={shared_ns:.0} ns ({shared_n} waits), ratio={:.1}",
        shared_ns / alone_ns
    );
    assert!(
        shared_ns > 10.0 * alone_ns,
        "wait alone {alone_ns} ns, shared {shared_ns} ns"
    );
    assert_eq!(traced.summary()["dropped"], 0);
}

/// Memsets, 2-D, 3-D and batch copies of the `each` workload (tests/standin/workload_sized.c):
/// call i of each variant, its kind, direction, stream and exact bytes.
fn sized_calls_exact(events: &[&Value], stream: &Value) {
    let zero = json!(0);
    let mut checked = 0;
    for api in tracer_common::Api::ALL {
        let info = api.info();
        let sym = api.symbol();
        let shape = info.shape;
        use tracer_common::api::Shape;
        let (kind, direction, bytes): (&str, &str, Box<dyn Fn(u64) -> u64>) = match shape {
            Shape::Memset => ("memset", "memset", {
                let el = api.element_bytes();
                Box::new(move |i| (100 + i) * el)
            }),
            Shape::Memset2D => ("memset", "memset", {
                let el = api.element_bytes();
                Box::new(move |i| (10 + i) * el * 4)
            }),
            Shape::Copy2D if sym.contains("Unaligned") => {
                ("memcpy", "dtoh", Box::new(|i| 3 * (100 + i)))
            }
            Shape::Copy2D if sym.contains("Async") => {
                ("memcpy", "dtod", Box::new(|i| 3 * (100 + i)))
            }
            Shape::Copy2D => ("memcpy", "htod", Box::new(|i| 3 * (100 + i))),
            Shape::Copy3D if sym.contains("Async") => {
                ("memcpy", "dtod", Box::new(|i| 6 * (100 + i)))
            }
            Shape::Copy3D => ("memcpy", "htod", Box::new(|i| 6 * (100 + i))),
            Shape::CopyBatch => ("memcpy", "default", Box::new(|i| 600 + i)),
            _ => continue,
        };
        // Memsets are queued on a stream even without one (0, the default); synchronous 2-D and
        // 3-D copies carry none.
        let want_stream = match (info.has_stream, shape) {
            (true, _) => Some(stream),
            (false, Shape::Memset | Shape::Memset2D) => Some(&zero),
            (false, _) => None,
        };
        let calls: Vec<&Value> = events.iter().filter(|e| e["api"] == sym).copied().collect();
        assert_eq!(calls.len() as u64, N, "{sym}");
        for e in &calls {
            assert_eq!(
                (e["kind"].as_str(), e["direction"].as_str(), e.get("stream")),
                (Some(kind), Some(direction), want_stream),
                "{sym}: {e}"
            );
        }
        let got: BTreeSet<u64> = calls.iter().map(|e| e["bytes"].as_u64().unwrap()).collect();
        assert_eq!(got, (0..N).map(&bytes).collect(), "{sym} bytes");
        checked += 1;
    }
    assert_eq!(checked, 38, "memsets, 2-D, 3-D and batch copies");
}
