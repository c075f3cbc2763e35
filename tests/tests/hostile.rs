//! End-to-end: what a tenant on the node controls cannot hang, exhaust or fool the agent: the
//! file at a mapped library's path, the sizes it asks copies for, the kernel names it looks up,
//! the command line it runs with. (How many libraries it maps, and where they lead:
//! `hostile_libraries.rs`.)
use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use integration_tests::{
    device_file, env, exposition, free_port,
    guards::{TempDir, Tmpfs},
    http, report, Cudatrace, Scenario, Workload,
};

fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .unwrap()
        .trim()
        .trim_end_matches(" kB")
        .trim()
        .parse()
        .unwrap();
    kb / 1024.0
}

/// Two processes map a libcuda; then a tmpfs is mounted over each one's folder, holding a FIFO
/// at the library's path for one and a symlink to /dev/zero for the other (the maps still name
/// the path). The daemon, discovering, opens neither for good: it becomes ready, says one line
/// for each, and keeps answering scrapes within 2 s with its memory under 100 MiB.
#[test]
fn a_fifo_or_dev_zero_at_a_library_path_neither_hangs_nor_exhausts() {
    let Some(env) = env() else { return };
    let dir = TempDir::new("hostile-libs");
    let (fifo, zero) = (
        dir.copy(&env.libcuda(), "fifo/libcuda.so.1"),
        dir.copy(&env.libcuda(), "zero/libcuda.so.1"),
    );
    let dev = device_file("hostile");
    // Both map their library, then sleep before their first call.
    let sleepy = |lib: &std::path::Path| {
        Workload::new(
            &env,
            Scenario::Basic {
                launches: 10,
                copies: 0,
            },
        )
        .lib(lib)
        .device(&dev)
        .settle_ms(60_000)
        .spawn()
    };
    let (_a, _b) = (sleepy(&fifo), sleepy(&zero));
    std::thread::sleep(Duration::from_millis(500));
    let _over_fifo = Tmpfs::over(fifo.parent().unwrap());
    let c_path = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: mkfifo with a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o644) }, 0, "mkfifo");
    let _over_zero = Tmpfs::over(zero.parent().unwrap());
    std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let started = Instant::now();
    let daemon = Cudatrace::start_daemon(&env, &["--listen", &listen], &[]);
    let ready_after = started.elapsed();
    let (mut slowest, mut rss) = (Duration::ZERO, 0f64);
    for _ in 0..6 {
        let t = Instant::now();
        let text = http::try_get(&format!("http://{listen}/metrics"), None);
        slowest = slowest.max(t.elapsed());
        assert!(text.is_ok(), "{text:?}");
        rss = rss.max(rss_mib(daemon.pid()));
        std::thread::sleep(Duration::from_millis(300));
    }
    let traced = daemon.stop();
    let refused = |p: &std::path::Path| {
        traced
            .stderr
            .iter()
            .filter(|l| l.contains(&p.display().to_string()) && l.contains("is not a regular file"))
            .count()
    };
    eprintln!(
        "e2e a_fifo_or_dev_zero_at_a_library_path_neither_hangs_nor_exhausts: ready after {:.0} ms, slowest scrape {:.0} ms, \
         RSS {rss:.1} MiB, refusals fifo={} zero={}",
        ready_after.as_secs_f64() * 1e3,
        slowest.as_secs_f64() * 1e3,
        refused(&fifo),
        refused(&zero)
    );
    assert!(
        slowest < Duration::from_secs(2),
        "a scrape took {slowest:?}"
    );
    assert!(rss < 100.0, "RSS {rss} MiB");
    assert_eq!(
        (refused(&fifo), refused(&zero)),
        (1, 1),
        "{:?}",
        traced.stderr
    );
    let _ = std::fs::remove_file(&dev);
}

/// Two copies of 2^63 bytes, refused by the library: errors counted, no byte counted.
#[test]
fn failed_huge_copies_add_no_bytes() {
    let Some(env) = env() else { return };
    let (daemon, listen) = Cudatrace::start_daemon_on_loopback(&env, &[], &[]);
    let dev = device_file("huge");
    let job = Workload::new(&env, Scenario::HugeCopies(2))
        .device(&dev)
        .run();
    assert_eq!(job["failed"], 2, "{job}");
    let pid = job["pid"].as_u64().unwrap().to_string();
    let sum = |name: &str| -> Option<f64> {
        let samples = exposition::parse(&http::scrape(&listen));
        let found =
            exposition::select(&samples, name, &[("pid", &pid), ("api", "cuMemcpyHtoD_v2")]);
        (!found.is_empty()).then(|| found.iter().map(|s| s.value).sum())
    };
    let errors = integration_tests::poll(Duration::from_secs(5), || {
        sum("cudatrace_call_errors_total").filter(|e| *e == 2.0)
    });
    let bytes = sum("cudatrace_memcpy_bytes_total");
    let _ = daemon.stop();
    let _ = std::fs::remove_file(&dev);
    eprintln!("e2e failed_huge_copies_add_no_bytes: copies of 2^63 bytes in=2 errors={errors:?} bytes={bytes:?}");
    assert_eq!((errors, bytes), (Some(2.0), Some(0.0)));
}

/// A token in a process's command line appears nowhere in `trace --json` output unless
/// `--cmdline` asks for command lines.
#[test]
fn command_lines_stay_private_unless_asked() {
    let Some(env) = env() else { return };
    let token = "tok3n-S3cr3t-9f2c";
    let lib = env.libcuda();
    let dev = device_file("token");
    for (flag, shown) in [(None, false), (Some("--cmdline"), true)] {
        let mut args = vec!["--json", "--lib", lib.to_str().unwrap()];
        args.extend(flag);
        let tracer = Cudatrace::start(&env, &args);
        // argv[0] carries the token; comm and exe stay the workload's. It runs for a second, so
        // that its identity is read while it lives.
        let script = format!(
            "exec -a 'cuda-workload --api-token={token}' {} --lib {} loop 1 1 1",
            env.workload().display(),
            lib.display()
        );
        let child = Command::new("bash")
            .args(["-c", &script])
            .env("CUDA_STANDIN_DEVICE", &dev)
            .env("CUDA_STANDIN_NS_PER_BLOCK", "1000000")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let job = report(child);
        let traced = tracer.stop();
        let pid = job["pid"].as_u64().unwrap();
        let events = traced.of_pid(pid);
        let everything = format!(
            "{:?}{}",
            traced.stderr,
            serde_json::to_string(&traced.events).unwrap()
        );
        eprintln!(
            "e2e command_lines_stay_private_unless_asked: {flag:?}: events={} token shown={}",
            events.len(),
            everything.contains(token)
        );
        let launches = events
            .iter()
            .filter(|e| e["api"] == "cuLaunchKernel")
            .count() as u64;
        assert_eq!(Some(launches), job["launches"].as_u64());
        assert_eq!(everything.contains(token), shown, "{flag:?}");
    }
    let _ = std::fs::remove_file(&dev);
}

/// A kernel looked up by a 234-byte name whose demangled form would be about 100 MB: the
/// daemon stays responsive and labels the launches with at most 1 KiB of it and a hash.
#[test]
fn a_demangling_bomb_gets_a_short_label() {
    let Some(env) = env() else { return };
    let (daemon, listen) = Cudatrace::start_daemon_on_loopback(&env, &[], &[]);
    let dev = device_file("bomb");
    let name = integration_tests::hostile::demangling_bomb(24);
    let job = Workload::new(&env, Scenario::Lookup(name.clone()))
        .device(&dev)
        .run();
    let pid = job["pid"].as_u64().unwrap().to_string();
    let label = integration_tests::poll(Duration::from_secs(5), || {
        let t = Instant::now();
        let samples = exposition::parse(&http::scrape(&listen));
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "a scrape took {:?}",
            t.elapsed()
        );
        exposition::select(
            &samples,
            "cudatrace_calls_total",
            &[("pid", &pid), ("api", "cuLaunchKernel")],
        )
        .first()
        .map(|s| s.label("kernel").to_owned())
    });
    let traced = daemon.stop();
    let _ = std::fs::remove_file(&dev);
    let label = label.unwrap_or_else(|| panic!("no launch series: {:?}", traced.stderr));
    eprintln!(
        "e2e a_demangling_bomb_gets_a_short_label: name {} bytes, label {} bytes",
        name.len(),
        label.len()
    );
    assert_eq!(name.len(), 234);
    // Cut at 1 KiB (`...`), then ` #` and the hash of the whole name, so that two bombs that
    // print alike for 1 KiB still get two labels.
    let (cut, hash) = label.split_at(label.len() - 18);
    assert!(
        cut.len() <= 1024 && cut.ends_with("...") && cut.starts_with("f(A, A<A, A>"),
        "{label}"
    );
    assert!(
        hash.starts_with(" #") && hash[2..].chars().all(|c| c.is_ascii_hexdigit()),
        "{label}"
    );
    assert_eq!(traced.code, Some(0));
}

/// A process whose main thread calls `pthread_exit` while another thread keeps launching is
/// still one traced process: its count rises from scrape to scrape, and ends at exactly the
/// launches it made.
#[test]
fn a_headless_process_stays_traced() {
    let Some(env) = env() else { return };
    let (daemon, listen) = Cudatrace::start_daemon_on_loopback(&env, &[], &[]);
    let dev = device_file("headless");
    // 1 ms kernels, a wait after each: about 1,000 launches a second for 3 s.
    let job = Workload::new(&env, Scenario::Headless(3.0))
        .device(&dev)
        .var("CUDA_STANDIN_NS_PER_BLOCK", "1000000")
        .spawn();
    let pid = job.pid().to_string();
    let launches = || -> f64 {
        let samples = exposition::parse(&http::scrape(&listen));
        exposition::sum(
            &samples,
            "cudatrace_calls_total",
            &[("pid", &pid), ("api", "cuLaunchKernel")],
        )
    };
    let mut seen = Vec::new();
    for _ in 0..3 {
        std::thread::sleep(Duration::from_millis(800));
        seen.push(launches());
    }
    let report = job.finish();
    let want = report["launches"].as_f64().unwrap();
    let total = integration_tests::poll(Duration::from_secs(5), || {
        Some(launches()).filter(|n| *n == want)
    });
    let traced = daemon.stop();
    let _ = std::fs::remove_file(&dev);
    eprintln!("e2e a_headless_process_stays_traced: counts while running {seen:?}, launches in={want} counted={total:?}");
    assert!(
        seen[0] > 0.0 && seen[0] < seen[1] && seen[1] < seen[2],
        "{seen:?}"
    );
    assert_eq!(total, Some(want), "{:?}", traced.stderr);
}

/// 150,000 launches of made-up kernel handles fill the launch map (131,072 cells; the process's
/// quota raised to all of them): every launch is still counted once (the cells, and a full
/// record for each launch past them), the kernel
/// labels stay within `top_kernels` plus `other`, and while the tenant holds its cells the
/// daemon, reading them in batches every 500 ms and before each scrape, answers every scrape
/// within 2 s and uses under half a core.
#[test]
fn a_flood_of_kernel_handles_is_counted_exactly() {
    let Some(env) = env() else { return };
    let dir = TempDir::new("flood");
    let config = dir.write("cudatrace.toml", "[launches]\ncells_per_process = 131072\n");
    let (daemon, listen) =
        Cudatrace::start_daemon_on_loopback(&env, &["--config", config.to_str().unwrap()], &[]);
    let agent = daemon.pid();
    let job = Workload::new(
        &env,
        Scenario::Handles {
            launches: 150_000,
            hold_s: 12.0,
        },
    )
    .spawn();
    let pid = job.pid().to_string();
    let launches = || -> (f64, usize) {
        let samples = exposition::parse(&http::scrape(&listen));
        let mine = exposition::select(
            &samples,
            "cudatrace_calls_total",
            &[("pid", &pid), ("api", "cuLaunchKernel")],
        );
        (
            mine.iter().map(|s| s.value).sum(),
            mine.iter()
                .map(|s| s.label("kernel"))
                .collect::<std::collections::HashSet<_>>()
                .len(),
        )
    };
    let counted = integration_tests::poll(Duration::from_secs(20), || {
        Some(launches()).filter(|(n, _)| *n == 150_000.0)
    });
    // The cells stay while the tenant lives: the agent's CPU over 5 s of that.
    // Meanwhile scrapes (each one reads every cell first) answer: the slowest of ten, 0.5 s apart.
    let (before, t0) = (integration_tests::cpu_seconds(agent), Instant::now());
    let mut slowest = Duration::ZERO;
    for _ in 0..10 {
        let asked = Instant::now();
        assert!(http::scrape(&listen).contains("cudatrace_events_total"));
        slowest = slowest.max(asked.elapsed());
        std::thread::sleep(Duration::from_millis(500));
    }
    let share = (integration_tests::cpu_seconds(agent) - before) / t0.elapsed().as_secs_f64();
    let report = job.finish();
    let traced = daemon.stop();
    let summary = traced.summary();
    eprintln!(
        "e2e a_flood_of_kernel_handles_is_counted_exactly: launches in={} counted (launches, kernel labels)={counted:?}; \
         launches_counted={} launch_samples={} events={} dropped={}; agent CPU while the 131,072 cells stayed: {:.1}% of a core; \
         slowest of 10 scrapes meanwhile: {slowest:?}",
        report["launches"], summary["launches_counted"], summary["launch_samples"], summary["events"], summary["dropped"], share * 100.0
    );
    let (n, labels) =
        counted.unwrap_or_else(|| panic!("not all 150,000 launches counted: {:?}", launches()));
    assert_eq!(n, 150_000.0);
    assert!(labels <= 21, "{labels} kernel labels");
    assert_eq!(
        summary["launches_counted"], 131_072,
        "the map holds 131,072 cells"
    );
    assert_eq!(summary["dropped"], 0);
    assert!(
        share < 0.5,
        "the agent used {:.0}% of a core reading the cells",
        share * 100.0
    );
    assert!(
        slowest < Duration::from_secs(2),
        "a scrape took {slowest:?}"
    );
}

/// 2,000 idle connections to the metrics port do not keep another client's scrape out: it
/// answers within 1 s. A connection that sends half a request is closed once the header timeout (5 s)
/// has passed.
#[test]
fn idle_connections_do_not_block_a_scrape() {
    use std::io::{Read as _, Write as _};
    let Some(env) = env() else { return };
    let (daemon, listen) = Cudatrace::start_daemon_on_loopback(&env, &[], &[]);
    let idle: Vec<std::net::TcpStream> = (0..2000)
        .map(|_| std::net::TcpStream::connect(&listen).expect("connect"))
        .collect();
    // Other clients (another loopback address each): the idle ones hold their own client's
    // share of the port (64 connections), not the others'.
    let mut slow = http::connect_from(&listen, "127.0.0.3").unwrap();
    slow.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    let opened = Instant::now();
    let t = Instant::now();
    let text = http::scrape_from(&listen, "127.0.0.2", None).map(|r| r.1);
    let scrape = t.elapsed();
    slow.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut buf = [0u8; 1];
    let closed = slow.read(&mut buf);
    let closed_after = opened.elapsed();
    drop(idle);
    let traced = daemon.stop();
    eprintln!(
        "e2e idle_connections_do_not_block_a_scrape: 2000 idle connections, scrape answered in {:.1} ms; half a request closed after {:.1} s ({closed:?})",
        scrape.as_secs_f64() * 1e3,
        closed_after.as_secs_f64()
    );
    assert!(
        text.is_ok_and(|t| t.contains("cudatrace_events_total")),
        "scrape failed"
    );
    assert!(scrape < Duration::from_secs(1), "{scrape:?}");
    assert!(
        matches!(closed, Ok(0)),
        "the half request's connection was not closed: {closed:?}"
    );
    assert!(
        (Duration::from_secs(4)..Duration::from_secs(8)).contains(&closed_after),
        "{closed_after:?}"
    );
    assert_eq!(traced.code, Some(0));
}

/// With `record_rate_limit = 1000` and every launch written as a record (`[launches] aggregate
/// = false`), a process making 5,000 launches in well under a second gets exactly 1,000 records
/// through, and every other record is counted as rate-limited, for it; a quieter process beside
/// it loses nothing. (Counted in the kernel, launches are not records: `launches.rs`.)
#[test]
fn a_record_rate_limit_caps_one_process_and_counts_the_rest() {
    let Some(env) = env() else { return };
    let dir = TempDir::new("rate-limit");
    let config = dir.write(
        "cudatrace.toml",
        "record_rate_limit = 1000\n[launches]\naggregate = false\n",
    );
    let (daemon, listen) =
        Cudatrace::start_daemon_on_loopback(&env, &["--config", config.to_str().unwrap()], &[]);
    let dev = device_file("rate");
    // Short simulated kernels: the final wait returns within the same one-second window.
    let job = |launches| {
        Workload::new(
            &env,
            Scenario::Basic {
                launches,
                copies: 0,
            },
        )
        .device(&dev)
        .var("CUDA_STANDIN_NS_PER_BLOCK", "1")
        .run()
    };
    let (quiet, loud) = (job(300), job(5000));
    let (q, l) = (
        quiet["pid"].as_u64().unwrap().to_string(),
        loud["pid"].as_u64().unwrap().to_string(),
    );
    let totals = integration_tests::poll(Duration::from_secs(10), || {
        let samples = exposition::parse(&http::scrape(&listen));
        let calls = |pid: &str| exposition::sum(&samples, "cudatrace_calls_total", &[("pid", pid)]);
        let limited = exposition::sum(
            &samples,
            "cudatrace_events_dropped_by_process_total",
            &[("pid", &l), ("reason", "rate_limit")],
        );
        let all_limited = exposition::sum(
            &samples,
            "cudatrace_events_dropped_total",
            &[("reason", "rate_limit")],
        );
        let launches = exposition::sum(
            &samples,
            "cudatrace_calls_total",
            &[("pid", &q), ("api", "cuLaunchKernel")],
        );
        (calls(&l) == 1000.0 && launches == 300.0).then_some((
            calls(&q),
            calls(&l),
            limited,
            all_limited,
        ))
    });
    let traced = daemon.stop();
    let _ = std::fs::remove_file(&dev);
    eprintln!(
        "e2e a_record_rate_limit_caps_one_process_and_counts_the_rest: limit 1000/s; (quiet calls, loud calls, loud rate-limited, all rate-limited) = {totals:?}"
    );
    let (quiet_calls, loud_calls, limited, all_limited) = totals.expect("counts settled");
    // The loud process made the quiet one's calls plus 4,700 more launches.
    assert_eq!(loud_calls + limited, quiet_calls + 4700.0);
    assert_eq!((loud_calls, all_limited), (1000.0, limited));
    assert_eq!(
        traced.summary()["rate_limited"] as f64,
        limited,
        "{:?}",
        traced.stderr
    );
}
