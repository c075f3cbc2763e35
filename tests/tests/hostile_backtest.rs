//! End-to-end: `cudatrace backtest` does not trust the Prometheus it reads (finding 7 of the
//! third tenant review: 256 MiB an answer, about 500 answers, points after `--to` kept, and the
//! series of one pid on two instances shared one replay slot). A fake Prometheus answers four
//! ways: one answer of 40 MiB, answers adding up to 3 million points, 3 million points all after
//! `--to`, and one pid on two instances. The first two are refused in one line each with exit 1,
//! the third is dropped and replays nothing, the fourth replays two processes; the peak memory
//! of every run stays bounded.
use std::process::Command;

use integration_tests::{env, free_port};

/// The fake Prometheus: answers every `query_range` as `mode` says.
const SERVER: &str = r#"
import http.server, json, sys, urllib.parse
mode, port = sys.argv[1], int(sys.argv[2])
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        q = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
        start, end, step = (int(float(q[k][0])) for k in ("start", "end", "step"))
        to = int(sys.argv[3])
        if mode == "huge":
            body = b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{"signal":"wait_per_launch","pid":"1"},"values":[' + b'[1,"1"],' * (40 << 20 >> 3) + b'[1,"1"]]}]}}'
        else:
            series = []
            n = 2 if mode == "instances" else 100
            for s in range(n):
                if mode == "after":
                    times = range(to + step, to + step * 10001, step)
                else:
                    times = range(start, end + 1, step)
                value = lambda k: "0.001"
                if mode == "instances" and s == 1:
                    value = lambda k: "0.05" if k > 300 else "0.001"
                labels = {"__name__": "cudatrace_signal_value", "signal": "wait_per_launch",
                          "pid": "7" if mode == "instances" else str(s), "comm": "server",
                          "workload": "serving/w%d" % s, "instance": "node-%d" % s}
                series.append({"metric": labels, "values": [[t, value((t - int(sys.argv[4])) // step)] for t in times]})
            body = json.dumps({"status": "success", "data": {"resultType": "matrix", "result": series}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
http.server.ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
"#;

/// Runs a backtest against the fake server in `mode` over `steps` minutes: exit code, stdout,
/// stderr, and the run's peak RSS (KiB, from the kernel's rusage of children).
fn run(bin: &std::path::Path, mode: &str, steps: u64) -> (Option<i32>, String, String, u64) {
    let port = free_port();
    let from: u64 = 1_760_000_000 / 60 * 60;
    let to = from + (steps - 1) * 60;
    let mut server = Command::new("python3")
        .args([
            "-c",
            SERVER,
            mode,
            &port.to_string(),
            &to.to_string(),
            &from.to_string(),
        ])
        .spawn()
        .unwrap();
    integration_tests::poll(std::time::Duration::from_secs(10), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).ok()
    })
    .expect("the fake Prometheus listens");
    let rfc = |t: u64| {
        humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_secs(t))
            .to_string()
    };
    // Python reads the child's peak RSS once it exited.
    let wrapper = "import resource, subprocess, sys\np = subprocess.run(sys.argv[1:], capture_output=True)\nsys.stdout.buffer.write(p.stdout)\nsys.stderr.buffer.write(p.stderr)\nsys.stderr.write('\\nPEAK %d\\n' % resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\nsys.exit(p.returncode)\n";
    let out = Command::new("python3")
        .args(["-c", wrapper])
        .arg(bin)
        .args([
            "backtest",
            "--prometheus",
            &format!("http://127.0.0.1:{port}"),
        ])
        .args(["--from", &rfc(from), "--to", &rfc(to), "--step", "60"])
        .output()
        .unwrap();
    let _ = server.kill();
    let _ = server.wait();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let peak = stderr
        .lines()
        .find_map(|l| l.strip_prefix("PEAK "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let stderr = stderr
        .lines()
        .filter(|l| !l.starts_with("PEAK ") && !l.is_empty())
        .collect::<Vec<_>>()
        .join("\n");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr,
        peak,
    )
}

#[test]
fn a_hostile_prometheus_is_refused_within_bounds() {
    let Some(env) = env() else { return };
    let huge = run(&env.bin, "huge", 100);
    let points = run(&env.bin, "points", 30_000);
    let after = run(&env.bin, "after", 30_000);
    let instances = run(&env.bin, "instances", 600);
    for (name, r) in [
        ("huge", &huge),
        ("points", &points),
        ("after", &after),
        ("instances", &instances),
    ] {
        eprintln!(
            "e2e a_hostile_prometheus_is_refused_within_bounds: {name}: exit {:?}, peak RSS {} MiB: {}",
            r.0,
            r.3 / 1024,
            r.2.lines().last().unwrap_or("")
        );
    }
    assert_eq!(huge.0, Some(1), "{}", huge.2);
    assert!(
        huge.2.contains("reading the answer") && huge.2.contains("at most 32 MiB"),
        "{}",
        huge.2
    );
    assert_eq!(huge.2.lines().count(), 1, "{}", huge.2);
    assert_eq!(points.0, Some(1), "{}", points.2);
    assert!(
        points.2.contains("more than 2000000 points"),
        "{}",
        points.2
    );
    assert_eq!(points.2.lines().count(), 1, "{}", points.2);
    assert_eq!(after.0, Some(0), "{}", after.2);
    assert!(
        after.2.contains("backtest: 100 series (100 processes"),
        "{}",
        after.2
    );
    assert!(
        after.1.is_empty(),
        "nothing replayed from after --to: {}",
        after.1
    );
    assert_eq!(instances.0, Some(0), "{}", instances.2);
    assert!(
        instances.2.contains("backtest: 2 series (2 processes"),
        "{}",
        instances.2
    );
    // The spiking instance's process fired, under its own pid label; the steady one did not.
    let fired: Vec<serde_json::Value> = instances
        .1
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .filter(|v: &serde_json::Value| v["state"] == "firing")
        .collect();
    assert!(!fired.is_empty(), "{}", instances.1);
    assert!(
        fired
            .iter()
            .all(|v| v["victim"]["pid"] == 7 && v["victim"]["workload"] == "serving/w1"),
        "{fired:?}"
    );
    for r in [&huge, &points, &after, &instances] {
        assert!(r.3 < 512 * 1024, "peak RSS {} KiB", r.3);
    }
}
