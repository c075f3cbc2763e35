//! How cudatrace opens every file it writes (the incident archive and its rotation, `record`'s
//! timeline): created 0600, the last component never a symlink, never blocking (a FIFO with no
//! reader is an error, not a hang), and a regular file or an error. Opened at start, while
//! cudatrace may still be uid 0, and written through the descriptor afterwards.
use std::{
    fs::{File, OpenOptions},
    io,
    os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _},
    path::Path,
};

/// What is done with what the file holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum How {
    /// Kept; every write goes to the end.
    Append,
    /// Kept; written where the descriptor points.
    Write,
    /// Emptied.
    Truncate,
}

/// Opens (creating, 0600) `path` to write, as the module says.
pub fn open_private(path: &Path, how: How) -> io::Result<File> {
    let mut o = OpenOptions::new();
    o.read(true).create(true).mode(0o600);
    match how {
        How::Append => o.append(true),
        How::Write => o.write(true),
        // Truncated below, once the file is known to be a regular one.
        How::Truncate => o.write(true),
    };
    o.custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC);
    let file = o.open(path).map_err(|e| match e.raw_os_error() {
        Some(libc::ELOOP) => io::Error::other(format!("{} is a symlink", path.display())),
        Some(libc::ENXIO) => io::Error::other(format!("{} is a FIFO", path.display())),
        _ => e,
    })?;
    let kind = file.metadata()?.file_type();
    if !kind.is_file() {
        let what = if kind.is_fifo() {
            "a FIFO"
        } else {
            "not a regular file"
        };
        return Err(io::Error::other(format!("{} is {what}", path.display())));
    }
    if how == How::Truncate {
        file.set_len(0)?;
    }
    Ok(file)
}

/// Hands `file` to `owner` (uid, gid): a file a person asked for with sudo is theirs.
pub fn give(file: &File, owner: (u32, u32)) -> io::Result<()> {
    std::os::unix::fs::fchown(file, Some(owner.0), Some(owner.1))
}

/// The person behind sudo (`SUDO_UID`, `SUDO_GID`), when cudatrace runs as root under it.
pub fn sudo_owner() -> Option<(u32, u32)> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let id = |name| std::env::var(name).ok()?.parse::<u32>().ok();
    Some((id("SUDO_UID")?, id("SUDO_GID")?))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};

    use super::*;

    #[test]
    fn truncated_private_and_given_to_its_owner() {
        let dir = std::env::temp_dir().join(format!("cudatrace-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("out.json");
        std::fs::write(&path, "old contents").unwrap();
        let f = open_private(&path, How::Truncate).unwrap();
        assert_eq!(f.metadata().unwrap().len(), 0);
        let fresh = dir.join("fresh.json");
        let g = open_private(&fresh, How::Truncate).unwrap();
        assert_eq!(g.metadata().unwrap().permissions().mode() & 0o777, 0o600);
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            give(&g, (65534, 65534)).unwrap();
            let m = std::fs::metadata(&fresh).unwrap();
            assert_eq!((m.uid(), m.gid()), (65534, 65534));
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
