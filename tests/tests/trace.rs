//! End-to-end: `cudatrace trace` against the stand-in libcuda, as root.
use std::{collections::HashSet, process::Command};

use integration_tests::{
    device_file, env, report as workload_report, Cudatrace, Scenario, Workload,
};

/// 10,000 launches and 2,000 copies from 2 threads: exactly as many events, with exact
/// arguments, durations at least the simulated call time, nothing dropped.
#[test]
fn launches_and_copies_exact() {
    let Some(env) = env() else { return };
    let lib = env.libcuda();
    let tracer = Cudatrace::start(&env, &["--json", "--lib", lib.to_str().unwrap()]);
    let dev = device_file("basic");
    let report = Workload::new(
        &env,
        Scenario::Basic {
            launches: 10_000,
            copies: 2000,
        },
    )
    .threads(2)
    .device(&dev)
    .vars(&[
        ("CUDA_STANDIN_CALL_NS", "2000"),
        ("CUDA_STANDIN_NS_PER_BLOCK", "1"),
    ])
    .run();
    let traced = tracer.stop();
    assert_eq!(traced.code, Some(0), "stderr: {:?}", traced.stderr);
    let pid = report["pid"].as_u64().unwrap();
    let function = report["function"].as_u64().unwrap();
    let streams: Vec<u64> = report["streams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    let events = traced.of_pid(pid);

    let mut launches = HashSet::new();
    let mut copies = HashSet::new();
    for e in &events {
        assert_eq!(e["result"], 0);
        assert_eq!(e["comm"], "cuda-workload");
        match e["api"].as_str().unwrap() {
            "cuLaunchKernel" => {
                assert_eq!(e["kind"], "launch");
                assert!(e["duration_ns"].as_u64().unwrap() >= 2000, "{e}");
                let t = streams
                    .iter()
                    .position(|s| Some(*s) == e["stream"].as_u64())
                    .expect("known stream") as u64;
                let i = e["shared_mem_bytes"].as_u64().unwrap();
                assert_eq!(e["function"].as_u64(), Some(function));
                assert_eq!(
                    e["grid"],
                    serde_json::json!([1 + i % 1000, 2 + t, 3]),
                    "{e}"
                );
                assert_eq!(e["block"], serde_json::json!([32, 1 + i % 8, 2]), "{e}");
                assert!(launches.insert((t, i)), "launch {t}/{i} traced twice");
            }
            api @ ("cuMemcpyHtoD_v2" | "cuMemcpyDtoH_v2") => {
                assert_eq!(e["kind"], "memcpy");
                assert!(e["duration_ns"].as_u64().unwrap() >= 2000, "{e}");
                let bytes = e["bytes"].as_u64().unwrap();
                if bytes == 1 << 20 {
                    continue;
                }
                let (j, t) = ((bytes - 1024) / 16, (bytes - 1024) % 16);
                let (want_api, dir) = if j % 2 == 0 {
                    ("cuMemcpyHtoD_v2", "htod")
                } else {
                    ("cuMemcpyDtoH_v2", "dtoh")
                };
                assert_eq!(
                    (api, e["direction"].as_str().unwrap()),
                    (want_api, dir),
                    "{e}"
                );
                assert!(copies.insert((t, j)), "copy {t}/{j} traced twice");
            }
            _ => {}
        }
    }
    assert_eq!(launches.len(), 10_000, "launch events");
    assert_eq!(copies.len(), 2_000, "copy events");
    for t in 0..2 {
        assert!(
            (0..5000).all(|i| launches.contains(&(t, i))),
            "thread {t} launches incomplete"
        );
        assert!(
            (0..1000).all(|j| copies.contains(&(t, j))),
            "thread {t} copies incomplete"
        );
    }
    let summary = traced.summary();
    assert_eq!(summary["dropped"], 0);
    assert_eq!(summary["undecodable"], 0);
    assert!(summary["events"] >= events.len() as u64);
    eprintln!(
        "e2e launches_and_copies_exact: launches in=10000 out={} copies in=2000 out={} dropped={}",
        launches.len(),
        copies.len(),
        summary["dropped"]
    );
}

/// `--duration` stops by itself, and `--pid` sees only that process.
#[test]
fn duration_and_pid_filter() {
    let Some(env) = env() else { return };
    let dev = device_file("pid");
    let vars = [
        ("CUDA_STANDIN_DEVICE", dev.as_str()),
        ("CUDA_STANDIN_NS_PER_BLOCK", "1"),
    ];
    // A workload that waits on stdin before loading the library, so its pid is known first.
    let mut target = Command::new(env.workload())
        .arg("--lib")
        .arg(env.libcuda())
        .args(["wait-for-lib", "300"])
        .envs(vars)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = target.id().to_string();
    let lib = env.libcuda();
    let tracer = Cudatrace::start(
        &env,
        &[
            "--json",
            "--duration",
            "3",
            "--pid",
            &pid,
            "--lib",
            lib.to_str().unwrap(),
        ],
    );
    let other = Workload::new(
        &env,
        Scenario::Basic {
            launches: 200,
            copies: 0,
        },
    )
    .vars(&vars)
    .run();
    drop(target.stdin.take());
    workload_report(target);
    let traced = tracer.wait();
    assert_eq!(traced.code, Some(0));
    let launches: Vec<_> = traced
        .events
        .iter()
        .filter(|e| e["api"] == "cuLaunchKernel")
        .collect();
    assert_eq!(launches.len(), 300, "launches of the --pid process");
    assert!(launches
        .iter()
        .all(|e| e["pid"].as_u64().unwrap().to_string() == pid));
    assert!(
        traced.of_pid(other["pid"].as_u64().unwrap()).is_empty(),
        "the other process was traced"
    );
    eprintln!(
        "e2e duration_and_pid_filter: target launches in=300 out={} other out=0",
        launches.len()
    );
}

/// A library missing some entry points: it says which, attaches the rest, and traces them.
#[test]
fn partial_library_reports_symbols() {
    let Some(env) = env() else { return };
    let partial = env.standin.join("libpartial.so");
    let tracer = Cudatrace::start(&env, &["--json", "--lib", partial.to_str().unwrap()]);
    let traced = tracer.stop();
    let line = traced
        .stderr
        .iter()
        .find(|l| l.contains("libpartial.so: attached"))
        .expect("attach report");
    let want = format!(
        "attached 2 of {} entry points",
        tracer_common::Api::ALL.len()
    );
    assert!(line.contains(&want), "{line}");
    assert!(line.contains("not exported: cuLaunchKernel_ptsz"), "{line}");
    assert!(
        !line.contains(" cuLaunchKernel ") && !line.contains(" cuMemcpyHtoD_v2 "),
        "{line}"
    );
    assert!(
        traced
            .stderr
            .iter()
            .any(|l| l == "ready: 4 probes attached"),
        "{:?}",
        traced.stderr
    );
    assert_eq!(traced.code, Some(0));
}

/// Bad input gets one line saying what is wrong and what to do, and a failure exit.
#[test]
fn bad_input_one_line() {
    let Some(env) = env() else { return };
    let run = |args: &[&str]| {
        let out = Command::new(&env.bin).args(args).output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = run(&["trace", "--lib", "/nonexistent/libcuda.so.1"]);
    assert_eq!(code, Some(1));
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("cudatrace: library not found: /nonexistent/libcuda.so.1"),
        "{err}"
    );

    let (code, err) = run(&["trace", "--lib", "/etc/hostname"]);
    assert_eq!(code, Some(1));
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("/etc/hostname is not a shared library for this host: it is")
            && err.contains("shorter than an ELF header"),
        "{err}"
    );

    // As an unprivileged user (setpriv drops root and every capability).
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
        ])
        .arg(&env.bin)
        .args(["trace", "--lib", "/nonexistent"])
        .output()
        .expect("setpriv (util-linux) is needed");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("needs root or CAP_BPF and CAP_PERFMON"),
        "{err}"
    );
    assert!(
        err.contains("not root and without CAP_BPF and CAP_PERFMON"),
        "{err}"
    );
}

/// The eBPF programs report rare conditions through aya-log: a `CUlaunchConfig` the probe cannot
/// read (its page not yet mapped) is one warning per call on stderr at the default level, the
/// launch still recorded with dimensions 0; `--log-level off` silences it; `debug` adds process
/// exits.
#[test]
fn ebpf_log_reports_rare_conditions() {
    let Some(env) = env() else { return };
    let lib = env.libcuda();
    let dev = device_file("ebpf-log");
    let warning = "cudatrace: ebpf warn: cuLaunchKernelEx: cannot read its CUlaunchConfig";
    for (level, warnings) in [("warn", 3), ("off", 0)] {
        let tracer = Cudatrace::start(
            &env,
            &[
                "--json",
                "--log-level",
                level,
                "--lib",
                lib.to_str().unwrap(),
            ],
        );
        let report = Workload::new(&env, Scenario::UnpagedConfig(3))
            .device(&dev)
            .run();
        std::thread::sleep(std::time::Duration::from_millis(200));
        let traced = tracer.stop();
        let launches: Vec<_> = traced
            .of_pid(report["pid"].as_u64().unwrap())
            .into_iter()
            .filter(|e| e["api"] == "cuLaunchKernelEx")
            .collect();
        assert_eq!(launches.len(), 3, "--log-level {level}");
        assert!(
            launches
                .iter()
                .all(|e| e["grid"] == serde_json::json!([0, 0, 0])),
            "{launches:?}"
        );
        let said = traced
            .stderr
            .iter()
            .filter(|l| l.starts_with(warning))
            .count();
        assert_eq!(said, warnings, "--log-level {level}: {:?}", traced.stderr);
        assert!(
            !traced
                .stderr
                .iter()
                .any(|l| l.starts_with("cudatrace: ebpf debug:")),
            "{:?}",
            traced.stderr
        );
        eprintln!("e2e ebpf_log_reports_rare_conditions: --log-level {level}: unreadable configs in=3 launches out=3 warnings={said}");
    }
    // Debug: a process that lives long enough to be tracked reports its exit.
    let tracer = Cudatrace::start(
        &env,
        &[
            "--json",
            "--log-level",
            "debug",
            "--lib",
            lib.to_str().unwrap(),
        ],
    );
    let report = Workload::new(
        &env,
        Scenario::Loop {
            seconds: 1.0,
            grid: 1,
            sync_every: 1,
        },
    )
    .device(&dev)
    .run();
    let pid = report["pid"].as_u64().unwrap();
    let exited = format!("cudatrace: ebpf debug: tracked process {pid} exited");
    let line = tracer.wait_stderr(std::time::Duration::from_secs(5), |l| l == exited);
    let traced = tracer.stop();
    assert!(line.is_some(), "no {exited:?}: {:?}", traced.stderr);
    let _ = std::fs::remove_file(&dev);
}

/// Records carry no name: the kernel reads a thread's name at its first call, and the main
/// thread's rename (`prctl(PR_SET_NAME)`) reaches user space before the calls after it.
#[test]
fn the_process_name_is_read_once_and_follows_a_rename() {
    let Some(env) = env() else { return };
    let lib = env.libcuda();
    let tracer = Cudatrace::start(&env, &["--json", "--lib", lib.to_str().unwrap()]);
    let dev = device_file("rename");
    let report = Workload::new(&env, Scenario::Rename("renamed-job".into(), 500))
        .device(&dev)
        .run();
    let traced = tracer.stop();
    let _ = std::fs::remove_file(&dev);
    let pid = report["pid"].as_u64().unwrap();
    let names: Vec<&str> = traced
        .of_pid(pid)
        .into_iter()
        .filter(|e| e["api"] == "cuLaunchKernel")
        .map(|e| e["comm"].as_str().unwrap())
        .collect();
    let before = names.iter().take_while(|n| **n == "cuda-workload").count();
    eprintln!("e2e the_process_name_is_read_once_and_follows_a_rename: {} launches, {before} named cuda-workload, then {:?}", names.len(), names.last());
    assert_eq!(names.len(), 1000);
    assert_eq!(before, 500);
    assert!(
        names[500..].iter().all(|n| *n == "renamed-job"),
        "{:?}",
        &names[500..510]
    );
}
