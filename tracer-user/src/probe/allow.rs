//! `--lib-allow GLOB`: attach only library files that are one of the host's files the globs
//! name. The globs are expanded under the host's root (`/proc/1/root`, which a DaemonSet with
//! `hostPID` reaches), and a library is matched by device and inode, not by the path a tenant
//! shows: the NVIDIA container toolkit bind-mounts the host's driver files into containers, so
//! they keep their inode, while a library a tenant brings, even at the driver's path inside its
//! own image, does not.
use std::{collections::HashSet, os::unix::fs::MetadataExt as _};

use anyhow::{bail, Result};

/// Where the host's root is seen from: pid 1's root (the node's init, with `hostPID`), else
/// cudatrace's own root (run on the host itself, or where pid 1 is not the node's).
fn host_root() -> &'static str {
    if std::fs::read_dir("/proc/1/root/").is_ok() {
        "/proc/1/root"
    } else {
        ""
    }
}

/// The allowed library files: the globs and the (device, inode) pairs they matched last.
#[derive(Clone, Debug, Default)]
pub struct AllowList {
    patterns: Vec<String>,
    files: HashSet<(u64, u64)>,
    root: &'static str,
}

impl AllowList {
    /// An allow list of absolute `patterns` (none: every library is allowed).
    pub fn new(patterns: Vec<String>) -> Result<AllowList> {
        for p in &patterns {
            if !p.starts_with('/') {
                bail!("--lib-allow {p:?}: give an absolute path or glob, such as /usr/lib/x86_64-linux-gnu/libcuda.so.*");
            }
            glob::Pattern::new(p)
                .map_err(|e| anyhow::anyhow!("--lib-allow {p:?}: not a glob ({e})"))?;
        }
        let mut list = AllowList {
            patterns,
            files: HashSet::new(),
            root: host_root(),
        };
        list.refresh();
        Ok(list)
    }

    /// Whether the list restricts anything.
    pub fn active(&self) -> bool {
        !self.patterns.is_empty()
    }

    /// Expands the globs again (a driver update replaces the files).
    pub fn refresh(&mut self) {
        self.files = self
            .patterns
            .iter()
            .filter_map(|p| glob::glob(&format!("{}{p}", self.root)).ok())
            .flatten()
            .flatten()
            .filter_map(|path| std::fs::metadata(&path).ok())
            .filter(|m| m.is_file())
            .map(|m| (m.dev(), m.ino()))
            .collect();
    }

    /// Whether the file with this metadata may be attached.
    pub fn allows(&self, meta: &std::fs::Metadata) -> bool {
        !self.active() || self.files.contains(&(meta.dev(), meta.ino()))
    }

    /// The files the globs matched last.
    pub fn files(&self) -> &HashSet<(u64, u64)> {
        &self.files
    }

    /// The globs, for messages.
    pub fn describe(&self) -> String {
        self.patterns.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_files_by_inode_not_by_name() {
        let dir = std::env::temp_dir().join(format!("cudatrace-allow-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (real, copy) = (dir.join("libcuda.so.1"), dir.join("copy-libcuda.so.1"));
        std::fs::write(&real, b"driver").unwrap();
        std::fs::write(&copy, b"driver").unwrap();
        let list = AllowList::new(vec![format!("{}/libcuda.so.*", dir.display())]).unwrap();
        assert!(list.allows(&std::fs::metadata(&real).unwrap()));
        assert!(
            !list.allows(&std::fs::metadata(&copy).unwrap()),
            "same bytes, another file"
        );
        assert!(
            AllowList::default().allows(&std::fs::metadata(&copy).unwrap()),
            "no list: anything"
        );
        assert!(AllowList::new(vec!["libcuda.so.*".into()])
            .unwrap_err()
            .to_string()
            .contains("absolute"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
