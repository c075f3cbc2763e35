//! End-to-end: least privilege. `cudatrace run` with exactly the capabilities and the config
//! file of the DaemonSet `helm template` renders from deploy/helm/cudatrace, as uid 65534, finds
//! and traces another user's process without `--lib`; without any one of them it exits non-zero
//! naming it; once started it keeps only what it still needs, under no-new-privs. Started as
//! uid 0, as the DaemonSet starts it, it leaves uid 0 before it reads anything of a tenant.
//! Probes are uprobe_multi links, which detach at once (classic.rs: the fallback).
use std::{
    process::Command,
    time::{Duration, Instant},
};

use integration_tests::{
    chart,
    container::{podman_run, seccomp_with_bpf, DEFAULT_SECCOMP},
    device_file, env, exposition, free_port, Cudatrace, Scenario, Workload,
};

/// The uid the chart's config makes the daemon (`config.run_as`): its own, not 65534.
const CHART_UID: u32 = 64023;

/// `setpriv` arguments giving uid/gid 65534 exactly `caps` (lower-case names, no `CAP_`), as
/// ambient capabilities, as systemd's `AmbientCapabilities=` would.
fn as_nobody_with(caps: &[String]) -> Vec<String> {
    let list: String = caps
        .iter()
        .map(|c| format!(",+{}", c.to_lowercase()))
        .collect();
    vec![
        "--reuid=65534".into(),
        "--regid=65534".into(),
        "--clear-groups".into(),
        format!("--inh-caps=-all{list}"),
        format!("--ambient-caps=-all{list}"),
    ]
}

/// Capability names in a /proc/PID/status `CapEff` line's mask.
fn cap_eff(pid: u32) -> (u64, bool) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let eff = tracer_common::caps::effective_from_status(&status).unwrap();
    let nnp = status
        .lines()
        .any(|l| l.starts_with("NoNewPrivs:") && l.trim_end().ends_with('1'));
    (eff, nnp)
}

fn bit(name: &str) -> u64 {
    let n = match name {
        "DAC_READ_SEARCH" => 2,
        "SETGID" => 6,
        "SETUID" => 7,
        "SYS_PTRACE" => 19,
        "SYS_ADMIN" => 21,
        "PERFMON" => 38,
        "BPF" => 39,
        other => panic!("unexpected capability {other} in the DaemonSet"),
    };
    1 << n
}

/// The capabilities only leaving uid 0 takes (dropped once switched).
const SWITCHING: [&str; 2] = ["SETUID", "SETGID"];

/// The DaemonSet's capabilities that tracing itself needs: all but [`SWITCHING`].
fn tracing_caps() -> Vec<String> {
    let caps = chart::daemonset_capabilities();
    assert_eq!(
        caps,
        [
            "BPF",
            "PERFMON",
            "SYS_PTRACE",
            "DAC_READ_SEARCH",
            "SETUID",
            "SETGID"
        ],
        "the set these tests prove"
    );
    caps.into_iter()
        .filter(|c| !SWITCHING.contains(&c.as_str()))
        .collect()
}

/// Pids of the running processes named cudatrace whose parent is named `parent`.
fn cudatrace_pids(parent: &str) -> Vec<u32> {
    let comm = |pid: u32| std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    let ppid = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("PPid:")?.trim().parse::<u32>().ok())
    };
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|p| p.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| comm(*pid).trim_end() == "cudatrace")
        .filter(|pid| ppid(*pid).is_some_and(|pp| comm(pp).trim_end() == parent))
        .collect()
}

/// As uid 65534 with exactly the DaemonSet's capabilities, its config file and no `--lib`: another user's
/// process is found and every call counted; the daemon keeps exactly those four while it
/// watches, under no-new-privs.
#[test]
fn least_privilege_daemon_traces_another_users_process() {
    let Some(env) = env() else { return };
    // Not root: nothing to leave, so the switching capabilities are not needed.
    let caps = tracing_caps();
    let dir = integration_tests::guards::TempDir::new("chart-config");
    // The chart's state directory, owned by the uid this test starts it as.
    let state = dir.join("state");
    std::fs::create_dir(&state).unwrap();
    std::os::unix::fs::chown(&state, Some(65534), Some(65534)).unwrap();
    let config = dir.write(
        "config.toml",
        &chart::config_toml_with(&[
            &allow_standin(&env),
            &format!("stateDir={}", state.display()),
        ]),
    );
    let listen = format!("127.0.0.1:{}", free_port());
    let mut args = as_nobody_with(&caps);
    args.extend([
        env.bin.display().to_string(),
        "run".into(),
        "--config".into(),
        config.display().to_string(),
    ]);
    args.extend(["--listen".into(), listen.clone()]);
    let daemon = Cudatrace::start_wrapped(&env, "setpriv", &args, &[]);
    let (eff, nnp) = cap_eff(daemon.pid());
    let want: u64 = caps.iter().map(|c| bit(c)).sum();
    assert_eq!((eff, nnp), (want, true), "CapEff {eff:#x} while watching");
    // Another user's process: uid 1000, its own simulated device.
    let dev = device_file("nobody");
    let job = Workload::new(
        &env,
        Scenario::Basic {
            launches: 2000,
            copies: 0,
        },
    )
    .device(&dev)
    .settle_ms(2000)
    .as_user(1000)
    .run();
    let pid = job["pid"].as_u64().unwrap().to_string();
    let counted = exposition::wait_for_launches(&listen, &pid, 2000.0, Duration::from_secs(10));
    let traced = daemon.stop();
    let _ = std::fs::remove_file(&dev);
    eprintln!(
        "e2e least_privilege_daemon_traces_another_users_process: uid 65534 with {caps:?}: launches in=2000 counted={counted:?}; \
         CapEff {eff:#x} NoNewPrivs {nnp}"
    );
    assert_eq!(counted, Some(2000.0), "{:?}", traced.stderr);
    assert!(
        traced
            .log_events("discovered")
            .iter()
            .any(|r| r["path"].as_str().is_some_and(|p| p.starts_with("/proc/"))),
        "{:?}",
        traced.stderr
    );
    assert_eq!(traced.code, Some(0));
}

/// Without any one of the four, `run` without `--lib` exits 1 with one line naming it.
#[test]
fn each_missing_capability_is_named() {
    let Some(env) = env() else { return };
    let caps = tracing_caps();
    for missing in &caps {
        let rest: Vec<String> = caps.iter().filter(|c| *c != missing).cloned().collect();
        let listen = format!("127.0.0.1:{}", free_port());
        let out = Command::new("setpriv")
            .args(as_nobody_with(&rest))
            .arg(&env.bin)
            .args(["run", "--listen", &listen])
            .output()
            .expect("setpriv (util-linux) is needed");
        let err = String::from_utf8_lossy(&out.stderr);
        eprintln!(
            "e2e each_missing_capability_is_named: without {missing}: exit {:?}: {}",
            out.status.code(),
            err.trim()
        );
        assert_eq!(out.status.code(), Some(1), "without {missing}: {err}");
        assert_eq!(err.lines().count(), 1, "without {missing}: {err}");
        assert!(
            err.contains(&format!("CAP_{missing}")),
            "without {missing}: {err}"
        );
    }
}

/// With `--lib`, attaching happens once: after start only the discovery capabilities remain.
/// Stopping takes well under a second, and leaves no process behind to detach probes.
#[test]
fn attached_once_it_drops_the_rest_and_detaches_at_once() {
    let Some(env) = env() else { return };
    let lib = env.libcuda();
    let started = Instant::now();
    let tracer = Cudatrace::start(&env, &["--json", "--lib", lib.to_str().unwrap()]);
    let attach = started.elapsed();
    let (eff, nnp) = cap_eff(tracer.pid());
    assert_eq!(
        (eff, nnp),
        (bit("SYS_PTRACE") + bit("DAC_READ_SEARCH"), true),
        "CapEff {eff:#x}"
    );
    let dev = device_file("detach");
    let report = Workload::new(&env, Scenario::Each(3)).device(&dev).run();
    let stopping = Instant::now();
    let traced = tracer.stop_without_waiting();
    let stop = stopping.elapsed();
    let left = integration_tests::cudatrace_processes();
    let _ = std::fs::remove_file(&dev);
    let events = traced.of_pid(report["pid"].as_u64().unwrap()).len();
    // Every call the workload made, set-up ones included (`name(why)`).
    let calls: u64 = report["calls"]
        .as_object()
        .unwrap()
        .values()
        .map(|n| n.as_u64().unwrap())
        .sum();
    eprintln!(
        "e2e attached_once_it_drops_the_rest_and_detaches_at_once: attach (start to ready) {:.0} ms, stop (SIGINT to exit) {:.0} ms, \
         processes left {left}, events {events} (calls {calls} over {} entry points)",
        attach.as_secs_f64() * 1e3,
        stop.as_secs_f64() * 1e3,
        tracer_common::Api::ALL.len()
    );
    assert_eq!(events as u64, calls);
    assert!(stop < Duration::from_secs(1), "stop took {stop:?}");
    assert_eq!(left, 0, "a process was left detaching probes");
}

/// The image, run by podman as the DaemonSet runs it (host pids, the DaemonSet's capabilities
/// only, no privilege escalation, read-only root), traces a process of the host: N in, N
/// counted. The runtime's default seccomp profile (podman 4.3's) lets only CAP_SYS_ADMIN call
/// bpf(2): with it, loading fails at the first map, as measured here; the same profile with
/// bpf under CAP_BPF is enough.
#[test]
fn image_traces_a_host_process_with_the_daemonset_security_context() {
    let Some(env) = env() else { return };
    let caps = chart::daemonset_capabilities();
    let dir = integration_tests::guards::TempDir::new("image");
    let name = format!("cudatrace-e2e-{}", std::process::id());
    // As the runtime ships it: one line, the first map refused.
    let mut args = podman_run(&caps, std::path::Path::new(DEFAULT_SECCOMP), &name);
    args.extend(["trace".into(), "--duration".into(), "1".into()]);
    let out = Command::new("podman")
        .args(&args)
        .output()
        .expect("podman (Debian package) is needed");
    let err = String::from_utf8_lossy(&out.stderr);
    eprintln!("e2e image_traces_a_host_process_with_the_daemonset_security_context: default seccomp: exit {:?}: {}", out.status.code(), err.trim());
    assert!(
        err.contains("Operation not permitted") && err.contains("failed to create map"),
        "{err}"
    );
    // With bpf(2) allowed under CAP_BPF.
    let listen = format!("127.0.0.1:{}", free_port());
    let mut args = podman_run(&caps, &seccomp_with_bpf(&dir), &name);
    args.extend(["run".into(), "--listen".into(), listen.clone()]);
    let daemon = Cudatrace::start_wrapped(&env, "podman", &args, &[]);
    // The container's cudatrace (conmon's child), seen from the host (host pid namespace, no
    // user namespace).
    let inside: Vec<(String, String, String, u64)> = cudatrace_pids("conmon")
        .into_iter()
        .map(|p| {
            let (uid, gid, groups) = integration_tests::guards::ids(p);
            (uid, gid, groups, cap_eff(p).0)
        })
        .collect();
    let want: u64 = tracing_caps().iter().map(|c| bit(c)).sum();
    let dev = device_file("image");
    let job = Workload::new(
        &env,
        Scenario::Basic {
            launches: 2000,
            copies: 0,
        },
    )
    .device(&dev)
    .settle_ms(2000)
    .run();
    let pid = job["pid"].as_u64().unwrap().to_string();
    let counted = exposition::wait_for_launches(&listen, &pid, 2000.0, Duration::from_secs(10));
    let traced = daemon.stop();
    let _ = std::fs::remove_file(&dev);
    eprintln!(
        "e2e image_traces_a_host_process_with_the_daemonset_security_context: podman, caps {caps:?}, read-only, no-new-privileges: \
         launches in=2000 counted={counted:?}"
    );
    assert_eq!(counted, Some(2000.0), "{:?}", traced.stderr);
    assert_eq!(traced.code, Some(0), "{:?}", traced.stderr);
    eprintln!("e2e image_traces_a_host_process_with_the_daemonset_security_context: the container's cudatrace once ready (Uid, Gid, Groups, CapEff): {inside:?}");
    assert_eq!(
        inside,
        [(
            "65534 65534 65534 65534".to_string(),
            "65534 65534 65534 65534".to_string(),
            String::new(),
            want
        )]
    );
}

/// Started as the DaemonSet starts it (uid 0, no-new-privs, its six capabilities, its config
/// file, no `--lib`): once ready it is the chart's own uid and gid (`config.run_as`, 64023, not
/// 65534) everywhere (real, effective, saved, filesystem), with no supplementary group and only
/// the four tracing capabilities, under its seccomp filter (ptrace answers EPERM) and unable to
/// open `/proc/1/mem` for writing, and it still counts every launch of a root process. Without CAP_SETUID it says so in one line and exits 1; with `--keep-uid` it
/// stays uid 0, capabilities reduced as before.
#[test]
fn the_daemonset_process_leaves_uid_0() {
    let Some(env) = env() else { return };
    let caps = chart::daemonset_capabilities();
    let tracing = tracing_caps();
    let dir = integration_tests::guards::TempDir::new("leave-root");
    // The chart's state directory as the kubelet makes it (hostPath DirectoryOrCreate): root's.
    let state = dir.join("state");
    std::fs::create_dir(&state).unwrap();
    let config = dir.write(
        "config.toml",
        &chart::config_toml_with(&[
            &allow_standin(&env),
            &format!("stateDir={}", state.display()),
        ]),
    );
    assert!(
        std::fs::read_to_string(&config)
            .unwrap()
            .contains(&format!("run_as = {CHART_UID}")),
        "the chart's own uid"
    );
    // The init container first: CHOWN alone, its own args, the same config.
    let (init_args, init_caps, out) = chart::run_init_container(&env.bin, &config);
    assert_eq!(init_caps, ["CHOWN"]);
    let said = String::from_utf8_lossy(&out.stderr);
    let baselines = state.join("baselines");
    let owned = integration_tests::guards::owner_and_mode(&baselines);
    eprintln!(
        "e2e the_daemonset_process_leaves_uid_0: init container {init_args:?} with {init_caps:?}: exit {:?}, {}: baselines/ (uid, gid, mode) {owned:?}",
        out.status.code(),
        said.trim()
    );
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert_eq!(owned, (CHART_UID, CHART_UID, 0o700));
    let listen = format!("127.0.0.1:{}", free_port());
    let mut args = chart::as_root_with(&caps);
    args.extend([
        env.bin.display().to_string(),
        "run".into(),
        "--config".into(),
        config.display().to_string(),
        "--listen".into(),
        listen.clone(),
    ]);
    let daemon = Cudatrace::start_wrapped(&env, "setpriv", &args, &[]);
    let (uid, gid, groups) = integration_tests::guards::ids(daemon.pid());
    let (eff, nnp) = cap_eff(daemon.pid());
    let status = std::fs::read_to_string(format!("/proc/{}/status", daemon.pid())).unwrap();
    let seccomp: Vec<&str> = status
        .lines()
        .filter(|l| l.starts_with("Seccomp"))
        .collect();
    let sandbox = daemon
        .log_now()
        .into_iter()
        .find(|r| r["event"] == "sandbox")
        .expect("a sandbox line");
    let want: u64 = tracing.iter().map(|c| bit(c)).sum();
    // The chart's incident archive, opened before the switch: root's, private.
    let archive = std::fs::metadata(state.join("incidents.jsonl"))
        .unwrap_or_else(|e| panic!("no archive in the chart's state directory: {e}"));
    {
        use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
        assert_eq!(
            (archive.uid(), archive.permissions().mode() & 0o777),
            (0, 0o600)
        );
    }
    let dev = device_file("leave-root");
    let running = Workload::new(
        &env,
        Scenario::Basic {
            launches: 2000,
            copies: 0,
        },
    )
    .device(&dev)
    .settle_ms(1500)
    .spawn();
    let job_uid = integration_tests::guards::ids(running.pid() as u32).0;
    let job = running.finish();
    let pid = job["pid"].as_u64().unwrap().to_string();
    let counted = exposition::wait_for_launches(&listen, &pid, 2000.0, Duration::from_secs(10));
    let traced = daemon.stop();
    let _ = std::fs::remove_file(&dev);
    eprintln!(
        "e2e the_daemonset_process_leaves_uid_0: started uid 0 with {caps:?}; once ready Uid {uid:?} Gid {gid:?} \
         Groups {groups:?} CapEff {eff:#x} NoNewPrivs {nnp}; a root process's launches in=2000 counted={counted:?}"
    );
    eprintln!(
        "e2e the_daemonset_process_leaves_uid_0: {seccomp:?}; {}",
        sandbox["msg"]
    );
    let ids = format!("{CHART_UID} {CHART_UID} {CHART_UID} {CHART_UID}");
    assert_eq!(uid, ids);
    assert_eq!(gid, ids);
    assert_eq!(groups, "");
    // Its own filter (mode 2) on top of the one setpriv's caller may have; the calls a bug would
    // need to reach other processes fail inside it.
    assert!(seccomp.contains(&"Seccomp:\t2"), "{seccomp:?}");
    assert_eq!(sandbox["ptrace"], "EPERM", "{sandbox}");
    assert_eq!(sandbox["proc_mem"], "EACCES", "{sandbox}");
    assert_eq!(
        sandbox["uid"].as_u64(),
        Some(u64::from(CHART_UID)),
        "{sandbox}"
    );
    assert_eq!((eff, nnp), (want, true), "CapEff {eff:#x}");
    assert!(
        job_uid.starts_with("0 "),
        "the workload ran as root: {job_uid}"
    );
    assert_eq!(counted, Some(2000.0), "{:?}", traced.stderr);
    assert_eq!(traced.code, Some(0), "{:?}", traced.stderr);
    // The baselines, saved at stop by the chart's uid: its own, private, of the format.
    let file = baselines.join("baselines.json");
    let saved = integration_tests::guards::owner_and_mode(&file);
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    eprintln!("e2e the_daemonset_process_leaves_uid_0: baselines saved at stop: (uid, gid, mode) {saved:?}, format {}", v["format"]);
    assert_eq!(
        (saved.0, saved.2, v["format"].as_str()),
        (CHART_UID, 0o600, Some("cudatrace-baselines"))
    );

    // Without CAP_SETUID: one line, exit 1, nothing attached.
    let without: Vec<String> = caps.iter().filter(|c| *c != "SETUID").cloned().collect();
    let out = Command::new("setpriv")
        .args(chart::as_root_with(&without))
        .arg(&env.bin)
        .args(["run", "--listen", &format!("127.0.0.1:{}", free_port())])
        .output()
        .expect("setpriv (util-linux) is needed");
    let err = String::from_utf8_lossy(&out.stderr);
    eprintln!(
        "e2e the_daemonset_process_leaves_uid_0: without SETUID: exit {:?}: {}",
        out.status.code(),
        err.trim()
    );
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("cannot leave uid 0 for uid 65534")
            && err.contains("CAP_SETUID")
            && err.contains("--keep-uid"),
        "{err}"
    );

    // --keep-uid: uid 0 stays, the capabilities are reduced as always.
    let lib = env.libcuda();
    let mut args = chart::as_root_with(&caps);
    args.extend([
        env.bin.display().to_string(),
        "trace".into(),
        "--keep-uid".into(),
        "--lib".into(),
        lib.display().to_string(),
    ]);
    let kept = Cudatrace::start_wrapped(&env, "setpriv", &args, &[]);
    let (uid, _, _) = integration_tests::guards::ids(kept.pid());
    let (eff, _) = cap_eff(kept.pid());
    kept.stop();
    assert_eq!(uid, "0 0 0 0");
    assert_eq!(
        eff,
        bit("SYS_PTRACE") + bit("DAC_READ_SEARCH"),
        "CapEff {eff:#x}"
    );
}

/// The `--set` that adds the stand-in's folder to the chart's `lib_allow` (the driver's own
/// folders on a node): the DaemonSet's config, allowing the library the tests' workloads map.
fn allow_standin(env: &integration_tests::Env) -> String {
    let dir = env.libcuda().parent().unwrap().display().to_string();
    format!("config.lib_allow={{{dir}/libcuda.so*}}")
}
