//! End-to-end: `cudatrace top -b` prints plain-text snapshots of the daemon's aggregation: the
//! workload's row, named, with its launch rate.
use integration_tests::{device_file, env, Cudatrace, Scenario, Workload};

/// The screens of `top -b` output: each starts with its `cudatrace top -` line.
fn screens(lines: &[String]) -> Vec<Vec<&str>> {
    let mut out: Vec<Vec<&str>> = Vec::new();
    for l in lines {
        if l.starts_with("cudatrace top - ") {
            out.push(Vec::new());
        }
        if let Some(s) = out.last_mut() {
            s.push(l);
        }
    }
    out
}

/// `top -b -n 6 -d 1` around a 5-second launch loop (traced all along): 6 screens, each with the header, the NVML
/// line and the column header; the workload's row names it, and its launch rate in the third
/// screen is within 20% of the rate the workload reports.
#[test]
fn top_batch_prints_the_workloads_row_and_rate() {
    let Some(env) = env() else { return };
    let lib = env.libcuda();
    let top = Cudatrace::try_start_command(
        &env,
        "top",
        &["-b", "-n", "6", "-d", "1", "--lib", lib.to_str().unwrap()],
        &[],
    )
    .unwrap_or_else(|t| panic!("top did not start: {:?}", t.stderr));
    let dev = device_file("top");
    let report = Workload::new(
        &env,
        Scenario::Loop {
            seconds: 5.0,
            grid: 1,
            sync_every: 10,
        },
    )
    .device(&dev)
    .run();
    let traced = top.wait();
    let _ = std::fs::remove_file(&dev);
    assert_eq!(traced.code, Some(0), "{:?}", traced.stderr);
    let pid = report["pid"].as_u64().unwrap().to_string();
    let workload_rate = report["launches"].as_f64().unwrap() / 5.0;
    let shown = screens(&traced.stdout);
    let row = |screen: &[&str]| -> Option<Vec<String>> {
        screen
            .iter()
            .find(|l| l.split_whitespace().next() == Some(pid.as_str()))
            .map(|l| l.split_whitespace().map(str::to_owned).collect())
    };
    let third = row(&shown[2]).unwrap_or_else(|| panic!("no row for {pid}: {:?}", shown[2]));
    let rate: f64 = third[4].parse().expect("LAUNCH/S");
    eprintln!("e2e top_batch_prints_the_workloads_row_and_rate: workload {workload_rate:.0} launches/s, top {rate:.0}; row {third:?}");
    assert_eq!(shown.len(), 6);
    for s in &shown {
        assert!(s[1].starts_with("NVML not available"), "{s:?}");
        assert!(s[2].trim_start().starts_with("PID COMM"), "{s:?}");
    }
    assert_eq!(third[1], "cuda-workload");
    assert!(
        (rate - workload_rate).abs() <= 0.2 * workload_rate,
        "top {rate} against {workload_rate}"
    );
    // p50 and p99 of launch latency in microseconds, p50 first.
    let (p50, p99): (f64, f64) = (third[5].parse().unwrap(), third[6].parse().unwrap());
    assert!(p50 > 0.0 && p50 <= p99, "{third:?}");
}

/// `cudatrace top` in a tmux pane of a given size; the pane stays after it exits, so that what
/// the terminal shows then can be read too.
struct Pane {
    name: String,
}

impl Pane {
    fn start(env: &integration_tests::Env, cols: u16, rows: u16, extra: &str) -> Pane {
        let name = format!("cudatrace-top-{}-{cols}x{rows}", std::process::id());
        let cmd = format!(
            "{} top --lib {} {extra}; sleep 120",
            env.bin.display(),
            env.libcuda().display()
        );
        let ok = std::process::Command::new("tmux")
            .args([
                "new-session",
                "-d",
                "-s",
                &name,
                "-x",
                &cols.to_string(),
                "-y",
                &rows.to_string(),
                &cmd,
            ])
            .status()
            .expect("tmux (scripts/setup.sh installs it)")
            .success();
        assert!(ok, "tmux new-session failed");
        let pane = Pane { name };
        integration_tests::poll(std::time::Duration::from_secs(30), || {
            pane.screen().contains("cudatrace top -").then_some(())
        })
        .unwrap_or_else(|| panic!("top did not draw: {}", pane.screen()));
        pane
    }

    fn screen(&self) -> String {
        let out = std::process::Command::new("tmux")
            .args(["capture-pane", "-p", "-t", &self.name])
            .output()
            .expect("tmux");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn keys(&self, keys: &[&str]) {
        for k in keys {
            std::process::Command::new("tmux")
                .args(["send-keys", "-t", &self.name, k])
                .status()
                .expect("tmux");
        }
        std::thread::sleep(std::time::Duration::from_millis(400));
    }

    /// The row of `pid`, split on whitespace.
    fn row(&self, pid: &str) -> Option<Vec<String>> {
        self.screen()
            .lines()
            .find(|l| l.split_whitespace().next() == Some(pid))
            .map(|l| l.split_whitespace().map(str::to_owned).collect())
    }

    /// The pids of the table's rows, top to bottom.
    fn pids(&self) -> Vec<String> {
        self.screen()
            .lines()
            .filter_map(|l| {
                l.split_whitespace()
                    .next()
                    .filter(|f| f.parse::<u32>().is_ok())
                    .map(str::to_owned)
            })
            .collect()
    }
}

impl Drop for Pane {
    fn drop(&mut self) {
        let _ = std::process::Command::new("tmux")
            .args(["kill-session", "-t", &self.name])
            .status();
        integration_tests::wait_for_background_detach();
    }
}

/// The interactive screen at 120x40 and at 80x24: two launch loops (one waiting after every
/// launch, one every 100) show as rows with their names and launch rates within 20% of what
/// each reports; the busier sorts first, `r` reverses the order; a filter that matches nothing
/// empties the table and Esc brings it back; `q` quits and gives the terminal back (the summary
/// line is on the restored screen).
#[test]
fn top_screen_sorts_filters_and_quits_cleanly() {
    let Some(env) = env() else { return };
    for (cols, rows) in [(120u16, 40u16), (80, 24)] {
        let pane = Pane::start(&env, cols, rows, "");
        let dev = device_file("top-screen");
        let slow = Workload::new(
            &env,
            Scenario::Loop {
                seconds: 4.0,
                grid: 1,
                sync_every: 1,
            },
        )
        .device(&dev)
        .spawn();
        let fast = Workload::new(
            &env,
            Scenario::Loop {
                seconds: 4.0,
                grid: 1,
                sync_every: 100,
            },
        )
        .device(&dev)
        .spawn();
        let (s, f) = (slow.pid().to_string(), fast.pid().to_string());
        std::thread::sleep(std::time::Duration::from_millis(2500));
        let (slow_row, fast_row) = (pane.row(&s), pane.row(&f));
        let order = pane.pids();
        pane.keys(&["r"]);
        let reversed = pane.pids();
        pane.keys(&["/", "n", "o", "m", "a", "t", "c", "h", "Enter"]);
        let filtered = pane.pids();
        pane.keys(&["Escape"]);
        let unfiltered = pane.pids();
        let (slow_report, fast_report) = (slow.finish(), fast.finish());
        pane.keys(&["q"]);
        let after = integration_tests::poll(std::time::Duration::from_secs(20), || {
            let screen = pane.screen();
            screen.contains("summary:").then_some(screen)
        });
        let _ = std::fs::remove_file(&dev);
        let rate = |report: &serde_json::Value| report["launches"].as_f64().unwrap() / 4.0;
        eprintln!(
            "e2e top_screen_sorts_filters_and_quits_cleanly {cols}x{rows}: slow {:.0}/s row {slow_row:?}; fast {:.0}/s row {fast_row:?}; \
             order {order:?} reversed {reversed:?} filtered {filtered:?} unfiltered {unfiltered:?}",
            rate(&slow_report),
            rate(&fast_report)
        );
        for (row, report) in [(&slow_row, &slow_report), (&fast_row, &fast_report)] {
            let row = row.as_ref().expect("the workload's row");
            assert_eq!(row[1], "cuda-workload");
            let shown: f64 = row[2]
                .parse()
                .expect("LAUNCH/S is the third column on every width");
            assert!(
                (shown - rate(report)).abs() <= 0.2 * rate(report),
                "{shown} against {}",
                rate(report)
            );
        }
        assert_eq!(order, vec![f.clone(), s.clone()], "busiest first");
        assert_eq!(reversed, vec![s.clone(), f.clone()]);
        assert!(filtered.is_empty(), "{filtered:?}");
        assert_eq!(unfiltered.len(), 2);
        let after = after.expect("top quit and printed its summary");
        assert!(
            !after.contains("q quit"),
            "the alternate screen is gone: {after}"
        );
    }
}

/// A model server alone, then a trainer on the same simulated GPU: on the interactive screen
/// (200x40), the model server's row shows the firing compute-contention alert naming the
/// trainer, and (filtered to it) Enter opens its detail pane with its kernel, its stream and
/// that alert.
#[test]
fn top_screen_shows_the_victims_firing_alert() {
    let Some(env) = env() else { return };
    let dir = integration_tests::guards::TempDir::new("top-alert");
    let config = dir.write("fast.toml", integration_tests::FAST_DETECTION);
    let pane = Pane::start(&env, 200, 40, &format!("--config {}", config.display()));
    let dev = device_file("top-alert");
    let vars = [
        ("CUDA_STANDIN_NS_PER_BLOCK", "1000"),
        ("CUDA_VISIBLE_DEVICES", "0"),
    ];
    let server = Workload::new(
        &env,
        Scenario::Loop {
            seconds: 40.0,
            grid: 1000,
            sync_every: 1,
        },
    )
    .comm("model-server")
    .device(&dev)
    .vars(&vars)
    .spawn();
    std::thread::sleep(std::time::Duration::from_secs(8));
    let trainer = Workload::new(
        &env,
        Scenario::Loop {
            seconds: 30.0,
            grid: 4000,
            sync_every: 2,
        },
    )
    .comm("trainer")
    .device(&dev)
    .vars(&vars)
    .spawn();
    let (sp, tp) = (server.pid().to_string(), trainer.pid().to_string());
    let row = integration_tests::poll(std::time::Duration::from_secs(40), || {
        pane.screen()
            .lines()
            .find(|l| l.split_whitespace().next() == Some(sp.as_str()) && l.contains("firing:"))
            .map(str::to_owned)
    });
    // Only the model server's row, then its detail pane.
    pane.keys(&["/", "m", "o", "d", "e", "l", "Enter", "Enter"]);
    let detail = pane.screen();
    drop((server, trainer));
    drop(pane);
    let _ = std::fs::remove_file(&dev);
    eprintln!("e2e top_screen_shows_the_victims_firing_alert: victim row {row:?}");
    let row = row.unwrap_or_else(|| panic!("no firing alert on the model server's row:\n{detail}"));
    assert!(row.contains("model-server"), "{row}");
    assert!(
        row.contains(&format!("firing:compute_contention by trainer (pid {tp})")),
        "{row}"
    );
    assert!(
        detail.contains(&format!(" pid {sp} "))
            && detail.contains("hidden_gemm(float*, float*, int)"),
        "{detail}"
    );
    assert!(
        detail.contains("CudatraceComputeContention firing"),
        "{detail}"
    );
    assert!(
        detail.contains("streams: batches")
            && detail
                .lines()
                .any(|l| l.contains(" batches, ") && l.contains("wait ")),
        "{detail}"
    );
}
