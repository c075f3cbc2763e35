//! `cargo xtask image`: the container images, assembled from local files (no registry is
//! needed or reached): for amd64 and arm64, the release binary of that architecture and the
//! shared libraries it loads, at their paths, in an empty base, built with buildah from
//! deploy/container/Containerfile; then a manifest list naming both, which is what the chart's
//! image reference resolves to on either kind of node.
use std::{path::Path, process::Command};

use anyhow::{bail, Context as _, Result};

use crate::cross::{self, Arch};

/// The manifest list's name (the host's image runs under it too).
pub const IMAGE: &str = integration_tests::container::IMAGE;

/// The architectures the manifest list holds.
pub const ARCHES: [Arch; 2] = [Arch::X86_64, Arch::Aarch64];

/// One architecture's image name.
pub fn arch_image(arch: Arch) -> String {
    format!("{IMAGE}-{}", arch.debian())
}

fn buildah(args: &[&str]) -> Result<()> {
    let status = Command::new("buildah")
        .args(args)
        .status()
        .context("buildah (Debian package) is needed: scripts/setup.sh installs it")?;
    if !status.success() {
        bail!("buildah {} failed: {status}", args.join(" "));
    }
    Ok(())
}

/// Lays out one architecture's build context and builds its image.
fn build_one(root: &Path, arch: Arch) -> Result<usize> {
    let binary = arch.binary();
    let context = arch.out_dir().join("release/image-context");
    let rootfs = context.join("rootfs");
    let _ = std::fs::remove_dir_all(&context);
    std::fs::create_dir_all(rootfs.join("usr/bin"))?;
    std::fs::copy(&binary, rootfs.join("usr/bin/cudatrace"))
        .with_context(|| format!("cannot copy {}", binary.display()))?;
    let libs = cross::copy_libraries(arch, std::slice::from_ref(&binary), &rootfs)?;
    std::fs::copy(
        root.join("deploy/container/Containerfile"),
        context.join("Containerfile"),
    )?;
    let file = context.join("Containerfile");
    let (file, context) = (
        file.to_str().context("UTF-8 path")?,
        context.to_str().context("UTF-8 path")?,
    );
    let name = arch_image(arch);
    // The previous build of this name goes, rather than staying on as an unnamed image.
    let _ = Command::new("buildah").args(["rmi", "-f", &name]).output();
    buildah(&[
        "bud",
        "--quiet",
        "--layers=false",
        "--arch",
        arch.debian(),
        "--os",
        "linux",
        "-t",
        &name,
        "-f",
        file,
        context,
    ])?;
    Ok(libs)
}

/// Builds both architectures' binaries (when `build` is set; else the host's must exist and the
/// other's is built), their images, and the manifest list; returns the list's name.
pub fn build(root: &Path, build: bool) -> Result<&'static str> {
    let mut said = Vec::new();
    for arch in ARCHES {
        if build || arch != Arch::host() {
            cross::build_cudatrace(arch)?;
        }
        let libs = build_one(root, arch)?;
        said.push(format!("{} ({libs} libraries)", arch_image(arch)));
    }
    // The list replaces any older one (or an image) of the same name.
    let _ = Command::new("buildah")
        .args(["manifest", "rm", IMAGE])
        .output();
    let _ = Command::new("buildah").args(["rmi", "-f", IMAGE]).output();
    buildah(&["manifest", "create", IMAGE])?;
    for arch in ARCHES {
        let name = format!("containers-storage:{}", arch_image(arch));
        buildah(&[
            "manifest",
            "add",
            "--arch",
            arch.debian(),
            "--os",
            "linux",
            IMAGE,
            &name,
        ])?;
    }
    // The runtime's default seccomp profile with bpf(2) for CAP_BPF, for runtimes whose default
    // allows it only with CAP_SYS_ADMIN (README, "Deploy on Kubernetes").
    let seccomp = Arch::host()
        .out_dir()
        .join("release/image-context/seccomp.json");
    if std::path::Path::new(integration_tests::container::DEFAULT_SECCOMP).exists() {
        std::fs::write(
            &seccomp,
            integration_tests::container::seccomp_with_bpf_text(),
        )?;
    }
    eprintln!(
        "image: manifest list {IMAGE} of {}; seccomp profile with bpf(2) for CAP_BPF: {}",
        said.join(" and "),
        seccomp.display()
    );
    Ok(IMAGE)
}
