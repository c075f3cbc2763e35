//! End-to-end: a tenant flooding discovery (finding 4 of the third tenant review: 400 processes
//! of about 1,000 mappings, each opening a missing `libcuda.so.1` once a second, made the idle
//! daemon burn 866-876 ms of CPU a second re-reading their maps; past 4,096 waiting, opens were
//! dropped uncounted). Now each tenant (cgroup) has a share of the queue and the tenants take
//! turns, a process whose reads found nothing is left alone (1 s doubling to 60 s), and every
//! read is paid from a budget of 20 ms of CPU a second (100 ms at once); an open past a share is
//! counted and a full pass, paid from the same budget, reads every process.
use std::{
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use integration_tests::{
    cpu_seconds, device_file, env, exposition, free_port, guards::Cgroup, http, Cudatrace, Env,
    Scenario, Workload,
};

/// Keeps discovery off the loaders' hooks (which no open runs), on the open hook: the open
/// path's kprobe where the kernel has kprobes, else `sys_enter`.
const OPEN_HOOK: (&str, &str) = ("CUDATRACE_LOADER_SYMBOL", "no_such_symbol");

/// `n` processes of 1,000 mappings in `cgroup`, each opening a missing libcuda.so.1 once a
/// second for `secs` seconds.
fn flood(env: &Env, cgroup: &Path, n: u32, secs: u32) -> Child {
    let workload = env.workload();
    Command::new("sh")
        .arg("-c")
        .arg(format!(
            "echo $$ > {procs}; i=0; while [ $i -lt {n} ]; do {w} crowd 1000 {secs} 1000 & i=$((i+1)); done; wait",
            procs = cgroup.join("cgroup.procs").display(),
            w = workload.display(),
        ))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Processes in `cgroup` now.
fn members(cgroup: &Path) -> usize {
    std::fs::read_to_string(cgroup.join("cgroup.procs"))
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

/// Ends every process of the flood.
fn end(cgroup: &Path, mut shell: Child) {
    let _ = std::fs::write(cgroup.join("cgroup.kill"), "1");
    let _ = shell.wait();
    integration_tests::poll(Duration::from_secs(30), || {
        (members(cgroup) == 0).then_some(())
    });
}

fn counter(listen: &str, name: &str) -> f64 {
    exposition::sum(&exposition::parse(&http::scrape(listen)), name, &[])
}

#[test]
fn four_hundred_flooding_openers_cost_the_daemon_little() {
    let Some(env) = env() else { return };
    let listen = format!("127.0.0.1:{}", free_port());
    let daemon = Cudatrace::start_daemon(&env, &["--listen", &listen], &[OPEN_HOOK]);
    let cgroup = Cgroup::new("flood-400");
    let dev = device_file("flood400");
    let cpu = cpu_seconds(daemon.pid());
    let started = Instant::now();
    let shell = flood(&env, cgroup.path(), 400, 25);
    // A real job, in another tenant, in the middle of the flood.
    std::thread::sleep(Duration::from_secs(5));
    let launches = Scenario::Basic {
        launches: 3000,
        copies: 0,
    };
    let report = Workload::new(&env, launches)
        .device(&dev)
        .settle_ms(2000)
        .run();
    let pid = report["pid"].as_u64().unwrap().to_string();
    let counted = exposition::wait_for_launches(&listen, &pid, 3000.0, Duration::from_secs(10));
    std::thread::sleep(Duration::from_secs(20).saturating_sub(started.elapsed()));
    let seconds = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds(daemon.pid()) - cpu;
    let flooders = members(cgroup.path());
    let read = counter(&listen, "cudatrace_discovery_maps_read_total");
    let deferred = counter(&listen, "cudatrace_discovery_opens_deferred_total");
    let dropped = counter(&listen, "cudatrace_discovery_opens_dropped_total");
    end(cgroup.path(), shell);
    let traced = daemon.stop();
    let _ = std::fs::remove_file(&dev);
    let per_second_ms = cpu * 1000.0 / seconds;
    eprintln!(
        "e2e four_hundred_flooding_openers_cost_the_daemon_little: {flooders} processes in the flood's cgroup, \
         {seconds:.1} s: daemon CPU {:.0} ms ({per_second_ms:.1} ms/s), maps read {read}, opens deferred {deferred}, \
         dropped {dropped}; the job's launches in=3000 counted={counted:?}",
        cpu * 1000.0
    );
    assert!(flooders >= 400, "{flooders} flooders");
    assert!(per_second_ms <= 50.0, "{per_second_ms} ms of CPU a second");
    assert_eq!(counted, Some(3000.0), "{:?}", traced.stderr);
    assert!(deferred > 0.0, "quiet processes' opens are deferred");
    assert_eq!(traced.code, Some(0), "{:?}", traced.stderr);
}

#[test]
fn four_thousand_flooding_openers_hide_no_library_and_no_scrape() {
    let Some(env) = env() else { return };
    let listen = format!("127.0.0.1:{}", free_port());
    let daemon = Cudatrace::start_daemon(&env, &["--listen", &listen], &[OPEN_HOOK]);
    let cgroup = Cgroup::new("flood-4096");
    let dev = device_file("flood4096");
    let shell = flood(&env, cgroup.path(), 4096, 90);
    let all_in = integration_tests::poll(Duration::from_secs(60), || {
        (members(cgroup.path()) > 4096).then_some(())
    });
    // Every flooder has opened once, and again: the queue is full.
    std::thread::sleep(Duration::from_secs(3));
    let cpu = cpu_seconds(daemon.pid());
    let t = Instant::now();
    let launches = Scenario::Basic {
        launches: 2000,
        copies: 0,
    };
    let job = Workload::new(&env, launches)
        .device(&dev)
        .settle_ms(10_000)
        .spawn();
    let discovered = daemon
        .wait_event(Duration::from_secs(10), "discovered", |_| true)
        .map(|_| t.elapsed());
    let mut slowest = Duration::ZERO;
    for _ in 0..5 {
        let s = Instant::now();
        let body = http::scrape(&listen);
        slowest = slowest.max(s.elapsed());
        assert!(body.contains("cudatrace_discovery_opens_dropped_total"));
    }
    let report = job.finish();
    let pid = report["pid"].as_u64().unwrap().to_string();
    let counted = exposition::wait_for_launches(&listen, &pid, 2000.0, Duration::from_secs(10));
    let seconds = t.elapsed().as_secs_f64();
    let cpu = cpu_seconds(daemon.pid()) - cpu;
    let dropped = counter(&listen, "cudatrace_discovery_opens_dropped_total");
    let passes = counter(&listen, "cudatrace_discovery_full_passes_total");
    end(cgroup.path(), shell);
    let traced = daemon.stop();
    let _ = std::fs::remove_file(&dev);
    eprintln!(
        "e2e four_thousand_flooding_openers_hide_no_library_and_no_scrape: all in {all_in:?}; a new library \
         discovered after {discovered:?}; slowest of 5 scrapes {slowest:?}; opens dropped {dropped}, full passes \
         {passes}; daemon CPU {:.0} ms in {seconds:.1} s; the job's launches in=2000 counted={counted:?}",
        cpu * 1000.0
    );
    assert!(all_in.is_some(), "4,096 flooders started");
    assert!(
        discovered.is_some_and(|d| d < Duration::from_secs(10)),
        "{discovered:?}"
    );
    assert!(slowest < Duration::from_secs(2), "{slowest:?}");
    assert!(
        dropped > 0.0,
        "the flood's opens past its share are counted"
    );
    assert!(passes >= 2.0, "a full pass fell back: {passes}");
    assert_eq!(counted, Some(2000.0), "{:?}", traced.stderr);
    assert_eq!(traced.code, Some(0), "{:?}", traced.stderr);
}
