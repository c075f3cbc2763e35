//! End-to-end: one process driving two devices (JAX, tensor parallelism in one process) has its
//! work split by device, each device named by the UUID the process read, never by ordinal: here
//! CUDA's ordinal 0 is NVML's GPU 1 and ordinal 1 is NVML's GPU 0. Memory held is split too, a
//! VMM allocation by the device its location names. Every context call of the
//! table is counted with its arguments in `coverage.rs`.
use std::time::Duration;

use integration_tests::{
    device_file, env, exposition, guards::TempDir, http, poll, Cudatrace, Scenario, Workload,
};

const L0: u64 = 300;
const L1: u64 = 500;
const COPIES: u64 = 40;
const MIB: u64 = 1 << 20;
/// NVML's GPU 0 and 1.
const NVML_0: &str = "GPU-00000000-1111-2222-3333-444444444444";
const NVML_1: &str = "GPU-55555555-6666-7777-8888-999999999999";

/// The stand-in NVML's line of GPU `i`.
fn gpu(i: u32, uuid: &str) -> String {
    format!("gpu {i} uuid={uuid} sm=10 mem=1 total=85899345920 used=1073741824 temp=40 power_mw=90000 sm_clock=1980 reasons=0x0 pcie_tx_kbs=0 pcie_rx_kbs=0\n")
}

/// The daemon on loopback with the stand-in NVML replaying `scenario`.
fn with_nvml(env: &integration_tests::Env, dir: &TempDir, scenario: &str) -> (Cudatrace, String) {
    let scenario = dir.write("nvml.txt", scenario);
    let config = dir.write(
        "cudatrace.toml",
        &format!("nvml_library = {:?}\n", env.libnvml().display().to_string()),
    );
    Cudatrace::start_daemon_on_loopback(
        env,
        &["--config", config.to_str().unwrap()],
        &[("NVML_STANDIN_SCENARIO", scenario.to_str().unwrap())],
    )
}

#[test]
fn a_two_device_process_is_split_by_device_matched_by_uuid() {
    let Some(env) = env() else { return };
    let dir = TempDir::new("devices");
    let dev = device_file("devices");
    let (daemon, listen) = with_nvml(&env, &dir, &(gpu(0, NVML_0) + &gpu(1, NVML_1)));
    let job = Workload::new(
        &env,
        Scenario::Named("two-devices", vec![L0, L1, COPIES, 5]),
    )
    .device(&dev)
    .vars(&[
        ("CUDA_STANDIN_DEVICES", "2"),
        ("CUDA_STANDIN_UUIDS", &format!("{NVML_1},{NVML_0}")),
    ])
    .spawn();
    let pid = job.pid().to_string();
    // (cuda_device, gpu, launches, bytes, memory held), once every launch is counted.
    let split = poll(Duration::from_secs(15), || {
        let m = exposition::parse(&http::scrape(&listen));
        let mut seen = Vec::new();
        for s in exposition::select(&m, "cudatrace_device_launches_total", &[("pid", &pid)]) {
            let at = [
                ("pid", pid.as_str()),
                ("cuda_device", s.label("cuda_device")),
                ("gpu", s.label("gpu")),
            ];
            let bytes = exposition::sum(&m, "cudatrace_device_bytes_total", &at);
            let held = exposition::sum(&m, "cudatrace_device_memory_by_device_bytes", &at);
            seen.push((
                s.label("cuda_device").to_owned(),
                s.label("gpu").to_owned(),
                s.value as u64,
                bytes as u64,
                held as u64,
            ));
        }
        seen.sort();
        let launches: u64 = seen.iter().map(|s| s.2).sum();
        (launches == L0 + 2 * L1).then_some(seen)
    });
    let report = job.finish();
    let traced = daemon.stop();
    let _ = std::fs::remove_file(&dev);
    eprintln!(
        "e2e a_two_device_process_is_split_by_device_matched_by_uuid: launches in {} + {} on two devices, (cuda_device, gpu, launches, bytes, memory) out {split:?}",
        L0,
        2 * L1
    );
    assert_eq!(report["pid"].to_string(), pid);
    assert_ne!(
        report["function"], report["function1"],
        "one handle per device"
    );
    assert_eq!(
        split,
        Some(vec![
            ("0".into(), "1".into(), L0, COPIES * 1024, 2 * MIB),
            (
                "1".into(),
                "0".into(),
                2 * L1,
                COPIES * (4096 + 2048),
                3 * MIB
            ),
        ]),
        "{:?}",
        traced.stderr
    );
}

#[test]
fn trace_json_names_each_calls_device_and_its_uuid() {
    let Some(env) = env() else { return };
    let dev = device_file("devices-json");
    let lib = env.libcuda();
    let tracer = Cudatrace::start(&env, &["--json", "--lib", lib.to_str().unwrap()]);
    let report = Workload::new(
        &env,
        Scenario::Named("two-devices", vec![L0, L1, COPIES, 0]),
    )
    .device(&dev)
    .vars(&[
        ("CUDA_STANDIN_DEVICES", "2"),
        ("CUDA_STANDIN_UUIDS", &format!("{NVML_1},{NVML_0}")),
    ])
    .run();
    let traced = tracer.stop();
    let _ = std::fs::remove_file(&dev);
    let pid = report["pid"].as_u64();
    // (api, cuda_device, gpu_uuid) -> calls, for the launches and the copies.
    let mut by = std::collections::BTreeMap::<(String, i64, String), u64>::new();
    for e in traced.events.iter().filter(|e| e["pid"].as_u64() == pid) {
        let api = e["api"].as_str().unwrap_or_default();
        if api.starts_with("cuLaunchKernel") || api.starts_with("cuMemcpyHtoDAsync") {
            let key = (
                api.to_owned(),
                e["cuda_device"].as_i64().unwrap_or(-1),
                e["gpu_uuid"].as_str().unwrap_or("none").to_owned(),
            );
            *by.entry(key).or_default() += 1;
        }
    }
    eprintln!("e2e trace_json_names_each_calls_device_and_its_uuid: {by:?}");
    let launches: Vec<(i64, &str, u64)> = by
        .iter()
        .filter(|((api, ..), _)| api.starts_with("cuLaunchKernel"))
        .map(|((_, d, u), n)| (*d, u.as_str(), *n))
        .collect();
    assert_eq!(launches, vec![(0, NVML_1, L0), (1, NVML_0, 2 * L1)]);
}

/// A container given a MIG device in the newer form (`NVIDIA_VISIBLE_DEVICES=MIG-<uuid>`), which
/// NVML's process list does not show: placed on the GPU instance NVML lists that MIG device in,
/// so two such containers on two instances of one GPU are not neighbours. One given a PCI bus id
/// is the GPU NVML gives that bus id.
#[test]
fn a_mig_device_named_by_its_own_uuid_is_its_gpu_instance_and_a_bus_id_its_gpu() {
    let Some(env) = env() else { return };
    let dir = TempDir::new("devices-mig");
    let dev = device_file("devices-mig");
    let (mig_a, mig_b) = (
        "MIG-0a1b2c3d-0000-5555-aaaa-000000000001",
        "MIG-0a1b2c3d-0000-5555-aaaa-000000000002",
    );
    let scenario = gpu(0, NVML_0)
        + &format!("mig 0 uuid={mig_a} gi=1\nmig 0 uuid={mig_b} gi=2\n")
        + &gpu(1, NVML_1).replace('\n', " pci=00000000:3B:00.0\n");
    let (daemon, listen) = with_nvml(&env, &dir, &scenario);
    let job = |mig: &str| {
        // Calls for 4 s: its identity is read while it runs.
        integration_tests::alerting::looping(&env, 4.0, 100, 1)
            .device(&dev)
            .vars(&[("NVIDIA_VISIBLE_DEVICES", mig)])
            .spawn()
    };
    let (a, b, c) = (job(mig_a), job(mig_b), job("0000:3b:00.0"));
    let (pa, pb, pc) = (
        a.pid().to_string(),
        b.pid().to_string(),
        c.pid().to_string(),
    );
    // Until all are placed as wanted.
    let want = (
        vec!["0/gi1".to_owned()],
        vec!["0/gi2".to_owned()],
        vec!["1".to_owned()],
    );
    let mut placed = None;
    poll(Duration::from_secs(15), || {
        let m = exposition::parse(&http::scrape(&listen));
        let gpus = |pid: &str| -> Vec<String> {
            exposition::select(&m, "cudatrace_process_gpu", &[("pid", pid)])
                .iter()
                .map(|s| s.label("gpu").to_owned())
                .collect()
        };
        placed = Some((gpus(&pa), gpus(&pb), gpus(&pc)));
        (placed.as_ref() == Some(&want)).then_some(())
    });
    let _ = (a.finish(), b.finish(), c.finish());
    let traced = daemon.stop();
    let _ = std::fs::remove_file(&dev);
    eprintln!("e2e a_mig_device_named_by_its_own_uuid_is_its_gpu_instance_and_a_bus_id_its_gpu: {placed:?}");
    assert_eq!(placed, Some(want), "{:?}", traced.stderr);
}
