//! End-to-end: discovery of libraries mapped later, containers, filters, and process exits.
use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use integration_tests::{Env, Traced, Tracer, device_file, env, finish_workload, spawn_workload};
use serde_json::Value;

/// A copy of the stand-in library at a path no one configured (its own inode).
fn copy_lib(env: &Env, dir: &str) -> PathBuf {
    let dir = PathBuf::from(format!("/tmp/cudatrace-test-{}/{dir}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let lib = dir.join("libcuda.so.1");
    fs::copy(env.libcuda(), &lib).unwrap();
    lib
}

fn run_with_lib(env: &Env, lib: &Path, vars: &[(&str, &str)], args: &[&str]) -> std::process::Child {
    Command::new(env.standin.join("cuda-workload"))
        .arg("--lib")
        .arg(lib)
        .args(args)
        .envs(vars.iter().copied())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

fn count(traced: &Traced, pid: u64, api: &str) -> usize {
    traced.of_pid(pid).iter().filter(|e| e["api"] == api).count()
}

/// Two copies of the library at unconfigured paths, first mapped after the tracer started:
/// each is discovered within 1 s of being mapped and traced in full.
#[test]
fn libraries_mapped_later_are_traced() {
    let Some(env) = env() else { return };
    let (a, b) = (copy_lib(&env, "a"), copy_lib(&env, "b"));
    let tracer = Tracer::start(&env, &["--json", "--rescan-ms", "100"]);
    let dev = device_file("late");
    let vars = [("CUDA_STANDIN_DEVICE", dev.as_str()), ("CUDA_STANDIN_NS_PER_BLOCK", "1")];
    let wa = run_with_lib(&env, &a, &vars, &["--settle", "1000", "basic", "1000", "100"]);
    let wb = run_with_lib(&env, &b, &vars, &["--settle", "1000", "basic", "1000", "100"]);
    let (ra, rb) = (finish_workload(wa), finish_workload(wb));
    let traced = tracer.stop();
    for (report, lib) in [(&ra, &a), (&rb, &b)] {
        let pid = report["pid"].as_u64().unwrap();
        let needle = format!("/proc/{pid}/root{}", lib.display());
        let found: Vec<&String> = traced.stderr.iter().filter(|l| l.starts_with("discovered: ")).collect();
        let line = found
            .iter()
            .find(|l| l.contains(&needle) || l.contains(&lib.display().to_string()))
            .unwrap_or_else(|| panic!("{} not discovered: {:?}", lib.display(), traced.stderr));
        let at: u64 = line.rsplit_once("at_ns=").unwrap().1.parse().unwrap();
        let delay_ms = (at as f64 - report["loaded_ns"].as_u64().unwrap() as f64) / 1e6;
        assert_eq!(count(&traced, pid, "cuLaunchKernel"), 1000, "{}", lib.display());
        assert_eq!(count(&traced, pid, "cuMemcpyHtoD_v2") + count(&traced, pid, "cuMemcpyDtoH_v2"), 100);
        eprintln!("e2e libraries_mapped_later_are_traced: {} discovered {delay_ms:.0} ms after dlopen; launches in=1000 out=1000", lib.display());
        assert!(delay_ms < 1000.0, "discovered {delay_ms} ms after being mapped");
    }
    let probes_line = traced.stderr.iter().filter(|l| l.contains("attached 43 of 43")).count();
    assert_eq!(probes_line, 2, "each copy attached once: {:?}", traced.stderr);
}

/// A process in its own mount namespace, the library bind-mounted at a container-like path, in
/// a cgroup named as containerd names a Kubernetes container: traced, labelled with its
/// container id and pod UID, and selected by `--cgroup`.
#[test]
fn container_process_traced_and_labelled() {
    let Some(env) = env() else { return };
    let container = "3f1c0a6e9b2d4c8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e";
    let pod = "0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0";
    let root = PathBuf::from(format!("/sys/fs/cgroup/unified/cudatrace-test-{}", std::process::id()));
    let cg = root.join(format!("kubepods/pod{pod}/cri-containerd-{container}.scope"));
    if let Err(e) = fs::create_dir_all(&cg) {
        panic!("cannot create cgroup v2 directory {}: {e}", cg.display());
    }
    let dev = device_file("ctr");
    // Its own copy (own inode), reachable only through the namespace's mount.
    let image_lib = copy_lib(&env, "ctr-image");
    let tracer = Tracer::start(&env, &["--json", "--rescan-ms", "100", "--cgroup", cg.to_str().unwrap()]);
    let script = format!(
        "echo $$ > {procs} && exec unshare --mount --propagation private sh -c '\
         mount -t tmpfs none /mnt && mkdir -p /mnt/usr/lib/x86_64-linux-gnu && \
         touch /mnt/usr/lib/x86_64-linux-gnu/libcuda.so.1 && \
         mount --bind {lib} /mnt/usr/lib/x86_64-linux-gnu/libcuda.so.1 && \
         exec {workload} --lib /mnt/usr/lib/x86_64-linux-gnu/libcuda.so.1 --settle 1000 basic 500 0'",
        procs = cg.join("cgroup.procs").display(),
        lib = image_lib.display(),
        workload = env.standin.join("cuda-workload").display(),
    );
    let inside = Command::new("sh")
        .args(["-c", &script])
        .env("CUDA_STANDIN_DEVICE", &dev)
        .env("CUDA_VISIBLE_DEVICES", "GPU-test-0")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // A process outside the cgroup, same library: filtered out in the kernel.
    let outside = spawn_workload(&env, &[("CUDA_STANDIN_DEVICE", &dev)], &["--settle", "1000", "basic", "300", "0"]);
    let report = finish_workload(inside);
    let other = finish_workload(outside);
    let traced = tracer.stop();
    let _ = fs::remove_dir(&cg);
    let _ = fs::remove_dir(cg.parent().unwrap());
    let _ = fs::remove_dir(root.join("kubepods"));
    let _ = fs::remove_dir(&root);
    let pid = report["pid"].as_u64().unwrap();
    let inside_path = format!("/proc/{pid}/root/mnt/usr/lib/x86_64-linux-gnu/libcuda.so.1");
    assert!(
        traced.stderr.iter().any(|l| l.starts_with(&format!("discovered: {inside_path} "))),
        "{inside_path} not discovered: {:?}",
        traced.stderr
    );
    let launches: Vec<&Value> = traced.of_pid(pid).into_iter().filter(|e| e["api"] == "cuLaunchKernel").collect();
    assert_eq!(launches.len(), 500);
    let process = &launches[0]["process"];
    assert_eq!(process["container_id"], container, "{process}");
    assert_eq!(process["pod_uid"], pod, "{process}");
    assert_eq!(process["cuda_visible_devices"], "GPU-test-0", "{process}");
    assert!(process["cgroup"].as_str().unwrap().ends_with(&format!("cri-containerd-{container}.scope")));
    assert!(process["exe"].as_str().unwrap().ends_with("cuda-workload"), "{process}");
    assert!(process["start_time"].as_u64().unwrap() > 0);
    assert!(traced.of_pid(other["pid"].as_u64().unwrap()).is_empty(), "--cgroup let another process through");
    eprintln!("e2e container_process_traced_and_labelled: launches in=500 out=500, outside the cgroup in=300 out=0, container={}", &container[..12]);
}

/// `--comm` keeps only threads of that name, in the kernel.
#[test]
fn comm_filter_exact() {
    let Some(env) = env() else { return };
    let dev = device_file("comm");
    let lib = env.libcuda();
    // Same binary under another name.
    let renamed = PathBuf::from(format!("/tmp/cudatrace-test-{}/other-job", std::process::id()));
    fs::create_dir_all(renamed.parent().unwrap()).unwrap();
    fs::copy(env.standin.join("cuda-workload"), &renamed).unwrap();
    let tracer = Tracer::start(&env, &["--json", "--comm", "cuda-workload", "--lib", lib.to_str().unwrap()]);
    let vars = [("CUDA_STANDIN_DEVICE", dev.as_str()), ("CUDA_STANDIN_NS_PER_BLOCK", "1")];
    let mine = finish_workload(spawn_workload(&env, &vars, &["basic", "400", "0"]));
    let other = finish_workload(
        Command::new(&renamed).arg("--lib").arg(&lib).args(["basic", "400", "0"]).envs(vars).stdout(Stdio::piped()).spawn().unwrap(),
    );
    let traced = tracer.stop();
    assert_eq!(count(&traced, mine["pid"].as_u64().unwrap(), "cuLaunchKernel"), 400);
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
    let tracer = Tracer::start(&env, &["--json", "--lib", lib.to_str().unwrap()]);
    let mut pids = Vec::new();
    for batch in 0..50 {
        let children: Vec<_> = (0..4)
            .map(|k| {
                if k < 2 && batch % 5 == 0 {
                    // 10 s of queued work on this process's stream: the waiter is mid-call at exit.
                    spawn_workload(&env, &[("CUDA_STANDIN_DEVICE", &dev), ("CUDA_STANDIN_NS_PER_BLOCK", "10000000000")], &["die-in-call"])
                } else {
                    spawn_workload(&env, &[("CUDA_STANDIN_DEVICE", &format!("{dev}-{k}")), ("CUDA_STANDIN_NS_PER_BLOCK", "1")], &["basic", "20", "4"])
                }
            })
            .collect();
        for c in children {
            pids.push(finish_workload(c)["pid"].as_u64().unwrap());
        }
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    let traced = tracer.stop();
    for k in 0..4 {
        let _ = fs::remove_file(format!("{dev}-{k}"));
    }
    let _ = fs::remove_file(&dev);
    assert_eq!(pids.len(), 200);
    let traced_pids: std::collections::BTreeSet<u64> = traced.events.iter().filter_map(|e| e["pid"].as_u64()).collect();
    assert!(pids.iter().all(|p| traced_pids.contains(p)), "every process was traced");
    let s = traced.summary();
    eprintln!(
        "e2e short_lived_processes_leave_no_state: processes=200 exits={} live_processes={} inflight_entries={} tracked_processes={} dropped={}",
        s["exits"], s["live_processes"], s["inflight_entries"], s["tracked_processes"], s["dropped"]
    );
    assert_eq!(s["live_processes"], 0);
    assert_eq!(s["inflight_entries"], 0, "entry state of threads that died in a call");
    assert_eq!(s["tracked_processes"], 0);
    assert_eq!(s["dropped"], 0);
}

/// A SIGKILLed tracer leaves the traced program running untouched.
#[test]
fn killed_tracer_leaves_programs_running() {
    let Some(env) = env() else { return };
    let dev = device_file("kill");
    let lib = env.libcuda();
    let tracer = Tracer::start(&env, &["--json", "--lib", lib.to_str().unwrap()]);
    let job = spawn_workload(&env, &[("CUDA_STANDIN_DEVICE", &dev), ("CUDA_STANDIN_NS_PER_BLOCK", "100")], &["loop", "2", "10", "1"]);
    std::thread::sleep(std::time::Duration::from_millis(500));
    let traced = tracer.kill();
    assert_eq!(traced.code, None, "killed by a signal");
    let report = finish_workload(job);
    let _ = fs::remove_file(&dev);
    assert!(report["launches"].as_u64().unwrap() > 1000, "{report}");
    assert_eq!(report["launches"], report["syncs"].as_u64().map(|s| s - 1).unwrap_or(0), "every launch was synchronized");
}
