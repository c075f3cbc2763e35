//! Running the cudatrace image under podman as the DaemonSet runs it: host pid namespace, every
//! capability dropped but the DaemonSet's, no privilege escalation, read-only root filesystem.
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::guards::TempDir;

/// The image `cargo xtask image` builds.
pub const IMAGE: &str = "localhost/cudatrace:latest";

/// The runtime's default seccomp profile (containers-common), where podman keeps it.
pub const DEFAULT_SECCOMP: &str = "/usr/share/containers/seccomp.json";

/// The default seccomp profile plus `bpf` for CAP_BPF and `perf_event_open` for CAP_PERFMON
/// (the profile podman 4.3 ships allows both only with CAP_SYS_ADMIN), written into `dir`.
pub fn seccomp_with_bpf(dir: &TempDir) -> PathBuf {
    dir.write("seccomp.json", &seccomp_with_bpf_text())
}

/// The text of that profile.
pub fn seccomp_with_bpf_text() -> String {
    let text = std::fs::read_to_string(DEFAULT_SECCOMP).unwrap_or_else(|e| {
        panic!("cannot read {DEFAULT_SECCOMP} ({e}): podman's containers-common is needed")
    });
    let mut profile: Value =
        serde_json::from_str(&text).expect("the default seccomp profile is JSON");
    let syscalls = profile["syscalls"].as_array_mut().expect("a syscalls list");
    // The entry that denies them without CAP_SYS_ADMIN would still apply: take them out of it.
    for entry in syscalls
        .iter_mut()
        .filter(|e| e["action"] == "SCMP_ACT_ERRNO")
    {
        if let Some(names) = entry["names"].as_array_mut() {
            names.retain(|n| n != "bpf" && n != "perf_event_open");
        }
    }
    for (name, cap) in [("bpf", "CAP_BPF"), ("perf_event_open", "CAP_PERFMON")] {
        syscalls.push(
            json!({"names": [name], "action": "SCMP_ACT_ALLOW", "includes": {"caps": [cap]}}),
        );
    }
    serde_json::to_string_pretty(&profile).expect("JSON")
}

/// `podman run` arguments for the image with `caps` (Kubernetes names: `BPF`, ...) and the
/// seccomp profile at `seccomp`. runc, since crun refuses this host's hybrid cgroup layout;
/// file and process limits lowered, since raising them needs CAP_SYS_RESOURCE, which the
/// tests' bounding set lacks.
pub fn podman_run(caps: &[String], seccomp: &Path, name: &str) -> Vec<String> {
    let mut args: Vec<String> = [
        "--runtime",
        "runc",
        "run",
        "--rm",
        "--name",
        name,
        "--pid=host",
        "--network=host",
        "--user",
        "0",
    ]
    .map(String::from)
    .to_vec();
    args.push("--cap-drop=ALL".into());
    args.push(format!("--cap-add={}", caps.join(",")));
    args.extend([
        "--read-only".into(),
        "--security-opt".into(),
        "no-new-privileges".into(),
    ]);
    args.extend([
        "--security-opt".into(),
        format!("seccomp={}", seccomp.display()),
    ]);
    args.extend(
        [
            "--ulimit",
            "nofile=4096:4096",
            "--ulimit",
            "nproc=4096:4096",
        ]
        .map(String::from),
    );
    args.push(IMAGE.into());
    args
}
