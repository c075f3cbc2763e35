//! End-to-end: discovery of libraries mapped later, containers, filters, and process exits.
use std::process::{Command, Stdio};

use integration_tests::{
    device_file, env,
    guards::{Cgroup, TempDir},
    report, Cudatrace, Scenario, Traced, Workload,
};
use serde_json::Value;

fn count(traced: &Traced, pid: u64, api: &str) -> usize {
    traced
        .of_pid(pid)
        .iter()
        .filter(|e| e["api"] == api)
        .count()
}

/// Two copies of the library at unconfigured paths, first mapped after the tracer started:
/// each is discovered within 1 s of being mapped and traced in full.
#[test]
fn libraries_mapped_later_are_traced() {
    let Some(env) = env() else { return };
    // Copies of the stand-in library at paths no one configured (their own inodes).
    let dir = TempDir::new("late");
    let (a, b) = (
        dir.copy(&env.libcuda(), "a/libcuda.so.1"),
        dir.copy(&env.libcuda(), "b/libcuda.so.1"),
    );
    let tracer = Cudatrace::start(&env, &["--json", "--rescan-ms", "100"]);
    let dev = device_file("late");
    let vars = [
        ("CUDA_STANDIN_DEVICE", dev.as_str()),
        ("CUDA_STANDIN_NS_PER_BLOCK", "1"),
    ];
    let late = |lib: &std::path::Path| {
        Workload::new(
            &env,
            Scenario::Basic {
                launches: 1000,
                copies: 100,
            },
        )
        .lib(lib)
        .vars(&vars)
        .settle_ms(1000)
        .spawn()
    };
    let (wa, wb) = (late(&a), late(&b));
    let (ra, rb) = (wa.finish(), wb.finish());
    let traced = tracer.stop();
    for (report, lib) in [(&ra, &a), (&rb, &b)] {
        let pid = report["pid"].as_u64().unwrap();
        let needle = format!("/proc/{pid}/root{}", lib.display());
        let found = traced.log_events("discovered");
        let record = found
            .iter()
            .find(|r| {
                let path = r["path"].as_str().unwrap_or_default();
                path == needle || path == lib.display().to_string()
            })
            .unwrap_or_else(|| panic!("{} not discovered: {:?}", lib.display(), traced.stderr));
        let at: u64 = record["at_ns"].as_u64().expect("at_ns, ns");
        let delay_ms = (at as f64 - report["loaded_ns"].as_u64().unwrap() as f64) / 1e6;
        assert_eq!(
            count(&traced, pid, "cuLaunchKernel"),
            1000,
            "{}",
            lib.display()
        );
        assert_eq!(
            count(&traced, pid, "cuMemcpyHtoD_v2") + count(&traced, pid, "cuMemcpyDtoH_v2"),
            100
        );
        eprintln!("e2e libraries_mapped_later_are_traced: {} discovered {delay_ms:.0} ms after dlopen; launches in=1000 out=1000", lib.display());
        assert!(
            delay_ms < 1000.0,
            "discovered {delay_ms} ms after being mapped"
        );
    }
    let all = tracer_common::Api::ALL.len();
    let probes_line = traced
        .stderr
        .iter()
        .filter(|l| l.contains(&format!("attached {all} of {all}")))
        .count();
    assert_eq!(
        probes_line, 2,
        "each copy attached once: {:?}",
        traced.stderr
    );
}

/// A process in its own mount namespace, the library bind-mounted at a container-like path, in
/// a cgroup named as containerd names a Kubernetes container: traced, labelled with its
/// container id and pod UID, and selected by `--cgroup`.
#[test]
fn container_process_traced_and_labelled() {
    let Some(env) = env() else { return };
    let container = "3f1c0a6e9b2d4c8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e";
    let pod = "0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0";
    let cgroup = Cgroup::new(&format!(
        "kubepods/pod{pod}/cri-containerd-{container}.scope"
    ));
    let cg = cgroup.path();
    let dev = device_file("ctr");
    // Its own copy (own inode), reachable only through the namespace's mount.
    let image = TempDir::new("ctr-image");
    let image_lib = image.copy(&env.libcuda(), "libcuda.so.1");
    let tracer = Cudatrace::start(
        &env,
        &[
            "--json",
            "--rescan-ms",
            "100",
            "--cgroup",
            cg.to_str().unwrap(),
        ],
    );
    let script = format!(
        "echo $$ > {procs} && exec unshare --mount --propagation private sh -c '\
         mount -t tmpfs none /mnt && mkdir -p /mnt/usr/lib/x86_64-linux-gnu && \
         touch /mnt/usr/lib/x86_64-linux-gnu/libcuda.so.1 && \
         mount --bind {lib} /mnt/usr/lib/x86_64-linux-gnu/libcuda.so.1 && \
         exec {workload} --lib /mnt/usr/lib/x86_64-linux-gnu/libcuda.so.1 --settle 1000 basic 500 0'",
        procs = cg.join("cgroup.procs").display(),
        lib = image_lib.display(),
        workload = env.workload().display(),
    );
    let inside = Command::new("sh")
        .args(["-c", &script])
        .env("CUDA_STANDIN_DEVICE", &dev)
        .env("CUDA_VISIBLE_DEVICES", "GPU-test-0")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // A process outside the cgroup, same library: filtered out in the kernel.
    let outside = Workload::new(
        &env,
        Scenario::Basic {
            launches: 300,
            copies: 0,
        },
    )
    .device(&dev)
    .settle_ms(1000)
    .spawn();
    let report = report(inside);
    let other = outside.finish();
    let traced = tracer.stop();
    drop(cgroup);
    let pid = report["pid"].as_u64().unwrap();
    let inside_path = format!("/proc/{pid}/root/mnt/usr/lib/x86_64-linux-gnu/libcuda.so.1");
    assert!(
        traced
            .log_events("discovered")
            .iter()
            .any(|r| r["path"] == inside_path.as_str()),
        "{inside_path} not discovered: {:?}",
        traced.stderr
    );
    let launches: Vec<&Value> = traced
        .of_pid(pid)
        .into_iter()
        .filter(|e| e["api"] == "cuLaunchKernel")
        .collect();
    assert_eq!(launches.len(), 500);
    let process = &launches[0]["process"];
    assert_eq!(process["container_id"], container, "{process}");
    assert_eq!(process["pod_uid"], pod, "{process}");
    assert_eq!(process["cuda_visible_devices"], "GPU-test-0", "{process}");
    assert!(process["cgroup"]
        .as_str()
        .unwrap()
        .ends_with(&format!("cri-containerd-{container}.scope")));
    assert!(
        process["exe"].as_str().unwrap().ends_with("cuda-workload"),
        "{process}"
    );
    assert!(process["start_time"].as_u64().unwrap() > 0);
    assert!(
        traced.of_pid(other["pid"].as_u64().unwrap()).is_empty(),
        "--cgroup let another process through"
    );
    eprintln!("e2e container_process_traced_and_labelled: launches in=500 out=500, outside the cgroup in=300 out=0, container={}", &container[..12]);
}

/// `--comm` keeps only threads of that name, in the kernel.
#[test]
fn comm_filter_exact() {
    let Some(env) = env() else { return };
    let dev = device_file("comm");
    let lib = env.libcuda();
    // Same binary under another name.
    let tracer = Cudatrace::start(
        &env,
        &[
            "--json",
            "--comm",
            "cuda-workload",
            "--lib",
            lib.to_str().unwrap(),
        ],
    );
    let vars = [
        ("CUDA_STANDIN_DEVICE", dev.as_str()),
        ("CUDA_STANDIN_NS_PER_BLOCK", "1"),
    ];
    let basic = || {
        Workload::new(
            &env,
            Scenario::Basic {
                launches: 400,
                copies: 0,
            },
        )
        .vars(&vars)
    };
    let mine = basic().run();
    let other = basic().comm("other-job").run();
    let traced = tracer.stop();
    assert_eq!(
        count(&traced, mine["pid"].as_u64().unwrap(), "cuLaunchKernel"),
        400
    );
    assert!(traced.of_pid(other["pid"].as_u64().unwrap()).is_empty());
    assert!(traced.events.iter().all(|e| e["comm"] == "cuda-workload"));
}

/// 200 short-lived processes, 20 of them killed by their own exit while a thread is inside a
/// call: every process's state is released, in the kernel and in the tracer.
#[test]
fn short_lived_processes_leave_no_state() {
    let Some(env) = env() else { return };
    let dev = device_file("short");
    let lib = env.libcuda();
    let tracer = Cudatrace::start(&env, &["--json", "--lib", lib.to_str().unwrap()]);
    let mut pids = Vec::new();
    for batch in 0..50 {
        let children: Vec<_> = (0..4)
            .map(|k| {
                if k < 2 && batch % 5 == 0 {
                    // 10 s of queued work on this process's stream: the waiter is mid-call at exit.
                    Workload::new(&env, Scenario::DieInCall)
                        .device(&dev)
                        .var("CUDA_STANDIN_NS_PER_BLOCK", "10000000000")
                        .spawn()
                } else {
                    Workload::new(
                        &env,
                        Scenario::Basic {
                            launches: 20,
                            copies: 4,
                        },
                    )
                    .device(&format!("{dev}-{k}"))
                    .var("CUDA_STANDIN_NS_PER_BLOCK", "1")
                    .spawn()
                }
            })
            .collect();
        for c in children {
            pids.push(c.finish()["pid"].as_u64().unwrap());
        }
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    let traced = tracer.stop();
    for k in 0..4 {
        let _ = std::fs::remove_file(format!("{dev}-{k}"));
    }
    let _ = std::fs::remove_file(&dev);
    assert_eq!(pids.len(), 200);
    let traced_pids: std::collections::BTreeSet<u64> = traced
        .events
        .iter()
        .filter_map(|e| e["pid"].as_u64())
        .collect();
    assert!(
        pids.iter().all(|p| traced_pids.contains(p)),
        "every process was traced"
    );
    let s = traced.summary();
    eprintln!(
        "e2e short_lived_processes_leave_no_state: processes=200 exits={} live_processes={} inflight_entries={} tracked_processes={} dropped={}",
        s["exits"], s["live_processes"], s["inflight_entries"], s["tracked_processes"], s["dropped"]
    );
    assert_eq!(s["live_processes"], 0);
    assert_eq!(
        s["inflight_entries"], 0,
        "entry state of threads that died in a call"
    );
    assert_eq!(s["tracked_processes"], 0);
    assert_eq!(s["dropped"], 0);
}

/// A SIGKILLed tracer leaves the traced program running untouched.
#[test]
fn killed_tracer_leaves_programs_running() {
    let Some(env) = env() else { return };
    let dev = device_file("kill");
    let lib = env.libcuda();
    let tracer = Cudatrace::start(&env, &["--json", "--lib", lib.to_str().unwrap()]);
    let job = Workload::new(
        &env,
        Scenario::Loop {
            seconds: 2.0,
            grid: 10,
            sync_every: 1,
        },
    )
    .device(&dev)
    .var("CUDA_STANDIN_NS_PER_BLOCK", "100")
    .spawn();
    std::thread::sleep(std::time::Duration::from_millis(500));
    let traced = tracer.kill();
    assert_eq!(traced.code, None, "killed by a signal");
    let report = job.finish();
    let _ = std::fs::remove_file(&dev);
    assert!(report["launches"].as_u64().unwrap() > 1000, "{report}");
    assert_eq!(
        report["launches"],
        report["syncs"].as_u64().map(|s| s - 1).unwrap_or(0),
        "every launch was synchronized"
    );
}
