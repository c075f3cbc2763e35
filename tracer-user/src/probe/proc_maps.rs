//! `/proc/PID/maps`, which a tenant shapes (its paths may hold spaces, newlines' worth of odd
//! bytes, ` (deleted)`; it may map tens of thousands of regions): parsed field by field and
//! read bounded, keeping only libcuda mappings.
use std::io::{BufRead as _, BufReader, Read as _};

use super::discovery::is_libcuda;

/// Most bytes read of one process's maps (about 80,000 lines).
pub const MAX_MAPS_BYTES: u64 = 8 << 20;
/// Longest maps line looked at (a path is at most PATH_MAX, 4096 bytes, plus the fields).
const MAX_LINE: usize = 4096 + 128;
/// Distinct libcuda files kept of one process (a real one maps one).
pub const MAX_FILES: usize = 64;

/// One file mapping: where, which file (device and inode), and its path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    /// `start-end` in hex, as `/proc/PID/map_files/` names it.
    pub range: String,
    /// The device as `st_dev` holds it (`makedev(major, minor)`).
    pub dev: u64,
    /// The inode.
    pub inode: u64,
    /// The path in the process's mount namespace, without ` (deleted)`.
    pub path: String,
    /// Whether the file was deleted (or replaced) after it was mapped.
    pub deleted: bool,
    /// The file offset the mapping begins at.
    pub offset: u64,
}

/// Splits off the next field: the text up to the next space, and the rest after the spaces.
fn field(s: &str) -> Option<(&str, &str)> {
    let s = s.trim_start_matches(' ');
    let end = s.find(' ')?;
    Some((&s[..end], s[end..].trim_start_matches(' ')))
}

/// Parses one line: `start-end perms offset major:minor inode   path`; the path is everything
/// after the inode (spaces included). `None` for anonymous mappings and malformed lines.
pub fn parse_line(line: &str) -> Option<Mapping> {
    let (range, rest) = field(line)?;
    let (_perms, rest) = field(rest)?;
    let (offset, rest) = field(rest)?;
    let offset = u64::from_str_radix(offset, 16).ok()?;
    let (dev, rest) = field(rest)?;
    let (inode, path) = match field(rest) {
        Some(split) => split,
        None => (rest, ""),
    };
    let inode: u64 = inode.parse().ok()?;
    if inode == 0 || !path.starts_with('/') {
        return None;
    }
    let (major, minor) = dev.split_once(':')?;
    let dev = libc::makedev(
        u32::from_str_radix(major, 16).ok()?,
        u32::from_str_radix(minor, 16).ok()?,
    );
    let (path, deleted) = match path.strip_suffix(" (deleted)") {
        Some(p) => (p, true),
        None => (path, false),
    };
    range
        .split_once('-')
        .filter(|(a, b)| !a.is_empty() && !b.is_empty())?;
    Some(Mapping {
        range: range.to_owned(),
        dev,
        inode,
        path: path.to_owned(),
        deleted,
        offset,
    })
}

/// The file mapping that holds address `addr` in a maps text read from `reader` (at most
/// [`MAX_MAPS_BYTES`] of it), and `addr`'s offset in that file.
pub fn file_offset_of(reader: impl std::io::Read, addr: u64) -> Option<(Mapping, u64)> {
    let lines = BufReader::new(reader.take(MAX_MAPS_BYTES));
    for line in lines.split(b'\n').map_while(Result::ok) {
        if line.len() > MAX_LINE {
            continue;
        }
        let Some(m) = parse_line(&String::from_utf8_lossy(&line)) else {
            continue;
        };
        let Some((start, end)) = m.range.split_once('-') else {
            continue;
        };
        let (Ok(start), Ok(end)) = (u64::from_str_radix(start, 16), u64::from_str_radix(end, 16))
        else {
            continue;
        };
        if (start..end).contains(&addr) {
            let offset = m.offset.checked_add(addr - start)?;
            return Some((m, offset));
        }
    }
    None
}

/// The libcuda mappings in a maps text read from `reader`, at most [`MAX_MAPS_BYTES`] of it;
/// one per file (device and inode), at most [`MAX_FILES`].
pub fn libcuda_mappings(reader: impl std::io::Read) -> Vec<Mapping> {
    mappings(reader).libcuda
}

/// Dynamic loaders kept of one process (one is usual; a process may map another's by hand).
pub const MAX_LOADERS: usize = 4;

/// What discovery looks for in one process's maps.
#[derive(Debug, Default)]
pub struct Found {
    /// Its libcuda files, one mapping each, at most [`MAX_FILES`].
    pub libcuda: Vec<Mapping>,
    /// Its dynamic loaders (files named `ld-*.so*`), one mapping each, at most [`MAX_LOADERS`].
    pub loaders: Vec<Mapping>,
}

/// Whether a file name is a dynamic loader's: `ld-linux-x86-64.so.2`, `ld-linux-aarch64.so.1`,
/// `ld-2.31.so`, `ld-musl-x86_64.so.1`. (A tenant's file so named is read, and refused unless
/// it exports an empty `_dl_debug_state`.)
pub fn is_loader(name: &str) -> bool {
    name.starts_with("ld-") && name.contains(".so")
}

/// The libcuda and loader mappings in a maps text read from `reader`, at most
/// [`MAX_MAPS_BYTES`] of it; one per file (device and inode).
pub fn mappings(reader: impl std::io::Read) -> Found {
    let mut found = Found::default();
    let mut files = std::collections::HashSet::new();
    let mut lines = BufReader::new(reader.take(MAX_MAPS_BYTES));
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match lines
            .by_ref()
            .take(MAX_LINE as u64)
            .read_until(b'\n', &mut buf)
        {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        if buf.last() != Some(&b'\n') && buf.len() >= MAX_LINE {
            // Over-long line: skip the rest of it.
            let mut rest = Vec::new();
            if lines.read_until(b'\n', &mut rest).is_err() {
                break;
            }
            continue;
        }
        let line = String::from_utf8_lossy(&buf);
        let Some(m) = parse_line(line.trim_end_matches('\n')) else {
            continue;
        };
        let name = m.path.rsplit('/').next().unwrap_or_default();
        let list = if is_libcuda(name) {
            &mut found.libcuda
        } else if is_loader(name) && found.loaders.len() < MAX_LOADERS {
            &mut found.loaders
        } else {
            continue;
        };
        if files.insert((m.dev, m.inode)) {
            list.push(m);
            if found.libcuda.len() == MAX_FILES {
                break;
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_with_spaces_and_deleted_files() {
        let m = parse_line("7f1c2a000000-7f1c2a200000 r-xp 00001000 fd:01 1234567                    /opt/my libs/libcuda.so.1").unwrap();
        assert_eq!(
            (m.range.as_str(), m.inode, m.path.as_str(), m.deleted),
            (
                "7f1c2a000000-7f1c2a200000",
                1234567,
                "/opt/my libs/libcuda.so.1",
                false
            )
        );
        assert_eq!(m.dev, libc::makedev(0xfd, 1));
        let d =
            parse_line("7f00-7f10 r-xp 00000000 08:02 42 /usr/lib/libcuda.so.1 (deleted)").unwrap();
        assert_eq!(
            (d.path.as_str(), d.deleted),
            ("/usr/lib/libcuda.so.1", true)
        );
        assert_eq!(
            parse_line("7ffd-7ffe rw-p 00000000 00:00 0                          [stack]"),
            None
        );
        assert_eq!(parse_line("7ffd-7ffe rw-p 00000000 00:00 0"), None);
        assert_eq!(parse_line("garbage"), None);
        assert_eq!(parse_line("a-b r 0 zz:01 5 /x"), None);
    }

    #[test]
    fn only_libcuda_once_per_file_and_bounded() {
        let text = "1-2 r--p 0 08:01 7 /usr/lib/libcuda.so.1\n\
                    2-3 r-xp 1000 08:01 7 /usr/lib/libcuda.so.1\n\
                    3-4 r-xp 0 08:01 8 /usr/lib/libcudart.so.12\n\
                    4-5 r-xp 0 08:01 9 /tmp/a b/libcuda.so.550.54.15 (deleted)\n";
        let found = libcuda_mappings(text.as_bytes());
        assert_eq!(
            found
                .iter()
                .map(|m| (m.inode, m.path.as_str(), m.deleted))
                .collect::<Vec<_>>(),
            [
                (7, "/usr/lib/libcuda.so.1", false),
                (9, "/tmp/a b/libcuda.so.550.54.15", true)
            ]
        );
        // A line far longer than any path, then a real one: skipped, then read.
        let long = format!(
            "1-2 r 0 08:01 3 /{}/libcuda.so.1\n5-6 r 0 08:01 4 /ok/libcuda.so.1\n",
            "x".repeat(100_000)
        );
        assert_eq!(
            libcuda_mappings(long.as_bytes())
                .iter()
                .map(|m| m.inode)
                .collect::<Vec<_>>(),
            [4]
        );
        // At most MAX_FILES distinct files of one process.
        let many: String = (1..=100)
            .map(|i| format!("1-2 r 0 08:01 {i} /f{i}/libcuda.so.1\n"))
            .collect();
        assert_eq!(libcuda_mappings(many.as_bytes()).len(), MAX_FILES);
        // Past the byte cap nothing more is read.
        let mut huge = "1-2 r 0 08:01 1 /pad\n".repeat((MAX_MAPS_BYTES / 20) as usize + 10);
        huge.push_str("7-8 r 0 08:01 5 /late/libcuda.so.1\n");
        assert!(libcuda_mappings(huge.as_bytes()).is_empty());
    }

    #[test]
    fn loaders_are_found_beside_libcuda_and_bounded() {
        let text = "1-2 r--p 0 08:01 3 /usr/bin/python3.11\n\
                    2-3 r-xp 0 08:01 4 /usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2\n\
                    3-4 r--p 1000 08:01 4 /usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2\n\
                    4-5 r-xp 0 08:01 7 /usr/lib/libcuda.so.1\n\
                    5-6 r-xp 0 08:01 8 /nix/store/x-glibc/lib/ld-2.31.so\n\
                    6-7 r-xp 0 08:01 9 /lib/ld-musl-x86_64.so.1\n\
                    7-8 r-xp 0 08:01 10 /opt/ld-library.txt\n\
                    8-9 r-xp 0 08:01 11 /opt/old.so\n";
        let found = mappings(text.as_bytes());
        assert_eq!(
            found.libcuda.iter().map(|m| m.inode).collect::<Vec<_>>(),
            [7]
        );
        assert_eq!(
            found.loaders.iter().map(|m| m.inode).collect::<Vec<_>>(),
            [4, 8, 9]
        );
        let many: String = (1..=50)
            .map(|i| format!("1-2 r 0 08:01 {i} /f{i}/ld-linux-x86-64.so.2\n"))
            .collect();
        assert_eq!(mappings(many.as_bytes()).loaders.len(), MAX_LOADERS);
    }
}
