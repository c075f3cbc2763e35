//! End-to-end: alerts on what goes wrong over a node's life. An allocation refused for want of
//! device memory fires at once, naming who holds the memory, and its error carries the
//! `CUresult` name in the metrics; a server that keeps crashing is a restart loop, with the exit
//! statuses the kernel reported; device memory that grows steadily is a leak.
use std::time::{Duration, Instant};

use integration_tests::{
    alerting::{daemon_with_hook, looping, of_victim, parties, FAST},
    device_file, env, exposition,
    guards::TempDir,
    http,
    servers::Webhook,
    Cudatrace, Scenario, Workload,
};

/// 8 GiB of simulated device memory (and 1 MiB): a trainer takes 6 GiB, then a server asks for three 1 GiB
/// blocks and gets two. The third failure fires `CudatraceGpuOutOfMemory` at the next window,
/// naming the trainer (75% of what is held) and the server (25%); the error is counted under
/// its `CUresult` name and its duration under `outcome="error"`.
#[test]
fn out_of_memory_fires_naming_the_holders_with_the_result_in_the_metrics() {
    out_of_memory(("mem", "cuMemAlloc_v2"));
}

/// The same with VMM (`cuMemCreate`, as PyTorch's expandable segments and NCCL allocate): the
/// holders are named by the memory their handles hold.
#[test]
fn out_of_memory_under_vmm_names_the_holders() {
    out_of_memory(("vmm", "cuMemCreate"));
}

/// `kind`: the workloads' `WORKLOAD_ALLOC`, and the entry point it calls.
fn out_of_memory((kind, api): (&str, &str)) {
    let Some(env) = env() else { return };
    let hook = Webhook::start();
    let dir = TempDir::new("oom");
    let (daemon, listen) = daemon_with_hook(&env, &dir, FAST, &hook, None);
    let dev = device_file("oom");
    let vars = [
        ("CUDA_STANDIN_DEVICE", dev.as_str()),
        // 8 GiB and 1 MiB: room for the workloads' own 2 x 4 KiB buffers (setup) besides.
        ("CUDA_STANDIN_MEMORY_BYTES", "8590983168"),
        ("CUDA_VISIBLE_DEVICES", "0"),
        ("WORKLOAD_ALLOC", kind),
    ];
    const GIB: u64 = 1 << 30;
    let allocs = |n, hold_s| Scenario::Allocs {
        bytes: GIB,
        n,
        hold_s,
    };
    let trainer = Workload::new(&env, allocs(6, 60.0))
        .comm("trainer")
        .vars(&vars)
        .spawn();
    let trainer_pid = trainer.pid();
    integration_tests::poll(Duration::from_secs(10), || {
        let m = exposition::parse(&http::scrape(&listen));
        let held = exposition::sum(
            &m,
            "cudatrace_device_memory_bytes",
            &[("pid", &trainer_pid.to_string())],
        );
        // 6 GiB and the two 4 KiB buffers of its setup.
        (held == (6 * GIB + 8192) as f64).then_some(())
    })
    .unwrap_or_else(|| panic!("the trainer's 6 GiB not seen: {:?}", daemon.stderr_now()));
    let server = Workload::new(&env, allocs(3, 30.0))
        .comm("model-server")
        .vars(&vars)
        .spawn();
    let server_pid = server.pid();
    let started = Instant::now();
    let name = "CudatraceGpuOutOfMemory";
    let firing = hook.wait_for(
        Duration::from_secs(15),
        of_victim(server_pid, name, "firing"),
    );
    let fired_after = started.elapsed();
    let firing = firing
        .unwrap_or_else(|| panic!("no out-of-memory alert within 15 s: {:?}", hook.received()));
    assert_eq!(
        (
            firing["cause"].as_str(),
            firing["severity"].as_str(),
            firing["gpu"].as_str()
        ),
        (Some("out_of_memory"), Some("critical"), Some("0"))
    );
    let held: Vec<(u64, &str, f64)> = parties(&firing);
    assert_eq!(
        held,
        vec![
            (trainer_pid, "trainer", 0.75),
            (server_pid, "model-server", 0.25)
        ]
    );
    assert_eq!(
        (
            firing["evidence"]["now"].as_f64(),
            firing["evidence"]["samples"].as_u64()
        ),
        (Some(GIB as f64), Some(1))
    );
    let m = exposition::parse(&http::scrape(&listen));
    let pid = server_pid.to_string();
    let of = |name: &str, more: &[(&str, &str)]| {
        let mut with = vec![("pid", pid.as_str()), ("api", api)];
        with.extend_from_slice(more);
        exposition::sum(&m, name, &with)
    };
    assert_eq!(
        of(
            "cudatrace_call_errors_total",
            &[("result", "CUDA_ERROR_OUT_OF_MEMORY")]
        ),
        1.0
    );
    assert_eq!(of("cudatrace_call_errors_total", &[]), 1.0);
    assert_eq!(
        of(
            "cudatrace_call_duration_seconds_count",
            &[("outcome", "error")]
        ),
        1.0
    );
    // Two of its three blocks, and its setup's two buffers when they share the entry point.
    let setup = if api == "cuMemAlloc_v2" { 2.0 } else { 0.0 };
    assert_eq!(
        of(
            "cudatrace_call_duration_seconds_count",
            &[("outcome", "ok")]
        ),
        2.0 + setup
    );
    assert_eq!(of("cudatrace_calls_total", &[]), 3.0 + setup);
    drop((trainer, server));
    let _ = daemon.stop();
    eprintln!(
        "e2e out_of_memory ({api}): fired {:.1} s after the failure",
        fired_after.as_secs_f64()
    );
    assert!(fired_after <= Duration::from_secs(11), "{fired_after:?}");
}

/// A model server that keeps crashing: it exits with status 3, is started again, exits with 3
/// again, is killed (SIGKILL), and is started a fourth time. The third restart fires
/// `CudatraceRestartLoop`, naming the latest process and the three exits as the kernel reported
/// them.
#[test]
fn a_restart_loop_fires_with_the_exit_statuses_the_kernel_reported() {
    let Some(env) = env() else { return };
    let hook = Webhook::start();
    let dir = TempDir::new("restarts");
    let (daemon, _listen) = daemon_with_hook(&env, &dir, FAST, &hook, None);
    let dev = device_file("restarts");
    // Each lives a second of launches (so the daemon reads who it is), then exits with `code`.
    let server = |seconds: f64| {
        looping(&env, seconds, 1, 1)
            .comm("model-server")
            .device(&dev)
    };
    let mut statuses = Vec::new();
    for _ in 0..2 {
        statuses.push(server(1.0).exit_code(3).spawn().status().code());
    }
    let killed = server(60.0).spawn();
    std::thread::sleep(Duration::from_secs(1));
    let killed = killed.kill();
    {
        use std::os::unix::process::ExitStatusExt as _;
        assert_eq!(killed.signal(), Some(9));
    }
    assert_eq!(statuses, [Some(3), Some(3)]);
    let last = server(60.0).spawn();
    let last_pid = last.pid();
    let started = Instant::now();
    let name = "CudatraceRestartLoop";
    let firing = hook.wait_for(Duration::from_secs(15), of_victim(last_pid, name, "firing"));
    let fired_after = started.elapsed();
    let firing = firing.unwrap_or_else(|| {
        panic!(
            "no restart loop within 15 s: {:?}; stderr {:?}",
            hook.received(),
            daemon.stderr_now()
        )
    });
    assert_eq!(firing["severity"], "critical");
    assert_eq!(firing["cause"], "restart_loop");
    assert_eq!(firing["victim"]["comm"], "model-server");
    assert_eq!(firing["evidence"]["samples"], 3, "{firing}");
    assert_eq!(
        firing["evidence"]["exit_statuses"],
        serde_json::json!(["exit 3", "exit 3", "killed by SIGKILL"])
    );
    drop(last);
    let _ = daemon.stop();
    eprintln!(
        "e2e a_restart_loop_fires_with_the_exit_statuses_the_kernel_reported: fired {:.1} s after the fourth start, exits {}",
        fired_after.as_secs_f64(),
        firing["evidence"]["exit_statuses"]
    );
}

/// GPU 0 has 40 of its 80 GiB free (NVML). A server allocates 64 MiB every 500 ms and frees
/// none: `CudatraceDeviceMemoryLeak` fires once six windows show the trend, with the rate and the
/// time to full; a trainer that takes 8 GiB in one go beside it is not a leak.
#[test]
fn steady_device_memory_growth_fires_a_leak_warning() {
    leak("mem");
}

/// The same growth through VMM handles never released.
#[test]
fn a_vmm_leak_fires_a_leak_warning() {
    leak("vmm");
}

/// `kind`: the leaking server's `WORKLOAD_ALLOC` (the trainer's 8 GiB are cuMemAlloc_v2's).
fn leak(kind: &str) {
    let Some(env) = env() else { return };
    let hook = Webhook::start();
    let dir = TempDir::new("leak");
    let scenario = dir.write(
        "nvml.txt",
        "gpu 0 uuid=GPU-00000000-1111-2222-3333-444444444444 sm=50 mem=30 total=85899345920 used=42949672960 temp=60 power_mw=200000 sm_clock=1980 reasons=0x0 pcie_tx_kbs=0 pcie_rx_kbs=0\n",
    );
    let config = dir.write("cudatrace.toml", FAST);
    let hook_url = format!("http://127.0.0.1:{}/hook", hook.port);
    let nvml = env.libnvml();
    let (daemon, _listen) = Cudatrace::start_daemon_on_loopback(
        &env,
        &[
            "--nvml-lib",
            nvml.to_str().unwrap(),
            "--webhook",
            &hook_url,
            "--config",
            config.to_str().unwrap(),
        ],
        &[("NVML_STANDIN_SCENARIO", scenario.to_str().unwrap())],
    );
    let dev = device_file("leak");
    let vars = [
        ("CUDA_STANDIN_DEVICE", dev.as_str()),
        ("CUDA_VISIBLE_DEVICES", "0"),
    ];
    const MIB: u64 = 1 << 20;
    let leaking = Workload::new(
        &env,
        Scenario::Grow {
            bytes: 64 * MIB,
            every_ms: 500,
            seconds: 90.0,
        },
    )
    .comm("model-server")
    .vars(&vars)
    .var("WORKLOAD_ALLOC", kind)
    .spawn();
    let trainer = Workload::new(
        &env,
        Scenario::Allocs {
            bytes: 8 << 30,
            n: 1,
            hold_s: 90.0,
        },
    )
    .comm("trainer")
    .vars(&vars)
    .spawn();
    let (pid, started) = (leaking.pid(), Instant::now());
    let name = "CudatraceDeviceMemoryLeak";
    let firing = hook.wait_for(Duration::from_secs(60), of_victim(pid, name, "firing"));
    let fired_after = started.elapsed();
    let firing =
        firing.unwrap_or_else(|| panic!("no leak alert within 60 s: {:?}", hook.received()));
    assert_eq!(
        (
            firing["severity"].as_str(),
            firing["cause"].as_str(),
            firing["gpu"].as_str()
        ),
        (Some("warning"), Some("memory_leak"), Some("0"))
    );
    // 128 MiB/s, give or take the scheduling of the allocations (usleep and the calls' time).
    let rate = firing["evidence"]["now"].as_f64().unwrap();
    assert!(
        rate > 100.0 * MIB as f64 && rate <= 130.0 * MIB as f64,
        "{firing}"
    );
    let to_full = firing["evidence"]["time_to_full_s"].as_f64().unwrap();
    assert!(
        (to_full - (40u64 << 30) as f64 / rate).abs() <= 1.0,
        "{firing}"
    );
    assert!(fired_after >= Duration::from_secs(25), "{fired_after:?}");
    let received = hook.received();
    assert!(
        received
            .iter()
            .all(|r| r["victim"]["pid"].as_u64() == Some(pid)),
        "only the leaking server: {received:?}"
    );
    drop((leaking, trainer));
    let _ = daemon.stop();
    eprintln!(
        "e2e steady_device_memory_growth_fires_a_leak_warning: fired {:.1} s after the first allocation, {:.1} MiB/s, full in {to_full} s",
        fired_after.as_secs_f64(),
        rate / MIB as f64
    );
}
