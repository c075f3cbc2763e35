//! The container images `cargo xtask image` built before these tests: a manifest list of amd64
//! and arm64, each image holding a `cudatrace` of its own architecture and that architecture's
//! loader, so that the chart's one image reference runs on x86-64 and Grace nodes alike.
use std::process::Command;

use integration_tests::{container::IMAGE, env};
use serde_json::Value;

/// `buildah ARGS`' standard output; panics with its error.
fn buildah(args: &[&str]) -> String {
    let out = Command::new("buildah")
        .args(args)
        .output()
        .expect("buildah (Debian package) is needed: scripts/setup.sh installs it");
    assert!(
        out.status.success(),
        "buildah {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// ELF e_machine of the file at `path` (62: x86-64, 183: aarch64).
fn elf_machine(path: &std::path::Path) -> u16 {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(&bytes[..4], b"\x7fELF", "{} is no ELF file", path.display());
    u16::from_le_bytes([bytes[18], bytes[19]])
}

#[test]
fn manifest_list_holds_amd64_and_arm64_images_of_their_own_architecture() {
    let Some(_env) = env() else { return };
    let list: Value = serde_json::from_str(&buildah(&["manifest", "inspect", IMAGE])).unwrap();
    let mut platforms: Vec<String> = list["manifests"]
        .as_array()
        .expect("a manifest list")
        .iter()
        .map(|m| {
            let p = &m["platform"];
            format!(
                "{}/{}",
                p["os"].as_str().unwrap_or("?"),
                p["architecture"].as_str().unwrap_or("?")
            )
        })
        .collect();
    platforms.sort();
    assert_eq!(platforms, ["linux/amd64", "linux/arm64"]);
    let mut seen = Vec::new();
    for (arch, machine, loader) in [
        ("amd64", 62, "lib64/ld-linux-x86-64.so.2"),
        ("arm64", 183, "lib/ld-linux-aarch64.so.1"),
    ] {
        let name = format!("{IMAGE}-{arch}");
        let inspect: Value =
            serde_json::from_str(&buildah(&["inspect", "--type", "image", &name])).unwrap();
        assert_eq!(inspect["OCIv1"]["architecture"], arch, "{name}");
        let container = buildah(&["from", "--quiet", &name]).trim().to_owned();
        let root = std::path::PathBuf::from(buildah(&["mount", &container]).trim());
        let got = elf_machine(&root.join("usr/bin/cudatrace"));
        let has_loader = root.join(loader).exists();
        buildah(&["umount", &container]);
        buildah(&["rm", &container]);
        assert_eq!((got, has_loader), (machine, true), "{name}");
        seen.push(format!("{arch}: e_machine {got}, /{loader}"));
    }
    eprintln!("e2e image: manifest list {IMAGE} of {platforms:?}; {seen:?}");
}
