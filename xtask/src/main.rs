//! Project tasks: `cargo xtask build | standin | demo | test | bench`.
mod bench;
mod cross;
mod demo;
mod fuzz;
mod image;
mod layers;
mod standin;
mod vm;

use std::{
    env,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _, Result};
use clap::{Parser, Subcommand};

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Build cudatrace (eBPF programs included) and the stand-in libraries and workload.
    Build {
        /// For this architecture (aarch64: cross-built, into target/aarch64-unknown-linux-gnu).
        #[arg(long, value_enum, default_value_t = cross::Arch::host())]
        arch: cross::Arch,
    },
    /// Build only the stand-in libcuda.so.1 and the workload, into target/standin.
    Standin,
    /// Build everything, then trace the bundled workload against the stand-in libcuda, and show
    /// `top -b` while a trainer slows a model server on one simulated GPU.
    Demo,
    /// Run the unit tests, then the privileged end-to-end tests (root or CAP_BPF needed).
    Test {
        /// Only end-to-end tests whose name contains this.
        filter: Option<String>,
    },
    /// Measure tracing overhead against the floor and bpftrace, throughput, and memory at scale.
    Bench,
    /// Build the container images for amd64 and arm64 and the manifest list
    /// `localhost/cudatrace:latest` with buildah, from local files only.
    Image,
    /// Boot an emulated kernel of another architecture (qemu, Debian's kernel) and run
    /// cudatrace's checks inside it: `N passed, M failed`.
    VmTest {
        /// The kernel's architecture.
        #[arg(long, value_enum, default_value_t = cross::Arch::Aarch64)]
        arch: cross::Arch,
    },
    /// Run every fuzz target (cargo-fuzz, nightly) for SECONDS each (default 60).
    Fuzz {
        /// Seconds per target.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
    },
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask sits in the workspace")
        .to_path_buf()
}

fn target_dir() -> PathBuf {
    env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"))
}

fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("cannot run {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

fn cargo() -> Command {
    Command::new(env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// Compiles the stand-in libraries and the workload (C, with the real CUDA prototypes) for
/// `arch`, into OUT/standin (target/standin for the host).
fn build_standin(arch: cross::Arch) -> Result<PathBuf> {
    let src = root().join("tests/standin");
    let out = arch.out_dir().join("standin");
    std::fs::create_dir_all(&out)?;
    let cc = arch.cc();
    let common = [
        "-O2",
        "-g",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-fno-omit-frame-pointer",
    ];
    // -fno-ipa-icf: entry points with identical bodies must stay separate functions, as in
    // NVIDIA's library, or one probe would see the calls of two symbols.
    let shared = ["-fPIC", "-shared", "-fvisibility=hidden", "-fno-ipa-icf"];
    let mut libs: Vec<(&str, &str, &str, &[&str])> = vec![
        ("libcuda", "libcuda.so.1", "libcuda.so.1", &[]),
        ("libpartial", "libpartial.so", "libpartial.so", &[]),
        ("libnvml", "libnvidia-ml.so.1", "libnvidia-ml.so.1", &[]),
    ];
    // On aarch64 also a libcuda whose functions begin with `bti c` (and sign their return
    // address), as with the branch protection Arm distributions' compilers turn on.
    if arch == cross::Arch::Aarch64 {
        let bti: &[&str] = &["-mbranch-protection=standard"];
        libs.push(("libcuda", "libcuda-bti.so.1", "libcuda.so.1", bti));
    }
    for (lib, file, soname, extra) in libs {
        run(Command::new(&cc)
            .args(common)
            .args(shared)
            .args(extra)
            .arg(format!("-Wl,-soname,{soname}"))
            .arg("-o")
            .arg(out.join(file))
            .arg(src.join(format!("{lib}.c")))
            .args(["-ldl", "-lpthread"]))?;
    }
    run(Command::new(&cc)
        .args(common)
        .arg("-o")
        .arg(out.join("cuda-workload"))
        .arg(src.join("workload.c"))
        .arg(src.join("workload_each.c"))
        .arg(src.join("workload_serving.c"))
        .arg(src.join("workload_misc.c"))
        .arg(src.join("workload_harm.c"))
        .arg(src.join("workload_sized.c"))
        .arg(src.join("workload_devices.c"))
        .arg(src.join("harm_thunk.S"))
        .args(["-ldl", "-lpthread"]))?;
    Ok(out)
}

/// Builds cudatrace and the stand-ins for this host; returns the stand-ins' folder.
pub(crate) fn build() -> Result<PathBuf> {
    cross::build(cross::Arch::host())
}

fn test(filter: Option<String>) -> Result<()> {
    // Formatting and lints first: the cheapest failures.
    run(cargo()
        .current_dir(root())
        .args(["fmt", "--all", "--", "--check"]))?;
    run(cargo().current_dir(root()).args([
        "clippy",
        "--workspace",
        "--exclude",
        "tracer-ebpf",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    // The eBPF programs, with the nightly that builds them, for their own target, as built for
    // each architecture's calling convention (`bpf_target_arch`).
    let nightly = env::var("CUDATRACE_EBPF_TOOLCHAIN").unwrap_or_else(|_| "nightly".into());
    for (arch, dir) in [
        ("x86_64", "ebpf-clippy"),
        ("aarch64", "ebpf-clippy-aarch64"),
    ] {
        run(Command::new("rustup")
            .current_dir(root().join("tracer-ebpf"))
            .env_remove("RUSTUP_TOOLCHAIN")
            .env_remove("CARGO")
            .env_remove("RUSTC")
            .env("AYA_BPF_TARGET_ARCH", arch)
            .args(["run", &nightly, "cargo", "clippy"])
            .args(["--target", "bpfel-unknown-none", "-Z", "build-std=core"])
            .arg("--target-dir")
            .arg(target_dir().join(dir))
            .args(["--", "-D", "warnings"]))?;
    }
    // Unit tests beside the code (the eBPF crate is no_std and has none on the host).
    run(cargo().current_dir(root()).args([
        "test",
        "--release",
        "--workspace",
        "--exclude",
        "tracer-ebpf",
        "--exclude",
        "integration-tests",
    ]))?;
    // The Prometheus rules shipped in deploy/, against their promtool unit tests.
    let rules = root().join("deploy/prometheus");
    run(Command::new("promtool")
        .current_dir(&rules)
        .args(["check", "rules", "rules.yml"]))?;
    run(Command::new("promtool")
        .current_dir(&rules)
        .args(["test", "rules", "rules_test.yml"]))?;
    // The Alertmanager route shipped beside them (its grouping is checked end to end in
    // tests/tests/dashboard.rs).
    run(Command::new("amtool")
        .current_dir(root())
        .args(["check-config", "deploy/alertmanager/alertmanager.yml"]))?;
    // Each tier reaches its receiver: page the pager, critical on-call, warning the tickets.
    for (severity, receiver) in [
        ("page", "gpu-paging"),
        ("critical", "gpu-oncall"),
        ("warning", "gpu-tickets"),
    ] {
        run(Command::new("amtool").current_dir(root()).args([
            "config",
            "routes",
            "test",
            "--config.file=deploy/alertmanager/alertmanager.yml",
            &format!("--verify.receivers={receiver}"),
            &format!("severity={severity}"),
            "alertname=CudatraceComputeContention",
        ]))?;
    }
    // The Helm chart's own checks (its rendered objects are validated against the Kubernetes
    // schemas by the chart tests in the integration-tests crate).
    run(Command::new("helm").current_dir(root()).args([
        "lint",
        "--strict",
        "deploy/helm/cudatrace",
    ]))?;
    // The parsers of what tenants control, fuzzed briefly (`cargo xtask fuzz` runs longer).
    fuzz::run(&root(), &target_dir(), 10)?;
    let standin = build()?;
    // The other architecture, cross-built and run in its own emulated kernel (Grace hosts).
    if cross::Arch::host() == cross::Arch::X86_64 && filter.is_none() {
        vm::test(cross::Arch::Aarch64)?;
    }
    // The container images (a manifest list of both architectures), for the test that runs the
    // host's under podman.
    image::build(&root(), false)?;
    // End-to-end: one test at a time, since every tracer sees every process's calls and the
    // simulated device is shared.
    let mut cmd = cargo();
    cmd.current_dir(root())
        .args(["test", "--release", "--package", "integration-tests", "--"])
        .args(["--test-threads=1", "--nocapture"])
        .env("CUDATRACE_STANDIN_DIR", &standin)
        .env("CUDATRACE_BIN", target_dir().join("release/cudatrace"));
    if let Some(f) = filter {
        cmd.arg(f);
    }
    run(&mut cmd)
}

fn main() -> Result<()> {
    match Cli::parse().task {
        Task::Build { arch } => cross::build(arch).map(|_| ()),
        Task::Standin => build_standin(cross::Arch::host()).map(|_| ()),
        Task::Demo => demo::run(),
        Task::Test { filter } => test(filter),
        Task::Image => image::build(&root(), true).map(|_| ()),
        Task::VmTest { arch } => vm::test(arch),
        Task::Fuzz { seconds } => fuzz::run(&root(), &target_dir(), seconds),
        Task::Bench => {
            let standin = build()?;
            bench::run(&root(), target_dir().join("release/cudatrace"), standin)
        }
    }
}
