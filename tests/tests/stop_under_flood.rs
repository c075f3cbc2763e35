//! End-to-end: every command stops within a second of SIGTERM while records flood in (two
//! threads launching at full speed), and says what it saw. Before, `record`'s drain read until
//! the ring buffer was empty, which under a flood it never was: 21 s from SIGTERM to exit.
//! Output goes to files, read by nobody meanwhile: a reader slower than the flood would hold
//! the tracer in write(2), which is the reader's choice, not the tracer's.
use std::time::{Duration, Instant};

use std::process::{Command, Stdio};

use integration_tests::{device_file, env, guards::TempDir, Scenario, Workload};

#[test]
fn every_command_stops_within_a_second_of_sigterm_under_a_flood() {
    let Some(env) = env() else { return };
    let lib = env.libcuda();
    let lib = lib.to_str().unwrap();
    let dir = TempDir::new("flood-stop");
    let timeline = dir.join("timeline.json");
    let timeline = timeline.to_str().unwrap();
    let commands: [(&str, Vec<&str>, &str); 5] = [
        ("trace", vec!["--json", "--lib", lib], "summary"),
        (
            "run",
            vec!["--lib", lib, "--listen", "127.0.0.1:0"],
            "summary",
        ),
        (
            "record",
            vec!["-o", timeline, "--max-events", "100000", "--lib", lib],
            "summary",
        ),
        ("top", vec!["-b", "-d", "1", "--lib", lib], "summary"),
        ("census", vec!["--duration", "60", "--lib", lib], "census"),
    ];
    let dev = device_file("flood-stop");
    for (command, args, last) in commands {
        let (out, err) = (
            dir.join(&format!("{command}.out")),
            dir.join(&format!("{command}.err")),
        );
        let mut tracer = Command::new(&env.bin)
            .arg(command)
            .args(&args)
            .env("CUDATRACE_LOG_FORMAT", "json")
            .stdout(Stdio::from(std::fs::File::create(&out).unwrap()))
            .stderr(Stdio::from(std::fs::File::create(&err).unwrap()))
            .spawn()
            .unwrap();
        let text = |p: &std::path::Path| std::fs::read_to_string(p).unwrap_or_default();
        let ready = integration_tests::poll(Duration::from_secs(60), || {
            text(&err).contains("\"event\":\"ready\"").then_some(())
        });
        assert!(ready.is_some(), "{command} did not start: {}", text(&err));
        let flood = Workload::new(&env, Scenario::Calls(50_000_000))
            .threads(2)
            .device(&dev)
            .spawn();
        std::thread::sleep(Duration::from_secs(2));
        let asked = Instant::now();
        // SAFETY: plain kill(2) of our own child.
        unsafe { libc::kill(tracer.id() as i32, libc::SIGTERM) };
        let status = tracer.wait().unwrap();
        let took = asked.elapsed();
        drop(flood);
        let said = text(&err)
            .lines()
            .filter(|l| l.contains(&format!("\"event\":\"{last}\"")))
            .count();
        eprintln!(
            "e2e every_command_stops_within_a_second_of_sigterm_under_a_flood: {command}: exit {:?} {:.0} ms after SIGTERM; \
             its `{last}` line: {said}; {} bytes of output",
            status.code(),
            took.as_secs_f64() * 1e3,
            std::fs::metadata(&out).map(|m| m.len()).unwrap_or(0)
        );
        assert_eq!(status.code(), Some(0), "{command}: {}", text(&err));
        assert!(took < Duration::from_secs(1), "{command} took {took:?}");
        assert_eq!(said, 1, "{command} says what it saw");
    }
    let _ = std::fs::remove_file(&dev);
}
