//! End-to-end: discovery's hooks in the dynamic loaders, taken where the kernel's open path
//! cannot be probed (forced here with `CUDATRACE_OPENS_FUNCTION`, so that a kernel with kprobes
//! runs them too). Only loads and executions run them: a `dlopen` of a libcuda, a libcuda loaded
//! at start (`LD_PRELOAD`, as a program linked with it), and a program run through a loader no
//! process used before (its first execution finds the loader, which is hooked then) are each
//! traced in full; past the bound on loaders the `sys_enter` hook goes on as well, said once;
//! and a tenant loading and unloading libcuda in a loop costs the daemon little.
use std::{
    path::PathBuf,
    process::{Command, Stdio},
    time::Duration,
};

use integration_tests::{
    device_file, env, exposition, free_port, guards::TempDir, http, Cudatrace, Scenario, Workload,
};

/// Keeps discovery off the open path's kprobe.
const NO_KPROBE: (&str, &str) = ("CUDATRACE_OPENS_FUNCTION", "no_such_function");

/// A daemon's counter or gauge `name` (0 when absent).
fn metric(listen: &str, name: &str) -> f64 {
    exposition::sum(&exposition::parse(&http::scrape(listen)), name, &[])
}

/// This machine's dynamic loader, as the test process maps it.
fn host_loader() -> PathBuf {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.rsplit('/').next().is_some_and(|n| n.starts_with("ld-")))
        .map(PathBuf::from)
        .expect("the test binary is dynamically linked")
}

/// The basic job of `launches` through `loader` (the host's when None), its own library copy;
/// its report.
fn job(
    env: &integration_tests::Env,
    lib: &std::path::Path,
    launches: u64,
    loader: Option<&std::path::Path>,
    dev: &str,
) -> serde_json::Value {
    let w = Workload::new(
        env,
        Scenario::Basic {
            launches,
            copies: 0,
        },
    )
    .lib(lib)
    .device(dev)
    .settle_ms(300);
    match loader {
        Some(l) => w.through_loader(l).run(),
        None => w.run(),
    }
}

#[test]
fn loads_and_new_loaders_are_discovered_and_other_system_calls_pay_nothing() {
    let Some(env) = env() else { return };
    let listen = format!("127.0.0.1:{}", free_port());
    let daemon = Cudatrace::start_daemon(&env, &["--listen", &listen], &[NO_KPROBE]);
    let mode = daemon.wait_event(Duration::from_secs(5), "discovery", |_| true);
    let hooked_at_start = metric(&listen, "cudatrace_discovery_loaders");
    let dir = TempDir::new("loaders");
    let dev = device_file("loaders");
    // A dlopen through the host's loader.
    let first = job(
        &env,
        &dir.copy(&env.libcuda(), "a/libcuda.so.1"),
        700,
        None,
        &dev,
    );
    // A libcuda loaded at start, before main (as a program linked with it): `sleep` with it
    // preloaded.
    let preloaded = dir.copy(&env.libcuda(), "b/libcuda.so.1");
    let mut sleeper = Command::new("sleep")
        .arg("3")
        .env("LD_PRELOAD", &preloaded)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let sleeper_pid = sleeper.id();
    // A program run through a loader no process used before.
    let host = host_loader();
    let name = host.file_name().unwrap().to_str().unwrap().to_owned();
    let loader = dir.copy(&host, &format!("image/{name}"));
    let third = job(
        &env,
        &dir.copy(&env.libcuda(), "c/libcuda.so.1"),
        500,
        Some(&loader),
        &dev,
    );
    let counted = |r: &serde_json::Value, n: f64| {
        let pid = r["pid"].as_u64().unwrap().to_string();
        exposition::wait_for_launches(&listen, &pid, n, Duration::from_secs(10))
    };
    let (c_first, c_third) = (counted(&first, 700.0), counted(&third, 500.0));
    let hooked = metric(&listen, "cudatrace_discovery_loaders");
    let execs_read = metric(&listen, "cudatrace_discovery_execs_read_total");
    let _ = sleeper.wait();
    let traced = daemon.stop();
    let _ = std::fs::remove_file(&dev);
    let discovered = |pid: u64| {
        traced.log_events("discovered").iter().any(|e| {
            e["path"]
                .as_str()
                .unwrap_or_default()
                .starts_with(&format!("/proc/{pid}/"))
        })
    };
    let hooked_lines: Vec<(String, u64)> = traced
        .log_events("loader_hooked")
        .iter()
        .map(|e| {
            (
                e["path"].as_str().unwrap_or_default().to_owned(),
                e["pid"].as_u64().unwrap_or_default(),
            )
        })
        .collect();
    eprintln!(
        "e2e loads_and_new_loaders_are_discovered_and_other_system_calls_pay_nothing: mode {:?}; loaders hooked {hooked_at_start} at start, {hooked} after; \
         hooked lines {hooked_lines:?}; executions read {execs_read}; launches in=700 counted={c_first:?}, through the new loader in=500 counted={c_third:?}; \
         preloaded sleep discovered {}",
        mode.as_ref().map(|m| (m["mode"].clone(), m["hook"].clone())),
        discovered(sleeper_pid as u64)
    );
    assert_eq!(
        mode.map(|m| (m["mode"].clone(), m["hook"].clone())),
        Some(("events".into(), "uprobe:_dl_debug_state".into())),
        "{:?}",
        traced.stderr
    );
    assert!(hooked_at_start >= 1.0, "{:?}", traced.stderr);
    assert_eq!(hooked, hooked_at_start + 1.0, "{hooked_lines:?}");
    let third_pid = third["pid"].as_u64().unwrap();
    let new_loader = format!("/proc/{third_pid}/root{}", loader.display());
    assert_eq!(
        hooked_lines
            .iter()
            .filter(|(path, _)| path == &new_loader)
            .count(),
        1,
        "{hooked_lines:?}"
    );
    assert!(discovered(sleeper_pid as u64), "{:?}", traced.stderr);
    assert_eq!((c_first, c_third), (Some(700.0), Some(500.0)));
    assert!(
        !traced
            .stderr
            .iter()
            .any(|l| l.contains("every system call")),
        "{:?}",
        traced.stderr
    );
    assert_eq!(traced.code, Some(0), "{:?}", traced.stderr);
}

#[test]
fn past_the_bound_on_loaders_the_syscall_hook_goes_on_and_says_so_once() {
    let Some(env) = env() else { return };
    let listen = format!("127.0.0.1:{}", free_port());
    let daemon = Cudatrace::start_daemon(
        &env,
        &["--listen", &listen],
        &[NO_KPROBE, ("CUDATRACE_MAX_LOADERS", "1")],
    );
    let dir = TempDir::new("loaders-bound");
    let dev = device_file("loaders-bound");
    let host = host_loader();
    let name = host.file_name().unwrap().to_str().unwrap().to_owned();
    let (one, two) = (
        dir.copy(&host, &format!("one/{name}")),
        dir.copy(&host, &format!("two/{name}")),
    );
    let a = job(
        &env,
        &dir.copy(&env.libcuda(), "a/libcuda.so.1"),
        400,
        Some(&one),
        &dev,
    );
    let b = job(
        &env,
        &dir.copy(&env.libcuda(), "b/libcuda.so.1"),
        300,
        Some(&two),
        &dev,
    );
    let counted = |r: &serde_json::Value, n: f64| {
        let pid = r["pid"].as_u64().unwrap().to_string();
        exposition::wait_for_launches(&listen, &pid, n, Duration::from_secs(10))
    };
    let (ca, cb) = (counted(&a, 400.0), counted(&b, 300.0));
    let hooked = metric(&listen, "cudatrace_discovery_loaders");
    let traced = daemon.stop();
    let _ = std::fs::remove_file(&dev);
    let said: Vec<&String> = traced
        .stderr
        .iter()
        .filter(|l| l.contains("dynamic loaders on this node"))
        .collect();
    eprintln!(
        "e2e past_the_bound_on_loaders_the_syscall_hook_goes_on_and_says_so_once: {said:?}; loaders hooked {hooked}; \
         launches in=400 counted={ca:?}, in=300 counted={cb:?}"
    );
    assert_eq!(said.len(), 1, "{:?}", traced.stderr);
    assert_eq!(
        said[0].as_str(),
        "cudatrace: more than 1 dynamic loaders on this node: discovery's open hook now runs on every system call of the node as well (raw_tracepoint:sys_enter)"
    );
    assert_eq!(hooked, 1.0);
    assert_eq!((ca, cb), (Some(400.0), Some(300.0)));
    assert_eq!(traced.code, Some(0), "{:?}", traced.stderr);
}

/// A tenant loading and unloading a libcuda in a loop for 5 s: the loader hook reports it at
/// most once a millisecond, its reads are paid from discovery's budget (20 ms of CPU a second),
/// and the daemon stays cheap and answers scrapes.
#[test]
fn a_tenant_loading_libcuda_in_a_loop_costs_little() {
    let Some(env) = env() else { return };
    let listen = format!("127.0.0.1:{}", free_port());
    let daemon = Cudatrace::start_daemon(&env, &["--listen", &listen], &[NO_KPROBE]);
    let dir = TempDir::new("load-flood");
    let lib = dir.copy(&env.libcuda(), "libcuda.so.1");
    let f = integration_tests::flood(
        daemon.pid(),
        &listen,
        &format!(
            "import ctypes, _ctypes\nwhile True:\n    _ctypes.dlclose(ctypes.CDLL({:?})._handle)\n",
            lib.display().to_string()
        ),
    );
    let traced = daemon.stop();
    f.print_and_check("a_tenant_loading_libcuda_in_a_loop_costs_little", "loads");
    assert!(f.read >= 1.0, "{} maps read", f.read);
    assert_eq!(traced.code, Some(0), "{:?}", traced.stderr);
}
