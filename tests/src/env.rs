//! What the tests run: the binaries `cargo xtask test` built, and whether BPF is available.
use std::path::PathBuf;

use tracer_common::caps::{can_trace, effective_from_status};

/// Paths of what the tests run.
pub struct Env {
    /// The cudatrace binary.
    pub bin: PathBuf,
    /// Folder with libcuda.so.1, libpartial.so, libnvidia-ml.so.1 and cuda-workload.
    pub standin: PathBuf,
}

impl Env {
    /// The stand-in libcuda.
    pub fn libcuda(&self) -> PathBuf {
        self.standin.join("libcuda.so.1")
    }

    /// The stand-in NVML.
    pub fn libnvml(&self) -> PathBuf {
        self.standin.join("libnvidia-ml.so.1")
    }

    /// The workload binary.
    pub fn workload(&self) -> PathBuf {
        self.standin.join("cuda-workload")
    }
}

fn has_bpf_privileges() -> Result<(), String> {
    let status = std::fs::read_to_string("/proc/self/status").map_err(|e| e.to_string())?;
    let caps = effective_from_status(&status).ok_or("no CapEff in /proc/self/status")?;
    if can_trace(caps) {
        Ok(())
    } else {
        Err(format!("capabilities {caps:#x} lack CAP_BPF/CAP_PERFMON"))
    }
}

/// The test environment, or `None` (after saying why) when BPF is not available outside CI.
/// Under `CI=true` a missing privilege fails the test: CI runs as root and must run these.
pub fn env() -> Option<Env> {
    let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
    if let Err(why) = has_bpf_privileges() {
        if ci {
            panic!("CI=true but BPF is not available to the tests: {why}");
        }
        eprintln!("SKIPPED: privileged end-to-end test needs root or CAP_BPF+CAP_PERFMON ({why})");
        return None;
    }
    let var = |name: &str| {
        std::env::var_os(name)
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                panic!("{name} is not set: run the end-to-end tests with `cargo xtask test`")
            })
    };
    Some(Env {
        bin: var("CUDATRACE_BIN"),
        standin: var("CUDATRACE_STANDIN_DIR"),
    })
}

/// A unique shared-device file, so that each test has its own simulated GPU.
pub fn device_file(name: &str) -> String {
    let path = format!("/dev/shm/cudatrace-test-{}-{name}", std::process::id());
    let _ = std::fs::remove_file(&path);
    path
}
