//! End-to-end: the alerts that must hold in the worst case. A victim starved by a neighbour
//! holding the simulated GPU (none of its waits return) is alerted on, naming the holder; a
//! slowdown that grows while firing escalates to one page in a real Alertmanager; an allocation
//! refused for want of device memory fires at once, naming who holds it, and its error carries
//! the `CUresult` name in the metrics.
use std::time::{Duration, Instant};

use integration_tests::{
    device_file, env, exposition,
    guards::TempDir,
    http,
    servers::{Alertmanager, Webhook},
    Cudatrace, Env, Scenario, Workload,
};
use serde_json::Value;

/// Tiers and times shortened so that each test fits in about a minute and a half.
const FAST: &str = "[detect]\nfiring_after_s = 15\nresolve_after_s = 20\n";

/// The workload looping launches of `grid` blocks (1 µs each below), a wait every `sync_every`.
fn looping(env: &Env, seconds: f64, grid: u32, sync_every: u64) -> Workload {
    Workload::new(
        env,
        Scenario::Loop {
            seconds,
            grid,
            sync_every,
        },
    )
}

/// Starts the daemon with `config` (TOML), a webhook and, when given, an Alertmanager.
fn daemon(
    env: &Env,
    dir: &TempDir,
    config: &str,
    hook: &Webhook,
    am: Option<&str>,
) -> (Cudatrace, String) {
    let config = dir.write("cudatrace.toml", config);
    let hook_url = format!("http://127.0.0.1:{}/hook", hook.port);
    let mut args = vec!["--webhook", &hook_url, "--config", config.to_str().unwrap()];
    if let Some(url) = am {
        args.extend(["--alertmanager", url]);
    }
    Cudatrace::start_daemon_on_loopback(env, &args, &[])
}

/// Waits up to 60 s for the victim's `wait_per_launch` baseline.
fn learn(daemon: &Cudatrace, pid: u64) {
    let learned = daemon.wait_event(Duration::from_secs(60), "baseline", |r: &Value| {
        r["pid"].as_u64() == Some(pid) && r["signal"] == "wait_per_launch"
    });
    assert!(
        learned.is_some(),
        "no baseline within 60 s: {:?}",
        daemon.stderr_now()
    );
}

/// An alert record's aggressors: (pid, comm, share).
fn parties(record: &Value) -> Vec<(u64, &str, f64)> {
    record["aggressors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["pid"].as_u64().unwrap(),
                a["comm"].as_str().unwrap(),
                a["share"].as_f64().unwrap(),
            )
        })
        .collect()
}

fn of_victim(pid: u64, alert: &'static str, state: &'static str) -> impl Fn(&Value) -> bool {
    move |v: &Value| {
        v["victim"]["pid"].as_u64() == Some(pid) && v["alert"] == alert && v["state"] == state
    }
}

/// A model server learns its 1 ms waits; then a neighbour on the same GPU launches one kernel of
/// 40 s: not one of the server's waits returns meanwhile. It is alerted on as starved, naming
/// the neighbour, while stuck; it resolves once its waits are back for `resolve_after_s`.
#[test]
fn a_starved_victim_fires_naming_the_holder_and_resolves_after() {
    let Some(env) = env() else { return };
    let hook = Webhook::start();
    let dir = TempDir::new("starved");
    let (daemon, _listen) = daemon(&env, &dir, FAST, &hook, None);
    let dev = device_file("starved");
    let vars = [
        ("CUDA_STANDIN_DEVICE", dev.as_str()),
        ("CUDA_STANDIN_NS_PER_BLOCK", "1000"),
        ("CUDA_VISIBLE_DEVICES", "0"),
    ];
    let victim = looping(&env, 200.0, 1000, 1)
        .comm("model-server")
        .vars(&vars)
        .spawn();
    let victim_pid = victim.pid();
    learn(&daemon, victim_pid);
    // One launch of 40,000,000 blocks: 40 s of the simulated GPU, then its wait returns.
    let held_at = Instant::now();
    let holder = looping(&env, 0.001, 40_000_000, 1)
        .comm("batch-job")
        .vars(&vars)
        .spawn();
    let holder_pid = holder.pid();
    let name = "CudatraceGpuStarved";
    let firing = hook.wait_for(
        Duration::from_secs(40),
        of_victim(victim_pid, name, "firing"),
    );
    let fired_after = held_at.elapsed();
    let firing =
        firing.unwrap_or_else(|| panic!("no starvation alert within 40 s: {:?}", hook.received()));
    assert!(
        fired_after < Duration::from_secs(40),
        "fired after the hold: {fired_after:?}"
    );
    assert_eq!(firing["cause"], "starvation");
    assert_eq!(firing["severity"], "page");
    assert_eq!(firing["gpu"], "0");
    assert_eq!(firing["victim"]["comm"], "model-server");
    let holders: Vec<(u64, &str, f64)> = parties(&firing);
    assert_eq!(holders, vec![(holder_pid, "batch-job", 1.0)]);
    let stuck = firing["evidence"]["stuck_s"].as_f64().unwrap();
    assert!(
        stuck >= 5.0 && stuck < fired_after.as_secs_f64() + 1.0,
        "stuck_s {stuck}"
    );
    assert_eq!(firing["evidence"]["samples"], 0, "{firing}");
    // No alert of its own for the holder: its own long kernel is no starvation.
    let holder_report = holder.finish();
    let held = held_at.elapsed();
    assert_eq!(holder_report["launches"], 1);
    let resolved = hook.wait_for(
        Duration::from_secs(60),
        of_victim(victim_pid, name, "resolved"),
    );
    let resolved_after = held_at.elapsed() - held;
    let resolved =
        resolved.unwrap_or_else(|| panic!("not resolved within 60 s: {:?}", hook.received()));
    assert_eq!(resolved["reason"], "back_to_baseline");
    drop(victim);
    let traced = daemon.stop();
    let received = hook.received();
    assert!(
        received
            .iter()
            .all(|r| r["victim"]["pid"].as_u64() == Some(victim_pid)),
        "{received:?}"
    );
    let states: Vec<&str> = received
        .iter()
        .filter(|r| r["alert"] == name)
        .map(|r| r["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["pending", "firing", "resolved"]);
    eprintln!(
        "e2e a_starved_victim_fires_naming_the_holder_and_resolves_after: fired {:.1} s into a {:.1} s hold \
         (stuck_s {stuck}), resolved {:.1} s after it; {} records on stdout",
        fired_after.as_secs_f64(),
        held.as_secs_f64(),
        resolved_after.as_secs_f64(),
        traced.events.len()
    );
    assert!(
        resolved_after <= Duration::from_secs(20 + 3 * 5 + 5),
        "{resolved_after:?}"
    );
}

/// A light neighbour slows the server by tens of percent (warning); a heavy one joins while the
/// alert fires: the same alert escalates to page, and Alertmanager lists exactly one active
/// alert for the server, at page.
#[test]
fn a_growing_slowdown_escalates_to_one_page() {
    let Some(env) = env() else { return };
    let am = Alertmanager::start();
    let hook = Webhook::start();
    let dir = TempDir::new("escalate");
    // Warning over +10%, critical over +200%, page over +300%.
    let config = format!("{FAST}warning = 0.1\ncritical = 2.0\npage = 3.0\n");
    let (daemon, _listen) = daemon(&env, &dir, &config, &hook, Some(&am.url()));
    let dev = device_file("escalate");
    let vars = [
        ("CUDA_STANDIN_DEVICE", dev.as_str()),
        ("CUDA_STANDIN_NS_PER_BLOCK", "1000"),
        ("CUDA_VISIBLE_DEVICES", "0"),
    ];
    let victim = looping(&env, 300.0, 1000, 1)
        .comm("model-server")
        .vars(&vars)
        .spawn();
    let victim_pid = victim.pid();
    learn(&daemon, victim_pid);
    // 0.3 ms kernels, a wait after each: the server waits up to 0.3 ms more per launch.
    let light = looping(&env, 200.0, 300, 1)
        .comm("light-job")
        .vars(&vars)
        .spawn();
    let is_wait = move |state: &'static str| {
        move |v: &Value| {
            v["victim"]["pid"].as_u64() == Some(victim_pid)
                && v["evidence"]["signal"] == "wait_per_launch"
                && v["state"] == state
        }
    };
    let first = hook.wait_for(Duration::from_secs(60), is_wait("firing"));
    let first =
        first.unwrap_or_else(|| panic!("no firing alert within 60 s: {:?}", hook.received()));
    assert_eq!(first["severity"], "warning", "{first}");
    // 20 ms kernels, two queued before each wait.
    let heavy_at = Instant::now();
    let heavy = looping(&env, 200.0, 20_000, 2)
        .comm("trainer")
        .vars(&vars)
        .spawn();
    let paged = hook.wait_for(Duration::from_secs(50), move |v: &Value| {
        is_wait("firing")(v) && v["severity"] == "page"
    });
    let escalated_after = heavy_at.elapsed();
    let paged = paged.unwrap_or_else(|| panic!("no escalation within 50 s: {:?}", hook.received()));
    assert_eq!(paged["escalated_from"], "warning");
    assert_eq!(paged["alert"], first["alert"]);
    assert_eq!(paged["started_at"], first["started_at"]);
    let ours = |alerts: &[Value]| -> Vec<Value> {
        alerts
            .iter()
            .filter(|a| {
                a["labels"]["pid"] == victim_pid.to_string().as_str()
                    && a["labels"]["signal"] == "wait_per_launch"
            })
            .cloned()
            .collect()
    };
    let listed = am.wait_until(|a| {
        let o = ours(a);
        o.len() == 1 && o[0]["labels"]["severity"] == "page"
    });
    let listed = ours(&listed);
    assert_eq!(listed.len(), 1, "Alertmanager lists {listed:?}");
    assert_eq!(listed[0]["labels"]["severity"], "page");
    assert_eq!(listed[0]["status"]["state"], "active");
    // Never two firing records at once, and severity never falls while it fires.
    let firing: Vec<String> = hook
        .received()
        .iter()
        .filter(|v| is_wait("firing")(v))
        .map(|v| v["severity"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(firing, ["warning", "page"]);
    drop((victim, light, heavy));
    let _ = daemon.stop();
    eprintln!(
        "e2e a_growing_slowdown_escalates_to_one_page: warning at ratio {}, page {:.1} s after the heavy job started (ratio {})",
        first["evidence"]["ratio"],
        escalated_after.as_secs_f64(),
        paged["evidence"]["ratio"]
    );
}

/// 8 GiB of simulated device memory (and 1 MiB): a trainer takes 6 GiB, then a server asks for three 1 GiB
/// blocks and gets two. The third failure fires `CudatraceGpuOutOfMemory` at the next window,
/// naming the trainer (75% of what is held) and the server (25%); the error is counted under
/// its `CUresult` name and its duration under `outcome="error"`.
#[test]
fn out_of_memory_fires_naming_the_holders_with_the_result_in_the_metrics() {
    let Some(env) = env() else { return };
    let hook = Webhook::start();
    let dir = TempDir::new("oom");
    let (daemon, listen) = daemon(&env, &dir, FAST, &hook, None);
    let dev = device_file("oom");
    let vars = [
        ("CUDA_STANDIN_DEVICE", dev.as_str()),
        // 8 GiB and 1 MiB: room for the workloads' own 2 x 4 KiB buffers (setup) besides.
        ("CUDA_STANDIN_MEMORY_BYTES", "8590983168"),
        ("CUDA_VISIBLE_DEVICES", "0"),
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
        let mut with = vec![("pid", pid.as_str()), ("api", "cuMemAlloc_v2")];
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
    // Its setup's two buffers and two of its three blocks.
    assert_eq!(
        of(
            "cudatrace_call_duration_seconds_count",
            &[("outcome", "ok")]
        ),
        4.0
    );
    assert_eq!(of("cudatrace_calls_total", &[]), 5.0);
    drop((trainer, server));
    let _ = daemon.stop();
    eprintln!("e2e out_of_memory_fires_naming_the_holders_with_the_result_in_the_metrics: fired {:.1} s after the failure", fired_after.as_secs_f64());
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
    let (daemon, _listen) = daemon(&env, &dir, FAST, &hook, None);
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
