//! End-to-end: classic perf-event uprobes, the fallback for kernels before 6.6
//! (`CUDATRACE_ATTACH=classic`), still trace exactly.
use integration_tests::{device_file, env, Cudatrace, Scenario, Workload};

/// The classic perf-event path (kernels before 6.6) still traces exactly.
#[test]
fn classic_uprobes_still_trace_exactly() {
    let Some(env) = env() else { return };
    let lib = env.libcuda();
    let tracer = Cudatrace::start_with(
        &env,
        &["--json", "--lib", lib.to_str().unwrap()],
        &[("CUDATRACE_ATTACH", "classic")],
    );
    let dev = device_file("classic");
    let report = Workload::new(
        &env,
        Scenario::Basic {
            launches: 500,
            copies: 50,
        },
    )
    .device(&dev)
    .run();
    let traced = tracer.stop();
    let _ = std::fs::remove_file(&dev);
    let mine = traced.of_pid(report["pid"].as_u64().unwrap());
    let count = |apis: &[&str]| {
        mine.iter()
            .filter(|e| apis.iter().any(|a| e["api"] == *a))
            .count()
    };
    let launches = count(&["cuLaunchKernel"]);
    let copies = count(&["cuMemcpyHtoD_v2", "cuMemcpyDtoH_v2"]);
    eprintln!("e2e classic_uprobes_still_trace_exactly: launches in=500 out={launches}, copies in=50 out={copies}");
    assert_eq!((launches, copies), (500, 50));
    assert!(
        traced.stderr.iter().any(|l| *l
            == format!(
                "ready: {} probes attached",
                2 * tracer_common::Api::ALL.len()
            )),
        "{:?}",
        traced.stderr
    );
}
