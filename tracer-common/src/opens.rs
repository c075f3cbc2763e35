//! Discovery without polling: the kernel says which process opened a file named like libcuda
//! (`libcuda.so`, `libcuda.so.*` as the last path component), through a ring buffer of its own
//! (`OPENS`), so that user space reads that process's maps and no other's.

/// What the kernel says of a process: it opened a file named like libcuda (the open path's
/// kprobe, or `sys_enter`). Read it now and again until it maps one.
pub const OPEN_KIND_OPENED: u32 = 0;
/// Its dynamic loader finished loading objects, one named like libcuda (the loader's
/// `_dl_debug_state`): it is mapped now. Read at once, even if a read found nothing a moment ago.
pub const OPEN_KIND_LOADED: u32 = 1;
/// Its dynamic loader finished loading objects whose names were not all looked at (more than
/// [`LOADER_NEW_CHECKED`] new ones, or a list that could not be read): read as an open is.
pub const OPEN_KIND_LOADED_UNSURE: u32 = 3;
/// It executed a file not seen before (`sched_process_exec`): its loader may be one that is
/// not watched yet. The event carries the file's key, which user space forgets from `EXES` when
/// it could not read the process, so that the next execution of that file says so again.
pub const OPEN_KIND_EXEC: u32 = 2;

/// An executed file: the kernel's device number of its filesystem and its inode.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ExeKey {
    /// `super_block.s_dev` (the kernel's encoding, not `st_dev`'s).
    pub dev: u64,
    /// `inode.i_ino`.
    pub ino: u64,
}

/// What the kernel names to discovery: a process, why ([`OPEN_KIND_OPENED`] and the others),
/// and for an execution the file executed.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpenEvent {
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// The opener's cgroup (v2) id: its tenant, whose share of discovery's reads it draws on.
    pub cgroup: u64,
    /// `OPEN_KIND_*`.
    pub kind: u32,
    /// Padding (0).
    pub pad: u32,
    /// The executed file ([`OPEN_KIND_EXEC`] only).
    pub exe: ExeKey,
}

/// What the loader program keeps of a process (LRU hash `LOADED`, pid to this): how many objects
/// its loader's list held and which was last at its last check, so that only new ones are
/// looked at.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoadedState {
    /// Objects in the list.
    pub count: u32,
    /// Padding (0).
    pub pad: u32,
    /// The last object's `struct link_map` address.
    pub tail: u64,
}

/// The loader's function a debugger stops at after every change of the loaded objects (glibc
/// and musl export it; empty: a bare return).
pub const LOADER_SYMBOL: &str = "_dl_debug_state";
/// The loader's `struct r_debug` of the main namespace, found from [`LOADER_SYMBOL`] by the
/// distance between the two symbols (the link's cookie).
pub const LOADER_DEBUG_SYMBOL: &str = "_r_debug";
/// `struct r_debug` (`<link.h>`, a public ABI): where `r_map` and `r_state` sit (LP64).
pub const R_DEBUG_MAP: u64 = 8;
/// See [`R_DEBUG_MAP`].
pub const R_DEBUG_STATE: u64 = 24;
/// `r_state` once the list is consistent again (after a load or an unload).
pub const RT_CONSISTENT: u32 = 0;
/// `struct link_map` (`<link.h>`): `l_name`, `l_next`, `l_prev` (LP64).
pub const LINK_MAP_NAME: u64 = 8;
/// See [`LINK_MAP_NAME`].
pub const LINK_MAP_NEXT: u64 = 24;
/// See [`LINK_MAP_NAME`].
pub const LINK_MAP_PREV: u64 = 32;
/// Objects of a list walked at most (a process with more is read from its maps at each load).
pub const LOADER_MAX_OBJECTS: u32 = 1024;
/// New objects whose names are looked at, newest first (more: the process's maps are read).
pub const LOADER_NEW_CHECKED: u32 = 16;
/// Executed files remembered (LRU hash `EXES`): each is said once.
pub const MAX_EXES: u32 = 8192;
/// An execution wakes the reader at most once in this long (ns); between, it is read at the
/// reader's next pass (within [`EXEC_WAKE_GAP_NS`]).
pub const EXEC_WAKE_GAP_NS: u64 = 100_000_000;

/// `EXEC_CONFIG` slots: where the exec program finds the executed file's device and inode
/// (byte offsets from the kernel's BTF), whether they are set, and when it last woke the reader.
pub const EXEC_BPRM_FILE: u32 = 0;
/// `struct file`'s `f_inode`.
pub const EXEC_FILE_INODE: u32 = 1;
/// `struct inode`'s `i_ino`.
pub const EXEC_INODE_INO: u32 = 2;
/// `struct inode`'s `i_sb`.
pub const EXEC_INODE_SB: u32 = 3;
/// `struct super_block`'s `s_dev`.
pub const EXEC_SB_DEV: u32 = 4;
/// 1 once the offsets above are set.
pub const EXEC_READY: u32 = 5;
/// When an execution last woke the reader (ns).
pub const EXEC_WOKE: u32 = 6;
/// Slots of `EXEC_CONFIG`.
pub const EXEC_CONFIG_COUNT: u32 = 7;

/// Bytes of the `OPENS` ring buffer (2,730 events of 40 bytes, each with its 8-byte header).
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

const _: () = assert!(core::mem::size_of::<OpenEvent>() == 40);
const _: () = assert!(core::mem::size_of::<LoadedState>() == 16);
const _: () = assert!(core::mem::size_of::<ExeKey>() == 16);

#[cfg(feature = "user")]
mod pod {
    // SAFETY: plain `#[repr(C)]` integers without padding; any bit pattern is valid.
    unsafe impl aya::Pod for super::ExeKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::LoadedState {}
}

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
