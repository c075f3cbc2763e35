//! Discovery without polling: the kernel says which process opened a file named like libcuda
//! (`libcuda.so`, `libcuda.so.*` as the last path component), through a ring buffer of its own
//! (`OPENS`), so that user space reads that process's maps and no other's.

/// A process opened a file named like libcuda (the open succeeded).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpenEvent {
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// The opener's cgroup (v2) id: its tenant, whose share of discovery's reads it draws on.
    pub cgroup: u64,
}

/// Bytes of the `OPENS` ring buffer (5,461 events of 16 bytes, each with its 8-byte header).
pub const OPENS_RINGBUF_BYTES: u32 = 128 * 1024;
/// Bytes of a path the kernel side reads (longer ones are cut; their last component may then be
/// missed, and the full scan that a lost or doubtful open asks for finds the file).
pub const OPEN_PATH_BYTES: usize = 256;
/// A process is reported at most once in this long (ns): a tenant opening `libcuda.so` in a loop
/// costs the reader one event a millisecond, not one an open.
pub const OPEN_REPORT_GAP_NS: u64 = 1_000_000;
/// Processes whose last report time is kept (LRU).
pub const MAX_OPENERS: u32 = 16_384;

/// What a libcuda file's name starts with.
pub const LIBCUDA_PREFIX: &[u8; 10] = b"libcuda.so";

/// Whether a file name (the last path component) is libcuda's: `libcuda.so`, or `libcuda.so.`
/// followed by anything.
pub fn is_libcuda_name(name: &[u8]) -> bool {
    name.starts_with(LIBCUDA_PREFIX) && matches!(name.get(LIBCUDA_PREFIX.len()), None | Some(b'.'))
}

const _: () = assert!(core::mem::size_of::<OpenEvent>() == 16);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libcuda_names() {
        for yes in [&b"libcuda.so"[..], b"libcuda.so.1", b"libcuda.so.550.54.15"] {
            assert!(is_libcuda_name(yes), "{yes:?}");
        }
        for no in [
            &b"libcuda.sox"[..],
            b"libcudart.so.12",
            b"libcuda",
            b"xlibcuda.so",
        ] {
            assert!(!is_libcuda_name(no), "{no:?}");
        }
    }
}
