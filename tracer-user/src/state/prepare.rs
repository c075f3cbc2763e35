//! The state directory's `baselines/` made the daemon's own: created 0700 and given to the uid
//! cudatrace runs as once it leaves uid 0. The daemon does it itself when it can (root with
//! CAP_CHOWN, as the CLI runs); in the DaemonSet, where the main container has no CAP_CHOWN,
//! the init container runs `cudatrace prepare-state` with CAP_CHOWN alone.
use std::{
    io,
    os::unix::fs::{DirBuilderExt as _, MetadataExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
};

use super::SUBDIR;

/// Makes `dir/baselines` a directory owned by `owner` (uid, gid), mode 0700; returns it. A
/// symlink or a non-directory there is refused.
pub fn prepare(dir: &Path, owner: (u32, u32)) -> io::Result<PathBuf> {
    let sub = dir.join(SUBDIR);
    match std::fs::DirBuilder::new().mode(0o700).create(&sub) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => {
            return Err(io::Error::new(
                e.kind(),
                format!("cannot make {}: {e}", sub.display()),
            ))
        }
    }
    let meta = std::fs::symlink_metadata(&sub)?;
    if !meta.file_type().is_dir() {
        return Err(io::Error::other(format!(
            "{} is not a directory (a symlink or a file): remove it",
            sub.display()
        )));
    }
    if meta.permissions().mode() & 0o777 != 0o700 {
        std::fs::set_permissions(&sub, std::fs::Permissions::from_mode(0o700))?;
    }
    if (meta.uid(), meta.gid()) != owner {
        std::os::unix::fs::lchown(&sub, Some(owner.0), Some(owner.1)).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "cannot give {} to uid {} ({e}): run `cudatrace prepare-state` with CAP_CHOWN first (the chart's init container does), or make it uid {}'s",
                    sub.display(),
                    owner.0,
                    owner.0
                ),
            )
        })?;
    }
    Ok(sub)
}
