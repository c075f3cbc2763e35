//! End-to-end: what a tenant (or a careless operator) can do to the files cudatrace writes and
//! reads back: a symlink at `record -o` planted by another user, a FIFO at the archive's path,
//! escape sequences in an archived incident, a huge archive, credentials bound for plain http.
//! Each is bounded here: the file a symlink points at stays as it was, nothing hangs, nothing
//! raw reaches the terminal, memory stays under a bound, and nothing is sent in the clear.
use std::{
    os::unix::fs::{MetadataExt as _, PermissionsExt as _},
    process::Command,
    time::{Duration, Instant},
};

use integration_tests::{env, free_port, guards::TempDir};

/// Runs `cmd` to its end; its exit code, stdout, stderr and the peak resident memory (VmHWM,
/// KiB) seen while it ran, read every few milliseconds (a child's `ru_maxrss` would count the
/// memory of this test process it was forked from).
fn run_measured(cmd: &mut Command) -> (Option<i32>, String, String, i64) {
    use std::io::Read as _;
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("cudatrace starts");
    let drain = |mut pipe: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            text
        })
    };
    let stdout = drain(Box::new(child.stdout.take().unwrap()));
    let stderr = drain(Box::new(child.stderr.take().unwrap()));
    let status_file = format!("/proc/{}/status", child.id());
    let mut peak = 0i64;
    let status = loop {
        if let Some(hwm) = std::fs::read_to_string(&status_file).ok().and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<i64>().ok())
        }) {
            peak = peak.max(hwm);
        }
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    (
        status.code(),
        stdout.join().unwrap(),
        stderr.join().unwrap(),
        peak,
    )
}

/// One archived incident whose names carry terminal escapes, as a tenant would name its process.
fn hostile_incident(ended_at: &str, pid: u64) -> String {
    serde_json::json!({
        "alert": "CudatraceComputeContention\u{1b}[2J",
        "ended_at": ended_at,
        "duration_s": 30.0,
        "victim": {"pid": pid, "comm": "victim\u{1b}]0;owned\u{7}"},
        "gpu": "0\u{1b}[31m",
        "root_cause": "evil\u{1b}[2J (pid 7) took 90% of GPU 0\r\n",
        "aggressors": [{"pid": 7, "comm": "evil\u{1b}[2J"}],
    })
    .to_string()
}

/// A symlink that another user plants at the path `record -o` will write (a root-owned 0600
/// file at its end) is refused: one line, exit 1, the file untouched. A FIFO at the archive's
/// path is refused at once instead of hanging `run` before `ready`.
#[test]
fn planted_symlinks_and_fifos_are_refused_without_harm() {
    let Some(env) = env() else { return };
    let dir = TempDir::new("hostile-files");
    let secret = dir.write("secret", "root's own\n");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let link = dir.join("trace.json");
    std::os::unix::fs::symlink(&secret, &link).unwrap();
    let lib = env.libcuda();
    let out = Command::new(&env.bin)
        .args(["record", "-o"])
        .arg(&link)
        .args(["--duration", "1", "--lib"])
        .arg(&lib)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    eprintln!(
        "e2e planted_symlinks_and_fifos_are_refused_without_harm: record -o symlink: exit {:?}: {}",
        out.status.code(),
        err.trim()
    );
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("is a symlink"), "{err}");
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "root's own\n");
    let m = std::fs::metadata(&secret).unwrap();
    assert_eq!((m.mode() & 0o777, m.uid()), (0o600, 0));

    let fifo = dir.join("incidents.jsonl");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo with a valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let config = dir.write(
        "config.toml",
        &format!("[alerts]\narchive = {:?}\n", fifo.display().to_string()),
    );
    let started = Instant::now();
    let out = Command::new(&env.bin)
        .args(["run", "--config"])
        .arg(&config)
        .args(["--listen", &format!("127.0.0.1:{}", free_port())])
        .args(["--duration", "1", "--lib"])
        .arg(&lib)
        .output()
        .unwrap();
    let took = started.elapsed();
    let err = String::from_utf8_lossy(&out.stderr);
    eprintln!(
        "e2e planted_symlinks_and_fifos_are_refused_without_harm: archive FIFO: exit {:?} in {took:?}: {}",
        out.status.code(),
        err.trim()
    );
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("is a FIFO") && err.contains("[alerts] archive"),
        "{err}"
    );
    assert!(took < Duration::from_secs(5), "took {took:?}");
}

/// Every field `incidents` prints is escaped: a tenant's escape sequences in an archived
/// incident never reach the terminal raw; `--json` keeps them as JSON escapes.
#[test]
fn incidents_print_no_raw_escape_sequence() {
    let Some(env) = env() else { return };
    let dir = TempDir::new("hostile-incidents");
    let archive = dir.write(
        "incidents.jsonl",
        &(hostile_incident("2026-12-01T10:00:00Z", 42) + "\n"),
    );
    let out = Command::new(&env.bin)
        .args(["incidents", "--archive"])
        .arg(&archive)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!(
        "e2e incidents_print_no_raw_escape_sequence: {}",
        text.trim()
    );
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(text.lines().count(), 2, "a header and one incident: {text}");
    assert!(
        !text.chars().any(|c| c.is_control() && c != '\n'),
        "a raw control character: {text:?}"
    );
    assert!(
        text.contains("victim\\u{1b}]0;owned\\u{7} (pid 42)"),
        "{text}"
    );
    let json = Command::new(&env.bin)
        .args(["incidents", "--json", "--archive"])
        .arg(&archive)
        .output()
        .unwrap();
    let json = String::from_utf8_lossy(&json.stdout);
    assert!(
        !json.chars().any(|c| c.is_control() && c != '\n'),
        "{json:?}"
    );
    let v: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
    assert_eq!(v["victim"]["pid"], 42);
}

/// A 64 MiB archive and a 64 MiB rotated one: `incidents` shows the newest within a window of
/// lines and says how many older ones it left out, in bounded memory (the whole archive was
/// held before: 1.0 GB measured).
#[test]
fn a_huge_archive_is_read_in_bounded_memory() {
    let Some(env) = env() else { return };
    let dir = TempDir::new("huge-archive");
    let line = hostile_incident("2026-12-01T10:00:00Z", 1);
    let per_file = (64 << 20) / (line.len() + 1);
    let old: String = (0..per_file)
        .map(|i| hostile_incident("2026-12-01T10:00:00Z", i as u64) + "\n")
        .collect();
    let newest_pid = 10_000_000 + per_file as u64 - 1;
    let new: String = (0..per_file)
        .map(|i| hostile_incident("2026-12-02T10:00:00Z", 10_000_000 + i as u64) + "\n")
        .collect();
    let archive = dir.write("incidents.jsonl", &new);
    dir.write("incidents.jsonl.1", &old);
    drop((old, new));
    let started = Instant::now();
    let (code, stdout, stderr, rss_kib) = run_measured(
        Command::new(&env.bin)
            .args(["incidents", "--json", "--archive"])
            .arg(&archive),
    );
    let took = started.elapsed();
    let shown = stdout.lines().count();
    let first: serde_json::Value = serde_json::from_str(stdout.lines().next().unwrap()).unwrap();
    eprintln!(
        "e2e a_huge_archive_is_read_in_bounded_memory: 2 x 64 MiB ({} incidents): exit {code:?}, \
         {shown} shown, peak RSS {} MiB, {took:?}; {}",
        2 * per_file,
        rss_kib / 1024,
        stderr.trim()
    );
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(shown, 10_000);
    assert_eq!(
        first["victim"]["pid"].as_u64(),
        Some(newest_pid),
        "newest first"
    );
    assert!(
        stderr.contains(&format!("{} older incidents", 2 * per_file - 10_000)),
        "{stderr}"
    );
    assert!(rss_kib < 128 * 1024, "peak RSS {rss_kib} KiB");
}

/// Credentials bound for a plain http sink (from the config, or the command line's
/// `--alertmanager`) are refused before anything is attached: one line, exit 1.
#[test]
fn credentials_are_never_sent_in_the_clear() {
    let Some(env) = env() else { return };
    let dir = TempDir::new("clear-credentials");
    let password = dir.write("password", "s3cret\n");
    let config = dir.write(
        "config.toml",
        &format!(
            "[alerts.alertmanager_auth]\nusername = \"cudatrace\"\npassword_file = {:?}\n",
            password.display().to_string()
        ),
    );
    let out = Command::new(&env.bin)
        .args(["run", "--config"])
        .arg(&config)
        .args(["--alertmanager", "http://127.0.0.1:9/"])
        .args(["--listen", &format!("127.0.0.1:{}", free_port())])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    eprintln!(
        "e2e credentials_are_never_sent_in_the_clear: exit {:?}: {}",
        out.status.code(),
        err.trim()
    );
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("would be sent in the clear") && err.contains("insecure_http_credentials"),
        "{err}"
    );
}
