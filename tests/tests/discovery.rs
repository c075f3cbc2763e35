//! End-to-end: discovery without polling. The kernel names each process that opens a file
//! named like libcuda (the open path's kprobe; on this sandbox's kernel, without kprobes, the
//! loaders' hooks, `tests/loaders.rs`, and then the `sys_enter` raw tracepoint), and only that
//! process's maps are read:
//! a crowd of processes that open none costs no read, while a process in another mount
//! namespace that `dlopen`s a copy of its own after start is attached within 100 ms and traced
//! in full. Where the kernel cannot, one line says so and discovery polls.
use std::process::{Command, Stdio};

use integration_tests::{
    device_file, env, exposition, free_port, guards::TempDir, http, report, Cudatrace, Scenario,
    Workload,
};

/// The daemon's `cudatrace_discovery_maps_read_total`.
fn maps_read(listen: &str) -> f64 {
    exposition::sum(
        &exposition::parse(&http::scrape(listen)),
        "cudatrace_discovery_maps_read_total",
        &[],
    )
}

/// The open hook this kernel should get: the open path's kprobe where it has kprobes (a
/// `kprobe` PMU), else the loaders' hooks (this sandbox's kernel: CONFIG_KPROBES off).
fn expected_hook() -> &'static str {
    if std::path::Path::new("/sys/bus/event_source/devices/kprobe").exists() {
        "kprobe:do_sys_openat2"
    } else {
        "uprobe:_dl_debug_state"
    }
}

/// Keeps discovery off the open path's kprobe and the loaders, so that it takes `sys_enter`.
const SYSCALLS_ONLY: [(&str, &str); 2] = [
    ("CUDATRACE_OPENS_FUNCTION", "no_such_function"),
    ("CUDATRACE_LOADER_SYMBOL", "no_such_symbol"),
];

#[test]
fn discovery_reads_only_the_maps_of_processes_the_kernel_names() {
    let Some(env) = env() else { return };
    let listen = format!("127.0.0.1:{}", free_port());
    let daemon = Cudatrace::start_daemon(&env, &["--listen", &listen], &[]);
    let mode = daemon.wait_event(std::time::Duration::from_secs(5), "discovery", |_| true);
    let after_start = maps_read(&listen);
    // A crowd of 200 processes that open no libcuda.
    let crowd: Vec<_> = (0..200)
        .map(|_| {
            Command::new("sleep")
                .arg("30")
                .stdout(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    // A process in its own mount namespace, its own copy of the library at a container path,
    // loaded 0.5 s after the daemon was ready.
    let dir = TempDir::new("events");
    let lib = dir.copy(&env.libcuda(), "image/libcuda.so.1");
    let dev = device_file("events");
    let script = format!(
        "sleep 0.5; exec unshare --mount --propagation private sh -c '\
         mount -t tmpfs none /mnt && mkdir -p /mnt/usr/lib && touch /mnt/usr/lib/libcuda.so.1 && \
         mount --bind {lib} /mnt/usr/lib/libcuda.so.1 && \
         exec {workload} --lib /mnt/usr/lib/libcuda.so.1 --settle 300 basic 2000 0'",
        lib = lib.display(),
        workload = env.workload().display(),
    );
    let inside = Command::new("sh")
        .args(["-c", &script])
        .env("CUDA_STANDIN_DEVICE", &dev)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let inside = report(inside);
    // And a process on the host mapping a second copy.
    let second = dir.copy(&env.libcuda(), "second/libcuda.so.1");
    let host = Workload::new(
        &env,
        Scenario::Basic {
            launches: 500,
            copies: 0,
        },
    )
    .lib(&second)
    .device(&dev)
    .settle_ms(300)
    .run();
    let read = maps_read(&listen) - after_start;
    let counted = |r: &serde_json::Value, n: f64| {
        let pid = r["pid"].as_u64().unwrap().to_string();
        exposition::wait_for_launches(&listen, &pid, n, std::time::Duration::from_secs(10))
    };
    let (c_inside, c_host) = (counted(&inside, 2000.0), counted(&host, 500.0));
    for mut c in crowd {
        let _ = c.kill();
        let _ = c.wait();
    }
    let traced = daemon.stop();
    let _ = std::fs::remove_file(&dev);
    let delay_ms = |r: &serde_json::Value| {
        let pid = r["pid"].as_u64().unwrap();
        traced
            .log_events("discovered")
            .iter()
            .find(|e| {
                e["path"]
                    .as_str()
                    .unwrap_or_default()
                    .starts_with(&format!("/proc/{pid}/"))
            })
            .map(|e| {
                (e["at_ns"].as_u64().unwrap() as f64 - r["loaded_ns"].as_u64().unwrap() as f64)
                    / 1e6
            })
    };
    let (d_inside, d_host) = (delay_ms(&inside), delay_ms(&host));
    eprintln!(
        "e2e discovery_reads_only_the_maps_of_processes_the_kernel_names: mode {:?}; maps read after start: {read} \
         (beside a crowd of 200); dlopen to attached: other mount namespace {d_inside:?} ms, second copy {d_host:?} ms; \
         launches in=2000 counted={c_inside:?}, in=500 counted={c_host:?}",
        mode.as_ref().map(|m| m["mode"].clone())
    );
    assert_eq!(
        mode.as_ref()
            .map(|m| (m["mode"].clone(), m["hook"].clone())),
        Some(("events".into(), expected_hook().into())),
        "{:?}",
        traced.stderr
    );
    // Neither the open path's hook nor the loaders' runs on every system call.
    assert!(
        !traced
            .stderr
            .iter()
            .any(|l| l.contains("every system call")),
        "{:?}",
        traced.stderr
    );
    // The processes that opened (kprobe) or loaded (loaders) a file named libcuda.so.1: the two
    // workloads, with the kprobe `touch` and `mount` making the container's path and this test
    // copying the library twice, with the loaders each new executable (`sleep` once, `sh`,
    // `unshare`...), each read at once and again at most five times until it mapped one or
    // left. None of the crowd (a polling pass reads all 200, and every other process, four
    // times a second).
    assert!(
        (2.0..=40.0).contains(&read),
        "{read} maps read: {:?}",
        traced.stderr
    );
    for d in [d_inside, d_host] {
        let d = d.unwrap_or_else(|| panic!("not discovered: {:?}", traced.stderr));
        assert!(d < 100.0, "attached {d} ms after dlopen");
    }
    assert_eq!((c_inside, c_host), (Some(2000.0), Some(500.0)));
    assert_eq!(traced.code, Some(0));
}

/// Runs the stand-in's basic job (700 launches) beside a daemon started with `vars`; returns its
/// discovery event, the launches counted and the daemon's stderr.
fn discovered_with(
    vars: &[(&str, &str)],
    tag: &str,
) -> (Option<serde_json::Value>, Option<f64>, Vec<String>) {
    let env = env().expect("checked by the caller");
    let listen = format!("127.0.0.1:{}", free_port());
    let daemon = Cudatrace::start_daemon(&env, &["--listen", &listen], vars);
    let mode = daemon.wait_event(std::time::Duration::from_secs(5), "discovery", |_| true);
    let dev = device_file(tag);
    let job = Workload::new(
        &env,
        Scenario::Basic {
            launches: 700,
            copies: 0,
        },
    )
    .device(&dev)
    .settle_ms(500)
    .run();
    let pid = job["pid"].as_u64().unwrap().to_string();
    let counted =
        exposition::wait_for_launches(&listen, &pid, 700.0, std::time::Duration::from_secs(10));
    let traced = daemon.stop();
    let _ = std::fs::remove_file(&dev);
    assert_eq!(traced.code, Some(0), "{:?}", traced.stderr);
    (mode, counted, traced.stderr)
}

#[test]
fn without_the_open_path_discovery_hooks_system_calls_and_says_so_once() {
    if env().is_none() {
        return;
    }
    let (mode, counted, stderr) = discovered_with(&SYSCALLS_ONLY, "syscalls");
    let said: Vec<&String> = stderr
        .iter()
        .filter(|l| l.contains("every system call"))
        .collect();
    eprintln!(
        "e2e without_the_open_path_discovery_hooks_system_calls_and_says_so_once: {said:?}; launches in=700 counted={counted:?}"
    );
    assert_eq!(said.len(), 1, "{stderr:?}");
    assert!(
        said[0].starts_with("cudatrace: discovery's open hook runs on every system call of the node (raw_tracepoint:sys_enter), since the kernel's open path cannot be probed (kprobe no_such_function: cannot create a multi link for cuda_opened_path in kernel function no_such_function")
            && said[0].contains("; no perf-event kprobe on no_such_function either")
            && said[0].contains("; loader hooks: ")
            && said[0].contains("exports no no_such_symbol"),
        "{}",
        said[0]
    );
    assert_eq!(
        mode.map(|m| (m["mode"].clone(), m["hook"].clone())),
        Some(("events".into(), "raw_tracepoint:sys_enter".into()))
    );
    assert_eq!(counted, Some(700.0), "{stderr:?}");
}

#[test]
fn without_the_kernels_help_discovery_polls_and_says_so_once() {
    if env().is_none() {
        return;
    }
    let (mode, counted, stderr) = discovered_with(
        &[
            SYSCALLS_ONLY[0],
            SYSCALLS_ONLY[1],
            ("CUDATRACE_OPENS_TRACEPOINT", "no_such_tracepoint"),
        ],
        "polls",
    );
    let said: Vec<&String> = stderr
        .iter()
        .filter(|l| l.contains("the kernel cannot say which process opens a libcuda"))
        .collect();
    eprintln!(
        "e2e without_the_kernels_help_discovery_polls_and_says_so_once: {said:?}; launches in=700 counted={counted:?}"
    );
    assert_eq!(said.len(), 1, "{stderr:?}");
    assert!(
        said[0].starts_with("cudatrace: the kernel cannot say which process opens a libcuda (kprobe no_such_function: ")
            && said[0].contains("; loader hooks: ")
            && said[0].contains("; cannot attach to the raw tracepoint no_such_tracepoint")
            && said[0].ends_with("discovering by reading every process's maps every 250 ms instead"),
        "{}",
        said[0]
    );
    assert!(
        !stderr.iter().any(|l| l.contains("every system call")),
        "{stderr:?}"
    );
    assert_eq!(
        mode.map(|m| (m["mode"].clone(), m["hook"].clone())),
        Some(("poll".into(), "".into()))
    );
    assert_eq!(counted, Some(700.0), "{stderr:?}");
}

/// A tenant opening a file named libcuda.so.1 in a loop for 5 s (on the open hook, the loaders'
/// kept off: they see no open): the kernel reports it at most once a millisecond, its maps are read at most
/// once per 50 ms, and the daemon stays cheap and answers scrapes.
#[test]
fn a_tenant_opening_libcuda_in_a_loop_costs_little() {
    let Some(env) = env() else { return };
    let listen = format!("127.0.0.1:{}", free_port());
    let daemon = Cudatrace::start_daemon(&env, &["--listen", &listen], &[SYSCALLS_ONLY[1]]);
    let dir = TempDir::new("open-flood");
    let bait = dir.write("libcuda.so.1", "not a library");
    let f = integration_tests::flood(
        daemon.pid(),
        &listen,
        &format!(
            "n = 0\nwhile True:\n    open({:?}).close()\n",
            bait.display().to_string()
        ),
    );
    let traced = daemon.stop();
    f.print_and_check("a_tenant_opening_libcuda_in_a_loop_costs_little", "opens");
    assert!(f.read <= 150.0, "{} maps read", f.read);
    assert_eq!(traced.code, Some(0), "{:?}", traced.stderr);
}
