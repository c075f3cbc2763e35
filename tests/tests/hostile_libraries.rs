//! End-to-end: the libraries a tenant maps cannot make the agent probe what it should not, or
//! without bound: more library files than `max_libraries` are refused and counted, `lib_allow`
//! keeps every file but the host's own out, and an absolute symlink inside a container never
//! leads discovery to the host's file of that path.
use std::{
    process::{Command, Stdio},
    time::Duration,
};

use integration_tests::{
    device_file, env, exposition, free_port, guards::TempDir, http, Cudatrace, Scenario, Workload,
};

/// Past `max_libraries` distinct library files, more are refused in one line each and counted;
/// the daemon answers on. The three processes are three tenants (cgroups), each under its share
/// of the slots (half of them), so that the cap itself is what refuses.
#[test]
fn libraries_past_the_cap_are_refused_and_counted() {
    let Some(env) = env() else { return };
    let dir = TempDir::new("many-libs");
    let config = dir.write("cudatrace.toml", "max_libraries = 2\nrescan_ms = 100\n");
    let dev = device_file("many-libs");
    let libs: Vec<_> = (0..3)
        .map(|k| dir.copy(&env.libcuda(), &format!("{k}/libcuda.so.1")))
        .collect();
    let listen = format!("127.0.0.1:{}", free_port());
    let daemon = Cudatrace::start_daemon(
        &env,
        &["--listen", &listen, "--config", config.to_str().unwrap()],
        &[],
    );
    let tenants: Vec<_> = (0..3)
        .map(|k| integration_tests::guards::Cgroup::new(&format!("many-libs-{k}")))
        .collect();
    let jobs: Vec<_> = libs
        .iter()
        .zip(&tenants)
        .map(|(lib, tenant)| {
            Workload::new(
                &env,
                Scenario::Basic {
                    launches: 10,
                    copies: 0,
                },
            )
            .lib(lib)
            .device(&dev)
            .cgroup(tenant.path())
            .settle_ms(60_000)
            .spawn()
        })
        .collect();
    let counts = integration_tests::poll(Duration::from_secs(10), || {
        let samples = exposition::parse(&http::scrape(&listen));
        let refused: f64 = exposition::sum(&samples, "cudatrace_libraries_refused_total", &[]);
        let attached: std::collections::BTreeSet<String> = exposition::select(
            &samples,
            "cudatrace_probe_attached",
            &[("symbol", "cuLaunchKernel")],
        )
        .iter()
        .map(|s| s.label("library").to_owned())
        .collect();
        (refused == 1.0).then_some((attached.len(), refused))
    });
    let traced = daemon.stop();
    for j in jobs {
        let _ = j.kill();
    }
    let _ = std::fs::remove_file(&dev);
    let said = traced
        .stderr
        .iter()
        .filter(|l| l.contains("distinct libraries are attached already (max_libraries)"))
        .count();
    eprintln!("e2e libraries_past_the_cap_are_refused_and_counted: 3 distinct libraries, max 2: (attached, refused) {counts:?}, lines {said}");
    assert_eq!(counts, Some((2, 1.0)), "{:?}", traced.stderr);
    assert_eq!(said, 1);
}

/// `--lib-allow` names the host's driver file: a process using it is traced; one using a copy of
/// the same bytes elsewhere (as a tenant's image would carry) is refused in one line and not
/// traced. A relative glob is one line and exit 1.
#[test]
fn lib_allow_attaches_only_the_hosts_files() {
    let Some(env) = env() else { return };
    let lib = env.libcuda();
    let dir = TempDir::new("allow");
    let copy = dir.copy(&lib, "fake/libcuda.so.1");
    let dev = device_file("allow");
    let listen = format!("127.0.0.1:{}", free_port());
    let allow = lib.display().to_string();
    let daemon = Cudatrace::start_daemon(&env, &["--listen", &listen, "--lib-allow", &allow], &[]);
    let basic = |lib: &std::path::Path| {
        Workload::new(
            &env,
            Scenario::Basic {
                launches: 300,
                copies: 0,
            },
        )
        .lib(lib)
        .device(&dev)
        .settle_ms(1500)
    };
    let (real, fake) = (basic(&lib).spawn(), basic(&copy).spawn());
    let (real, fake) = (real.finish(), fake.finish());
    let count = |pid: &serde_json::Value| -> f64 {
        let samples = exposition::parse(&http::scrape(&listen));
        let pid = pid.to_string();
        exposition::sum(
            &samples,
            "cudatrace_calls_total",
            &[("pid", &pid), ("api", "cuLaunchKernel")],
        )
    };
    let counted = integration_tests::poll(Duration::from_secs(5), || {
        Some(count(&real["pid"])).filter(|n| *n == 300.0)
    });
    let fake_counted = count(&fake["pid"]);
    let traced = daemon.stop();
    let _ = std::fs::remove_file(&dev);
    let refused = traced
        .stderr
        .iter()
        .filter(|l| l.contains(&copy.display().to_string()) && l.contains("--lib-allow"))
        .count();
    eprintln!("e2e lib_allow_attaches_only_the_hosts_files: allowed file in=300 counted={counted:?}; copy in=300 counted={fake_counted}; refusal lines {refused}");
    assert_eq!(
        (counted, fake_counted, refused),
        (Some(300.0), 0.0, 1),
        "{:?}",
        traced.stderr
    );
    let out = Command::new(&env.bin)
        .args(["trace", "--lib-allow", "libcuda.so.*"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        (out.status.code(), err.lines().count()),
        (Some(1), 1),
        "{err}"
    );
    assert!(err.contains("give an absolute path or glob"), "{err}");
}

/// The process that filled the ring buffer is named: with the daemon stopped, a process makes
/// 50,000 copies (one record each; launches would be counted in the kernel) into a 1 MiB ring
/// buffer; once resumed, every record lost is counted against that process.
#[test]
fn the_process_that_filled_the_ring_buffer_is_named() {
    let Some(env) = env() else { return };
    let dir = TempDir::new("ring");
    let config = dir.write("cudatrace.toml", "ringbuf_mib = 1\n");
    let (daemon, listen) =
        Cudatrace::start_daemon_on_loopback(&env, &["--config", config.to_str().unwrap()], &[]);
    let dev = device_file("ring");
    // SAFETY: plain kill(2) on the daemon's pid.
    unsafe { libc::kill(daemon.pid() as i32, libc::SIGSTOP) };
    let job = Workload::new(&env, Scenario::CopyCalls(50_000))
        .device(&dev)
        .run();
    // SAFETY: as above.
    unsafe { libc::kill(daemon.pid() as i32, libc::SIGCONT) };
    let pid = job["pid"].as_u64().unwrap().to_string();
    let figures = integration_tests::poll(Duration::from_secs(5), || {
        let samples = exposition::parse(&http::scrape(&listen));
        let total: f64 = exposition::sum(&samples, "cudatrace_events_dropped_total", &[]);
        let mine: f64 = exposition::sum(
            &samples,
            "cudatrace_events_dropped_by_process_total",
            &[("pid", &pid)],
        );
        let counted: f64 = exposition::sum(
            &samples,
            "cudatrace_calls_total",
            &[("pid", &pid), ("api", "cuMemcpyHtoD_v2")],
        );
        (total > 0.0 && mine == total).then_some((total, counted))
    });
    let traced = daemon.stop();
    let _ = std::fs::remove_file(&dev);
    eprintln!("e2e the_process_that_filled_the_ring_buffer_is_named: copies in=50000 (dropped, counted) {figures:?}");
    let (dropped, counted) =
        figures.unwrap_or_else(|| panic!("drops not attributed: {:?}", traced.stderr));
    assert!(
        dropped > 30_000.0 && counted > 0.0 && counted + dropped <= 50_004.0,
        "{dropped} {counted}"
    );
}

/// Two workloads in a container (own mount namespace and root) map their libcuda; then, inside that root, one
/// library is deleted and its path made an absolute symlink, and a tmpfs is mounted over the
/// other's folder with the same kind of symlink. The symlinks name a path where the HOST has a
/// libcuda of its own (and the container a different file). Discovery probes the container's
/// deleted file itself (read through /proc/PID/map_files, as root may) and refuses the other
/// (its path now leads to another inode than the one mapped); the host's file is never probed.
#[test]
fn absolute_symlinks_in_a_container_never_reach_host_files() {
    let Some(env) = env() else { return };
    let root = TempDir::new("rootfs");
    for d in ["usr", "standin", "old", "proc", "dev"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    for (link, to) in [
        ("lib", "usr/lib"),
        ("lib64", "usr/lib64"),
        ("bin", "usr/bin"),
    ] {
        std::os::unix::fs::symlink(to, root.join(link)).unwrap();
    }
    let decoy = format!("/tmp/cudatrace-decoy-{}", std::process::id());
    let deleted = root.copy(&env.libcuda(), "mnt/drv/libcuda.so.1");
    let covered = root.copy(&env.libcuda(), "mnt/ovr/libcuda.so.1");
    let inside_decoy = root.copy(&env.libcuda(), &format!("{}/libcuda.so.1", &decoy[1..]));
    let host = TempDir::new("host-decoy");
    let _ = std::fs::remove_dir_all(&decoy);
    std::os::unix::fs::symlink(host.path(), &decoy).unwrap();
    let host_decoy = host.copy(&env.libcuda(), "libcuda.so.1");
    use std::os::unix::fs::MetadataExt as _;
    let ino = |p: &std::path::Path| std::fs::metadata(p).unwrap().ino();
    let (deleted_ino, covered_ino, inside_ino, host_ino) = (
        ino(&deleted),
        ino(&covered),
        ino(&inside_decoy),
        ino(&host_decoy),
    );
    let r = root.path().display().to_string();
    // A container as runtimes make one: its own mount namespace, pivoted into its root.
    let script = format!(
        "exec 3<&0
         mount --bind {r} {r} && mount --bind /usr {r}/usr && mount --bind /dev {r}/dev && mount --bind {standin} {r}/standin && cd {r} && pivot_root . old || exit 1
         cd / && mount -t proc proc /proc && umount -l /old || exit 1
         /standin/cuda-workload --lib /mnt/drv/libcuda.so.1 --hold basic 300 0 <&3 & a=$!
         /standin/cuda-workload --lib /mnt/ovr/libcuda.so.1 --hold basic 200 0 <&3 & b=$!
         sleep 0.5
         rm /mnt/drv/libcuda.so.1 && ln -s {decoy}/libcuda.so.1 /mnt/drv/libcuda.so.1
         mount -t tmpfs none /mnt/ovr && ln -s {decoy}/libcuda.so.1 /mnt/ovr/libcuda.so.1
         echo \"$a $b\" > /swapped
         wait $a; wait $b",
        standin = env.standin.display(),
    );
    let mut container = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .env("CUDA_STANDIN_DEVICE", "/standin-device")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let pids = integration_tests::poll(Duration::from_secs(10), || {
        std::fs::read_to_string(root.join("swapped"))
            .ok()
            .filter(|s| s.ends_with('\n'))
    });
    let pids: Vec<u64> = pids
        .expect("the container set up")
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    let tracer = Cudatrace::start(&env, &["--json", "--rescan-ms", "100"]);
    drop(container.stdin.take());
    let out = container.wait_with_output().unwrap();
    let traced = tracer.stop();
    let _ = std::fs::remove_file(&decoy);
    let reports = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with('{'))
        .count();
    let launches = |pid: u64| {
        traced
            .of_pid(pid)
            .iter()
            .filter(|e| e["api"] == "cuLaunchKernel")
            .count()
    };
    let lines_with = |s: &str| {
        traced
            .stderr
            .iter()
            .filter(|l| l.contains(s))
            .cloned()
            .collect::<Vec<_>>()
    };
    let all = tracer_common::Api::ALL.len();
    let attached = lines_with(&format!("attached {all} of {all}"));
    let refused = lines_with(&format!(
        "inode {inside_ino} there, {covered_ino} in its maps"
    ));
    eprintln!(
        "e2e absolute_symlinks_in_a_container_never_reach_host_files: deleted file (inode {deleted_ino}) launches in=300 out={}; \
         covered file (inode {covered_ino}) launches in=200 out={}; attached {attached:?}; refused {refused:?}; host decoy inode {host_ino}",
        launches(pids[0]),
        launches(pids[1])
    );
    assert_eq!(
        reports,
        2,
        "both workloads ran: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(attached.len(), 1, "{:?}", traced.stderr);
    assert!(
        attached[0].contains(&format!("(inode {deleted_ino} on device")),
        "{}",
        attached[0]
    );
    assert!(
        attached[0].starts_with(&format!("/proc/{}/root/mnt/drv/libcuda.so.1:", pids[0])),
        "{}",
        attached[0]
    );
    assert_eq!(refused.len(), 1, "{:?}", traced.stderr);
    assert!(
        traced
            .stderr
            .iter()
            .all(|l| !l.contains(&format!("inode {host_ino} "))),
        "the host's file: {:?}",
        traced.stderr
    );
    assert_eq!((launches(pids[0]), launches(pids[1])), (300, 0));
}
