//! End-to-end: `cudatrace record` writes a Trace Event timeline of a workload: exactly one slice
//! per launch on the calling thread's track, valid per the format, GPU counters from the
//! stand-in NVML, and a cut that the file and the summary line both report.
use std::{collections::HashMap, io::Read as _, path::Path};

use integration_tests::{device_file, env, guards::TempDir, Cudatrace, Scenario, Workload};
use serde_json::Value;

const SCENARIO: &str = "gpu 0 uuid=GPU-11111111-2222-3333-4444-555555555555 sm=75 mem=40 total=85899345920 used=4294967296 \
                        temp=65 power_mw=250000 sm_clock=1980 reasons=0x0 pcie_tx_kbs=1 pcie_rx_kbs=1\n";

/// The timeline at `path` (gunzipped when it ends in .gz), parsed.
fn read(path: &Path) -> Value {
    let bytes = std::fs::read(path).expect("timeline written");
    let text = if path.extension().is_some_and(|e| e == "gz") {
        let mut s = String::new();
        flate2::read::GzDecoder::new(&bytes[..])
            .read_to_string(&mut s)
            .expect("gzip");
        s
    } else {
        String::from_utf8(bytes).expect("utf-8")
    };
    serde_json::from_str(&text).expect("one JSON document")
}

/// Every event has a phase and a pid; slices and counters a numeric time; complete slices a
/// duration of at least 0; per track, slices start in order.
fn check_format(events: &[Value]) {
    let mut last: HashMap<(u64, u64), f64> = HashMap::new();
    for e in events {
        let ph = e["ph"].as_str().unwrap_or_else(|| panic!("no phase: {e}"));
        assert!(e["pid"].is_u64(), "{e}");
        if ph == "M" {
            continue;
        }
        let ts = e["ts"].as_f64().unwrap_or_else(|| panic!("no ts: {e}"));
        if ph == "X" {
            assert!(e["dur"].as_f64().is_some_and(|d| d >= 0.0), "{e}");
            let track = (e["pid"].as_u64().unwrap(), e["tid"].as_u64().expect("tid"));
            let prev = last.insert(track, ts).unwrap_or(0.0);
            assert!(ts >= prev, "track {track:?} goes back from {prev} to {ts}");
        } else {
            assert!(["C", "i"].contains(&ph), "unexpected phase {ph}");
        }
    }
}

/// 3,000 launches and 100 copies from two threads: 3,000 launch slices named by their kernel,
/// on the two threads' tracks of the workload's pid; the process track is named; the final wait
/// closes the batches on the estimate track; NVML utilization is a counter.
#[test]
fn record_holds_one_slice_per_launch() {
    let Some(env) = env() else { return };
    let dir = TempDir::new("record");
    let out = dir.join("trace.json");
    let scenario = dir.write("nvml.txt", SCENARIO);
    let lib = env.libcuda();
    let nvml = env.libnvml();
    let recorder = Cudatrace::try_start_command(
        &env,
        "record",
        &[
            "-o",
            out.to_str().unwrap(),
            "--lib",
            lib.to_str().unwrap(),
            "--nvml-lib",
            nvml.to_str().unwrap(),
        ],
        &[("NVML_STANDIN_SCENARIO", scenario.to_str().unwrap())],
    )
    .unwrap_or_else(|t| panic!("record did not start: {:?}", t.stderr));
    let dev = device_file("record");
    let report = Workload::new(
        &env,
        Scenario::Basic {
            launches: 3000,
            copies: 100,
        },
    )
    .threads(2)
    .device(&dev)
    .run();
    std::thread::sleep(std::time::Duration::from_millis(1200));
    let traced = recorder.stop();
    let _ = std::fs::remove_file(&dev);
    assert_eq!(traced.code, Some(0), "{:?}", traced.stderr);
    let pid = report["pid"].as_u64().unwrap();
    let doc = read(&out);
    let events = doc["traceEvents"].as_array().expect("traceEvents");
    check_format(events);
    let launches: Vec<&Value> = events
        .iter()
        .filter(|e| e["ph"] == "X" && e["cat"] == "launch" && e["pid"] == pid)
        .collect();
    let tids: std::collections::HashSet<u64> = launches
        .iter()
        .map(|e| e["tid"].as_u64().unwrap())
        .collect();
    let batches = events
        .iter()
        .filter(|e| e["cat"] == "batch_span" && e["pid"] == pid)
        .count();
    let util = events
        .iter()
        .filter(|e| e["ph"] == "C" && e["name"] == "GPU 0 utilization %")
        .count();
    let summary = traced
        .stderr
        .iter()
        .find(|l| l.starts_with("record:"))
        .cloned()
        .unwrap_or_default();
    eprintln!(
        "e2e record_holds_one_slice_per_launch: launches in=3000 slices={} threads={} batches={batches} utilization counters={util}; {summary}",
        launches.len(),
        tids.len()
    );
    assert_eq!(launches.len(), 3000);
    assert_eq!(tids.len(), 2);
    assert!(tids.iter().all(|t| *t != pid && *t > 0));
    assert!(launches
        .iter()
        .all(|e| e["name"] == "hidden_gemm(float*, float*, int)"
            && e["args"]["api"] == "cuLaunchKernel"));
    let named = events
        .iter()
        .find(|e| e["ph"] == "M" && e["name"] == "process_name" && e["pid"] == pid)
        .expect("process named");
    assert_eq!(named["args"]["name"], format!("cuda-workload (pid {pid})"));
    assert!(
        batches >= 1,
        "the final cuCtxSynchronize closes the batches"
    );
    let track = |name: &str| {
        events.iter().any(|e| {
            e["ph"] == "M"
                && e["name"] == "thread_name"
                && e["pid"] == pid
                && e["args"]["name"] == name
        })
    };
    assert!(
        track("batch span: every stream"),
        "the context-wide wait's track"
    );
    assert!(util >= 1);
    assert_eq!(
        events
            .iter()
            .find(|e| e["ph"] == "C" && e["name"] == "GPU 0 utilization %")
            .unwrap()["args"]["sm"],
        75
    );
    assert_eq!(doc["otherData"]["events_left_out"], 0);
    assert!(
        summary.ends_with("; 0 left out past --max-events"),
        "{summary}"
    );
}

/// `--max-events 100` on a gzip file: exactly 100 events written, the rest counted, and both
/// the file (`otherData`, a last instant event) and the summary line say how many.
#[test]
fn record_cut_by_max_events_says_so() {
    let Some(env) = env() else { return };
    let dir = TempDir::new("record-cut");
    let out = dir.join("trace.json.gz");
    let lib = env.libcuda();
    let recorder = Cudatrace::try_start_command(
        &env,
        "record",
        &[
            "-o",
            out.to_str().unwrap(),
            "--lib",
            lib.to_str().unwrap(),
            "--max-events",
            "100",
        ],
        &[],
    )
    .unwrap_or_else(|t| panic!("record did not start: {:?}", t.stderr));
    let dev = device_file("record-cut");
    Workload::new(
        &env,
        Scenario::Basic {
            launches: 1000,
            copies: 0,
        },
    )
    .device(&dev)
    .run();
    std::thread::sleep(std::time::Duration::from_millis(500));
    let traced = recorder.stop();
    let _ = std::fs::remove_file(&dev);
    let doc = read(&out);
    let events = doc["traceEvents"].as_array().expect("traceEvents");
    check_format(events);
    let written = events
        .iter()
        .filter(|e| e["ph"] != "M" && e["cat"] != "cudatrace")
        .count() as u64;
    let left_out = doc["otherData"]["events_left_out"].as_u64().unwrap();
    let summary = traced
        .stderr
        .iter()
        .find(|l| l.starts_with("record:"))
        .cloned()
        .unwrap_or_default();
    eprintln!(
        "e2e record_cut_by_max_events_says_so: written={written} left_out={left_out}; {summary}"
    );
    assert_eq!(written, 100);
    assert_eq!(doc["otherData"]["events"], 100);
    // 1,000 launches plus the set-up calls and the final wait's batch: more than 1,000 in all.
    assert!(written + left_out > 1000, "{left_out}");
    assert!(events.iter().any(|e| e["cat"] == "cudatrace"
        && e["name"]
            .as_str()
            .unwrap()
            .contains(&format!("{left_out} events left out"))));
    assert!(
        summary.starts_with("record: 100 events written")
            && summary.contains(&format!("; {left_out} left out")),
        "{summary}"
    );
}

/// A path that cannot be written is one line, before anything is attached.
#[test]
fn record_to_an_unwritable_path_is_one_line() {
    let Some(env) = env() else { return };
    let lib = env.libcuda();
    let Err(traced) = Cudatrace::try_start_command(
        &env,
        "record",
        &[
            "-o",
            "/nonexistent-dir/trace.json",
            "--lib",
            lib.to_str().unwrap(),
        ],
        &[],
    ) else {
        panic!("record became ready with an unwritable path");
    };
    eprintln!(
        "e2e record_to_an_unwritable_path_is_one_line: {:?}",
        traced.stderr
    );
    assert_eq!(traced.code, Some(1));
    assert_eq!(traced.stderr.len(), 1, "{:?}", traced.stderr);
    assert!(traced.stderr[0].starts_with("cudatrace: cannot create the timeline /nonexistent-dir/trace.json (give a writable path with -o): "), "{:?}", traced.stderr);
}

/// A library that is not there is one line, and leaves no timeline file behind.
#[test]
fn record_with_a_missing_library_leaves_no_file() {
    let Some(env) = env() else { return };
    let dir = integration_tests::guards::TempDir::new("record-nolib");
    let out = dir.join("trace.json");
    let Err(traced) = Cudatrace::try_start_command(
        &env,
        "record",
        &["-o", out.to_str().unwrap(), "--lib", "/nope/libcuda.so.1"],
        &[],
    ) else {
        panic!("record became ready without a library");
    };
    eprintln!(
        "e2e record_with_a_missing_library_leaves_no_file: {:?}; {} exists: {}",
        traced.stderr,
        out.display(),
        out.exists()
    );
    assert_eq!(traced.code, Some(1));
    assert_eq!(traced.stderr.len(), 1, "{:?}", traced.stderr);
    assert!(
        traced.stderr[0].starts_with("cudatrace: library not found: /nope/libcuda.so.1"),
        "{:?}",
        traced.stderr
    );
    assert!(!out.exists(), "the timeline file was left behind");
}
