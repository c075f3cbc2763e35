//! End-to-end: `cudatrace census` counts every exported `cu*` function a process calls, traced
//! or not, and names those cudatrace does not trace.
use std::collections::BTreeMap;

use integration_tests::{device_file, env, Cudatrace, Scenario, Workload};
use serde_json::Value;

/// `each 3` under `census --pid`: every traced entry point counted exactly as called, the
/// set-up functions the tracer does not probe listed as not traced, and another process's
/// calls left out.
#[test]
fn census_counts_every_call_and_names_what_is_not_traced() {
    let Some(env) = env() else { return };
    let lib = env.libcuda();
    let dev = device_file("census");
    // The counted process waits for stdin to close, so that the census can start on its pid.
    let counted = Workload::new(&env, Scenario::Each(3))
        .device(&dev)
        .hold()
        .spawn();
    let pid = counted.pid().to_string();
    let census = Cudatrace::try_start_command(
        &env,
        "census",
        &[
            "--json",
            "--duration",
            "30s",
            "--pid",
            &pid,
            "--lib",
            lib.to_str().unwrap(),
        ],
        &[],
    )
    .unwrap_or_else(|t| panic!("census did not start: {:?}", t.stderr));
    let other = Workload::new(&env, Scenario::Each(2)).device(&dev).run();
    let report = counted.release_and_wait();
    let traced = census.stop();
    let _ = std::fs::remove_file(&dev);
    assert_eq!(traced.code, Some(0), "{:?}", traced.stderr);
    let rows: BTreeMap<String, Value> = traced
        .stdout
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .map(|r| (r["symbol"].as_str().unwrap().to_owned(), r))
        .collect();
    let mut want: BTreeMap<String, u64> = BTreeMap::new();
    for (api, n) in report["calls"].as_object().unwrap() {
        let api = api.split('(').next().unwrap_or(api);
        *want.entry(api.to_owned()).or_default() += n.as_u64().unwrap();
    }
    let got: BTreeMap<String, u64> = rows
        .iter()
        .filter(|(_, r)| r["traced"] == true)
        .map(|(s, r)| (s.clone(), r["calls"].as_u64().unwrap()))
        .collect();
    let untraced: Vec<&str> = rows
        .iter()
        .filter(|(_, r)| r["traced"] == false)
        .map(|(s, _)| s.as_str())
        .collect();
    let summary = traced
        .log_events("census")
        .first()
        .map(|r| r["msg"].as_str().unwrap_or("").to_owned())
        .unwrap_or_default();
    eprintln!(
        "e2e census_counts_every_call_and_names_what_is_not_traced: traced symbols {} ({} calls), not traced {untraced:?}; \
         other process {}; {summary}",
        got.len(),
        got.values().sum::<u64>(),
        other["pid"]
    );
    assert_eq!(got, want, "every traced entry point, exactly as called");
    assert_eq!(
        untraced,
        vec![
            "cuDeviceGet",
            "cuDeviceGetDefaultMemPool",
            "cuEventCreate",
            "cuGraphInstantiateStandin",
            "cuInit",
            "cuLibraryLoadData",
            "cuModuleLoadData",
        ]
    );
    // Two streams of the scenario, and each_devices's N = 3.
    assert_eq!(rows["cuStreamCreate"]["calls"], 2 + 3);
    assert!(
        rows.values().all(|r| r["processes"] == 1),
        "only --pid's calls"
    );
    assert!(
        summary.contains("7 of them not traced by cudatrace: cuDeviceGet, cuDeviceGetDefaultMemPool, cuEventCreate"),
        "{summary}"
    );
}

/// A census without a library to probe says what to do and fails.
#[test]
fn census_of_a_process_without_libcuda_says_what_to_do() {
    let Some(env) = env() else { return };
    // A process that loads no driver.
    let plain = Workload::new(&env, Scenario::Named("crowd", vec![10, 30])).spawn();
    let pid = plain.pid().to_string();
    let traced =
        Cudatrace::try_start_command(&env, "census", &["--duration", "1", "--pid", &pid], &[])
            .err()
            .expect("census refuses");
    drop(plain);
    eprintln!(
        "e2e census_of_a_process_without_libcuda_says_what_to_do: exit {:?}, {:?}",
        traced.code,
        traced.stderr.last()
    );
    assert_eq!(traced.code, Some(1));
    assert_eq!(
        traced.stderr.last().map(String::as_str),
        Some(
            format!("cudatrace: process {pid} maps no libcuda: name the library with --lib PATH")
                .as_str()
        )
    );
}

/// A wrong `--lib` (missing, not ELF, not a libcuda) gets one line that says what to do, and
/// exit 1.
#[test]
fn census_of_a_wrong_library_says_what_to_do() {
    let Some(env) = env() else { return };
    let dir = integration_tests::guards::TempDir::new("census-lib");
    let text = dir.write("libcuda.so.1", "not an ELF file\n");
    let nvml = env.libcuda().with_file_name("libnvidia-ml.so.1");
    for (lib, want) in [
        (
            "/nonexistent/libcuda.so.1".to_owned(),
            "cudatrace: cannot read /nonexistent/libcuda.so.1: No such file or directory (os error 2): name the libcuda to count with --lib PATH".to_owned(),
        ),
        (
            text.display().to_string(),
            format!("cudatrace: {} is not an ELF shared library: Unknown file magic: name the libcuda to count with --lib PATH", text.display()),
        ),
        (
            nvml.display().to_string(),
            format!("cudatrace: {} exports none of the driver's entry points cudatrace traces (it is no libcuda): name the libcuda to count with --lib PATH", nvml.display()),
        ),
    ] {
        let traced = Cudatrace::try_start_command(&env, "census", &["--duration", "1", "--lib", &lib], &[])
            .err()
            .expect("census refuses");
        eprintln!("e2e census_of_a_wrong_library_says_what_to_do: {lib}: exit {:?}, {:?}", traced.code, traced.stderr);
        assert_eq!(traced.code, Some(1));
        assert_eq!(traced.stderr, vec![want]);
    }
}
