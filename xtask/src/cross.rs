//! `--arch`: cudatrace and the stand-ins for another architecture, built on this host. x86-64
//! builds as always (stable); aarch64 (Grace) builds with Debian's cross toolchain
//! (gcc-aarch64-linux-gnu, libc6-dev-arm64-cross) and the nightly's `-Z build-std`, whose
//! standard library comes from its rust-src where rustup cannot fetch the target's. The eBPF
//! object inside the binary is built by tracer-user's build script for the target's
//! architecture (aya-build sets `bpf_target_arch` from it).
use std::{env, path::PathBuf, process::Command};

use anyhow::{bail, Context as _, Result};

use crate::{cargo, root, run, target_dir};

/// An architecture cudatrace is built for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Arch {
    /// x86-64 (amd64).
    #[value(name = "x86_64", alias = "amd64")]
    X86_64,
    /// 64-bit Arm (arm64): NVIDIA Grace hosts.
    #[value(name = "aarch64", alias = "arm64")]
    Aarch64,
}

impl Arch {
    /// The architecture of this host.
    pub fn host() -> Arch {
        if cfg!(target_arch = "aarch64") {
            Arch::Aarch64
        } else {
            Arch::X86_64
        }
    }

    /// Rust's target triple.
    pub fn triple(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64-unknown-linux-gnu",
            Arch::Aarch64 => "aarch64-unknown-linux-gnu",
        }
    }

    /// Debian's (and OCI's) name: amd64, arm64.
    pub fn debian(self) -> &'static str {
        match self {
            Arch::X86_64 => "amd64",
            Arch::Aarch64 => "arm64",
        }
    }

    /// The GNU tool prefix of the cross toolchain (and the multiarch folder name).
    pub fn gnu(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64-linux-gnu",
            Arch::Aarch64 => "aarch64-linux-gnu",
        }
    }

    /// The C compiler for this architecture: `cc` on the host, else the cross gcc.
    pub fn cc(self) -> String {
        if self == Arch::host() {
            env::var("CC").unwrap_or_else(|_| "cc".into())
        } else {
            format!("{}-gcc", self.gnu())
        }
    }

    /// The folder its build lands in: target/ for the host, target/TRIPLE/ for another.
    pub fn out_dir(self) -> PathBuf {
        if self == Arch::host() {
            target_dir()
        } else {
            target_dir().join(self.triple())
        }
    }

    /// The release `cudatrace` of this architecture.
    pub fn binary(self) -> PathBuf {
        self.out_dir().join("release/cudatrace")
    }

    /// Where glibc's files for this architecture are on this host (the loader, libc, libm,
    /// libgcc_s), for an image or an initramfs.
    pub fn sysroot_lib(self) -> PathBuf {
        if self == Arch::host() {
            PathBuf::from("/lib").join(self.gnu())
        } else {
            PathBuf::from("/usr").join(self.gnu()).join("lib")
        }
    }
}

/// Says what to install when the cross C compiler is missing.
fn need_cross_gcc(arch: Arch) -> Result<()> {
    let cc = arch.cc();
    let found = Command::new(&cc)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        bail!(
            "{cc} not found: install Debian's gcc-{}-linux-gnu and libc6-dev-{}-cross \
             (scripts/setup.sh does), then run again",
            arch.gnu().trim_end_matches("-linux-gnu"),
            arch.debian()
        );
    }
    Ok(())
}

/// Builds the release `cudatrace` for `arch`; returns its path.
pub fn build_cudatrace(arch: Arch) -> Result<PathBuf> {
    if arch == Arch::host() {
        run(cargo()
            .current_dir(root())
            .args(["build", "--release", "--package", "tracer-user"]))?;
        return Ok(arch.binary());
    }
    need_cross_gcc(arch)?;
    let triple_env = arch.triple().replace('-', "_");
    let nightly = env::var("CUDATRACE_EBPF_TOOLCHAIN").unwrap_or_else(|_| "nightly".into());
    // rustup's cargo for the nightly, as the eBPF build uses: its own rust-src builds std.
    run(Command::new("rustup")
        .current_dir(root())
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("CARGO")
        .env_remove("RUSTC")
        .env(
            format!("CARGO_TARGET_{}_LINKER", triple_env.to_uppercase()),
            arch.cc(),
        )
        .env(format!("CC_{triple_env}"), arch.cc())
        .env(format!("AR_{triple_env}"), format!("{}-ar", arch.gnu()))
        .env("CARGO_TARGET_DIR", target_dir())
        .args(["run", &nightly, "cargo", "build", "--release"])
        .args(["--package", "tracer-user", "--target", arch.triple()])
        .args(["-Z", "build-std=std,panic_abort"]))?;
    Ok(arch.binary())
}

/// Builds cudatrace and the stand-ins for `arch`; returns the stand-ins' folder.
pub fn build(arch: Arch) -> Result<PathBuf> {
    build_cudatrace(arch)?;
    crate::build_standin(arch)
}

/// The shared libraries `binaries` load, transitively, for `arch`: (file on this host, absolute
/// path inside the image or initramfs). Read from the ELF files themselves (`readelf`: their
/// interpreter and NEEDED entries), so that it works for a foreign architecture, where `ldd`
/// cannot run the loader. Libraries land in /lib/GNU-TRIPLE, where Debian's loader looks.
pub fn runtime_libraries(arch: Arch, binaries: &[PathBuf]) -> Result<Vec<(PathBuf, PathBuf)>> {
    let libdir = arch.sysroot_lib();
    let mut out: Vec<(PathBuf, PathBuf)> = Vec::new();
    let mut todo: Vec<PathBuf> = binaries.to_vec();
    while let Some(file) = todo.pop() {
        let text = readelf(&file)?;
        for line in text.lines() {
            let line = line.trim();
            let (host, inside) =
                if let Some(rest) = line.strip_prefix("[Requesting program interpreter: ") {
                    let interp = PathBuf::from(rest.trim_end_matches(']'));
                    let name = interp.file_name().context("interpreter has a name")?;
                    (libdir.join(name), interp)
                } else if let Some(i) = line.find("(NEEDED)") {
                    let name = line[i..]
                        .split('[')
                        .nth(1)
                        .and_then(|s| s.split(']').next())
                        .context("NEEDED entry has a name")?;
                    (
                        libdir.join(name),
                        PathBuf::from("/lib").join(arch.gnu()).join(name),
                    )
                } else {
                    continue;
                };
            if out.iter().any(|(_, d)| *d == inside) {
                continue;
            }
            if !host.exists() {
                bail!(
                    "{} needs {}, not found in {}: install Debian's libc6-dev-{}-cross",
                    file.display(),
                    host.display(),
                    libdir.display(),
                    arch.debian()
                );
            }
            todo.push(host.clone());
            out.push((host, inside));
        }
    }
    out.sort();
    Ok(out)
}

/// `readelf -ldW FILE` (binutils reads any architecture's ELF).
fn readelf(file: &std::path::Path) -> Result<String> {
    let out = Command::new("readelf")
        .args(["-l", "-d", "-W"])
        .arg(file)
        .output()
        .context("readelf (binutils) is needed")?;
    if !out.status.success() {
        bail!(
            "readelf {} failed: {}",
            file.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Copies `binaries`' libraries into `rootfs` at their paths (symlinks resolved).
pub fn copy_libraries(arch: Arch, binaries: &[PathBuf], rootfs: &std::path::Path) -> Result<usize> {
    let libs = runtime_libraries(arch, binaries)?;
    for (host, inside) in &libs {
        let real = std::fs::canonicalize(host)
            .with_context(|| format!("cannot resolve {}", host.display()))?;
        let dest = rootfs.join(inside.strip_prefix("/").unwrap_or(inside));
        std::fs::create_dir_all(dest.parent().context("library has a folder")?)?;
        std::fs::copy(&real, &dest).with_context(|| format!("cannot copy {}", real.display()))?;
    }
    Ok(libs.len())
}
