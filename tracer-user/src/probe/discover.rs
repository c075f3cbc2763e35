//! Finds the libcuda libraries to attach when none is named: every `libcuda.so*` mapped by a
//! running process (opened through `/proc/PID/root` so container paths resolve), then the ones
//! the host's loader would find.
use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
};


/// Directories where distributions and the NVIDIA installer put libcuda.
const LOADER_DIRS: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/nvidia/lib64",
    "/usr/local/cuda/compat",
    "/lib/x86_64-linux-gnu",
];

/// Is this a libcuda file name (`libcuda.so`, `libcuda.so.1`, `libcuda.so.550.54.15`)?
pub fn is_libcuda(name: &str) -> bool {
    name == "libcuda.so" || name.starts_with("libcuda.so.")
}

/// Libcuda files mapped by running processes, as paths through `/proc/PID/root`.
pub fn mapped_libraries() -> Vec<PathBuf> {
    let mut found = BTreeSet::new();
    let Ok(procs) = fs::read_dir("/proc") else { return Vec::new() };
    for p in procs.flatten() {
        let name = p.file_name();
        let Some(pid) = name.to_str().filter(|s| s.bytes().all(|b| b.is_ascii_digit())) else { continue };
        let Ok(maps) = fs::read_to_string(format!("/proc/{pid}/maps")) else { continue };
        for line in maps.lines() {
            // address perms offset dev inode path
            let Some(path) = line.split_whitespace().nth(5) else { continue };
            let Some(file) = Path::new(path).file_name().and_then(|f| f.to_str()) else { continue };
            if is_libcuda(file) && path.starts_with('/') {
                found.insert(PathBuf::from(format!("/proc/{pid}/root{path}")));
            }
        }
    }
    found.into_iter().collect()
}

/// Libcuda files the host's loader would find.
pub fn loader_libraries() -> Vec<PathBuf> {
    LOADER_DIRS
        .iter()
        .map(|d| Path::new(d).join("libcuda.so.1"))
        .filter(|p| p.exists())
        .collect()
}

/// Every library to attach when none is named on the command line (may be none yet).
pub fn libraries() -> Vec<PathBuf> {
    let mut libs = mapped_libraries();
    libs.extend(loader_libraries());
    libs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libcuda_names() {
        assert!(is_libcuda("libcuda.so.1"));
        assert!(is_libcuda("libcuda.so"));
        assert!(is_libcuda("libcuda.so.550.54.15"));
        assert!(!is_libcuda("libcudart.so.12"));
        assert!(!is_libcuda("libcuda_stub.so"));
    }
}
