//! End-to-end: `cudatrace top -b` prints plain-text snapshots of the daemon's aggregation: the
//! workload's row, named, with its launch rate.
use integration_tests::{Cudatrace, Scenario, Workload, device_file, env};

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
    let top = Cudatrace::try_start_command(&env, "top", &["-b", "-n", "6", "-d", "1", "--lib", lib.to_str().unwrap()], &[])
        .unwrap_or_else(|t| panic!("top did not start: {:?}", t.stderr));
    let dev = device_file("top");
    let report = Workload::new(&env, Scenario::Loop { seconds: 5.0, grid: 1, sync_every: 10 }).device(&dev).run();
    let traced = top.wait();
    let _ = std::fs::remove_file(&dev);
    assert_eq!(traced.code, Some(0), "{:?}", traced.stderr);
    let pid = report["pid"].as_u64().unwrap().to_string();
    let workload_rate = report["launches"].as_f64().unwrap() / 5.0;
    let shown = screens(&traced.stdout);
    let row = |screen: &[&str]| -> Option<Vec<String>> {
        screen.iter().find(|l| l.split_whitespace().next() == Some(pid.as_str())).map(|l| l.split_whitespace().map(str::to_owned).collect())
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
    assert!((rate - workload_rate).abs() <= 0.2 * workload_rate, "top {rate} against {workload_rate}");
    // p50 and p99 of launch latency in microseconds, p50 first.
    let (p50, p99): (f64, f64) = (third[5].parse().unwrap(), third[6].parse().unwrap());
    assert!(p50 > 0.0 && p50 <= p99, "{third:?}");
}
