//! Builds the eBPF programs (tracer-ebpf's `tracer` binary, bpfel-unknown-none, nightly
//! `-Z build-std=core`) so that a plain `cargo build` produces a complete `cudatrace`.
use std::path::PathBuf;

use aya_build::{Package, Toolchain};

fn main() -> anyhow::Result<()> {
    // The fuzz targets build the library's parsers with sanitizer flags that the eBPF build
    // must not get; they never load the programs, so an empty object stands in.
    println!("cargo:rerun-if-env-changed=CUDATRACE_SKIP_EBPF");
    if std::env::var_os("CUDATRACE_SKIP_EBPF").is_some() {
        let out = PathBuf::from(std::env::var("OUT_DIR")?).join("tracer");
        std::fs::write(out, [])?;
        return Ok(());
    }
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let root = manifest.join("../tracer-ebpf").canonicalize()?;
    let root = root
        .to_str()
        .ok_or_else(|| anyhow::anyhow!("non-UTF-8 path {}", root.display()))?;
    let toolchain = std::env::var("CUDATRACE_EBPF_TOOLCHAIN").ok();
    println!("cargo:rerun-if-env-changed=CUDATRACE_EBPF_TOOLCHAIN");
    let toolchain = match toolchain.as_deref() {
        Some(t) => Toolchain::Custom(t),
        None => Toolchain::Nightly,
    };
    aya_build::build_ebpf(
        [Package {
            name: "tracer-ebpf",
            root_dir: root,
            ..Default::default()
        }],
        toolchain,
    )
}
