//! Guards that undo what a test set up, also when an assertion fails: temporary folders (and
//! the library copies and files in them), cgroups.
use std::{
    fs,
    path::{Path, PathBuf},
};

/// A folder of its own under the temporary directory, removed with everything in it on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    /// A new, empty folder whose name starts with `cudatrace-<name>-<pid>`.
    pub fn new(name: &str) -> TempDir {
        use std::sync::atomic::{AtomicU32, Ordering};
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("cudatrace-{name}-{}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        TempDir(dir)
    }

    /// The folder.
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// `name` inside it.
    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    /// Writes `text` to `name` inside it; returns the path.
    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.join(name);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).unwrap();
        }
        fs::write(&path, text).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        path
    }

    /// Copies `file` to `name` inside it (its own inode, as a container image's file would be).
    pub fn copy(&self, file: &Path, name: &str) -> PathBuf {
        let path = self.join(name);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).unwrap();
        }
        fs::copy(file, &path).unwrap_or_else(|e| {
            panic!("cannot copy {} to {}: {e}", file.display(), path.display())
        });
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// The cgroup v2 tree's root: the hybrid hosts' `unified`, else `/sys/fs/cgroup`.
fn v2_base() -> PathBuf {
    ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.join("cgroup.procs").exists())
        .unwrap_or_else(|| PathBuf::from("/sys/fs/cgroup/unified"))
}

/// A cgroup v2 directory tree made for a test, removed (innermost first) on drop. Processes
/// still in it keep it alive; the tests wait for theirs first.
pub struct Cgroup {
    root: PathBuf,
    leaf: PathBuf,
}

impl Cgroup {
    /// Creates `relative` (nested folders) under a test root in the cgroup v2 hierarchy.
    pub fn new(relative: &str) -> Cgroup {
        let root = v2_base().join(format!("cudatrace-test-{}", std::process::id()));
        let leaf = root.join(relative);
        if let Err(e) = fs::create_dir_all(&leaf) {
            panic!("cannot create cgroup v2 directory {}: {e}", leaf.display());
        }
        Cgroup { root, leaf }
    }

    /// Creates a top-level cgroup of its own (`cudatrace-NAME-PID` at the v2 root): another
    /// tenant than every other top-level cgroup, as the probe-harm breaker counts them.
    pub fn top(name: &str) -> Cgroup {
        let root = v2_base().join(format!("cudatrace-{name}-{}", std::process::id()));
        if let Err(e) = fs::create_dir_all(&root) {
            panic!("cannot create cgroup v2 directory {}: {e}", root.display());
        }
        Cgroup {
            leaf: root.clone(),
            root,
        }
    }

    /// The innermost cgroup.
    pub fn path(&self) -> &Path {
        &self.leaf
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let mut dir = self.leaf.as_path();
        while dir.starts_with(&self.root) {
            let _ = fs::remove_dir(dir);
            match dir.parent() {
                Some(parent) => dir = parent,
                None => break,
            }
        }
    }
}

/// A tmpfs mounted over a folder (hiding what is there, as a tenant with its own mount rights
/// can), unmounted on drop.
pub struct Tmpfs(PathBuf);

impl Tmpfs {
    /// Mounts an empty tmpfs at `dir`.
    pub fn over(dir: &Path) -> Tmpfs {
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "cudatrace-test"])
            .arg(dir)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "cannot mount a tmpfs at {}", dir.display());
        Tmpfs(dir.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// A path's (uid, gid, permission bits), the last component not followed; panics when it is
/// missing.
pub fn owner_and_mode(path: &std::path::Path) -> (u32, u32, u32) {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    let m = std::fs::symlink_metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (m.uid(), m.gid(), m.permissions().mode() & 0o777)
}

/// A process's real, effective, saved and filesystem uids and gids, and its groups, from
/// /proc/PID/status.
pub fn ids(pid: u32) -> (String, String, String) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.split_whitespace().collect::<Vec<_>>().join(" "))
            .unwrap_or_default()
    };
    (field("Uid:"), field("Gid:"), field("Groups:"))
}
