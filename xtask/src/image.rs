//! `cargo xtask image`: the container image, assembled from local files (no registry is
//! needed or reached): the release binary and the shared libraries `ldd` says it loads, at
//! their paths, in an empty base, built with buildah from deploy/container/Containerfile.
use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _, Result};

/// The image's name.
pub const IMAGE: &str = "localhost/cudatrace:latest";

/// Paths of the shared libraries `binary` loads (the dynamic loader included).
fn libraries(binary: &Path) -> Result<Vec<PathBuf>> {
    let out = Command::new("ldd")
        .arg(binary)
        .output()
        .context("ldd (libc-bin) is needed")?;
    if !out.status.success() {
        bail!(
            "ldd {} failed: {}",
            binary.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text = String::from_utf8(out.stdout)?;
    Ok(text
        .lines()
        .filter_map(|l| l.split_whitespace().find(|w| w.starts_with('/')))
        .map(PathBuf::from)
        .collect())
}

/// Builds the binary (when `build` is set) and the image; returns the image's name.
pub fn build(root: &Path, binary: &Path, build: bool) -> Result<&'static str> {
    if build {
        crate::build()?;
    }
    let context = binary
        .parent()
        .context("binary has a folder")?
        .join("image-context");
    let rootfs = context.join("rootfs");
    let _ = std::fs::remove_dir_all(&context);
    std::fs::create_dir_all(rootfs.join("usr/bin"))?;
    std::fs::copy(binary, rootfs.join("usr/bin/cudatrace"))?;
    for lib in libraries(binary)? {
        // Resolve symlinks (libc.so.6 -> libc-2.36.so on some systems) and keep the name asked for.
        let real = std::fs::canonicalize(&lib)
            .with_context(|| format!("cannot resolve {}", lib.display()))?;
        let dest = rootfs.join(lib.strip_prefix("/").unwrap_or(&lib));
        std::fs::create_dir_all(dest.parent().context("library has a folder")?)?;
        std::fs::copy(&real, &dest).with_context(|| format!("cannot copy {}", real.display()))?;
    }
    std::fs::copy(
        root.join("deploy/container/Containerfile"),
        context.join("Containerfile"),
    )?;
    // The runtime's default seccomp profile with bpf(2) for CAP_BPF, for runtimes whose default
    // allows it only with CAP_SYS_ADMIN (README, "Deploy on Kubernetes").
    if std::path::Path::new(integration_tests::container::DEFAULT_SECCOMP).exists() {
        std::fs::write(
            context.join("seccomp.json"),
            integration_tests::container::seccomp_with_bpf_text(),
        )?;
    }
    let status = Command::new("buildah")
        .args(["bud", "--quiet", "--layers=false", "-t", IMAGE, "-f"])
        .arg(context.join("Containerfile"))
        .arg(&context)
        .status()
        .context("buildah (Debian package) is needed: scripts/setup.sh installs it")?;
    if !status.success() {
        bail!("buildah bud failed: {status}");
    }
    eprintln!(
        "image: {IMAGE} (cudatrace and {} libraries); seccomp profile with bpf(2) for CAP_BPF: {}",
        libraries(binary)?.len(),
        context.join("seccomp.json").display()
    );
    Ok(IMAGE)
}
