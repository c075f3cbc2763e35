//! Reads a whole BPF hash map with `BPF_MAP_LOOKUP_BATCH` (kernel 5.6+): thousands of cells per
//! system call instead of two per cell. A tenant can fill the launch map (131,072 cells, one per
//! made-up kernel handle) and the daemon reads it every 500 ms: cell by cell that is 260,000
//! system calls per read. aya 0.14 has no batch operations, so the call is made here.
use std::{
    io,
    mem::{offset_of, size_of},
    os::fd::{AsRawFd, BorrowedFd},
};

/// `BPF_MAP_LOOKUP_BATCH` (include/uapi/linux/bpf.h).
const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
/// Cells asked for per call (a hash bucket larger than this would need more: then it doubles).
const CHUNK: usize = 4096;

/// The `batch` member of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

// The kernel's layout, checked here.
const _: () = {
    assert!(offset_of!(BatchAttr, count) == 32 && offset_of!(BatchAttr, map_fd) == 36);
    assert!(size_of::<BatchAttr>() == 56);
};

/// Plain data a map's keys and values are read into: any bytes are a valid value.
///
/// # Safety
/// The type must be `#[repr(C)]` (or a primitive) with no padding-sensitive invariants and no
/// pointers, so that the kernel may write any bytes of its size into it.
pub unsafe trait Plain: Copy + Default {}

// SAFETY: `#[repr(C)]` structs of unsigned integers (tracer-common checks their sizes): every
// bit pattern is a value.
unsafe impl Plain for tracer_common::launches::LaunchKey {}
// SAFETY: as above, three `u64`s.
unsafe impl Plain for tracer_common::launches::LaunchCell {}
// SAFETY: as above, ten `u64`s.
unsafe impl Plain for tracer_common::entry::Entry {}
// SAFETY: a primitive.
unsafe impl Plain for u64 {}

/// Every (key, value) of the hash map `fd` whose keys are `K` and values `V`; `Ok(None)` when
/// the kernel has no batch operations (the caller then iterates).
pub fn lookup_all<K: Plain, V: Plain>(fd: BorrowedFd<'_>) -> io::Result<Option<Vec<(K, V)>>> {
    let mut out = Vec::new();
    let mut chunk = CHUNK;
    let mut keys = vec![K::default(); chunk];
    let mut values = vec![V::default(); chunk];
    // The kernel's position: a bucket index for hash maps, written to `out_batch`.
    let (mut token_in, mut token_out) = (0u64, 0u64);
    let mut first = true;
    loop {
        let mut attr = BatchAttr {
            in_batch: if first {
                0
            } else {
                &token_in as *const u64 as u64
            },
            out_batch: &mut token_out as *mut u64 as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: chunk as u32,
            map_fd: fd.as_raw_fd() as u32,
            ..BatchAttr::default()
        };
        // SAFETY: `attr` is the `batch` member of `union bpf_attr` for BPF_MAP_LOOKUP_BATCH, with
        // its size; `keys` and `values` hold `count` elements of the map's key and value sizes
        // (`K` and `V` are those types, `Plain`, so any bytes written are values), and the batch
        // tokens are 8 bytes, more than the 4 a hash map's position takes. All outlive the call.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_LOOKUP_BATCH,
                &mut attr as *mut BatchAttr,
                size_of::<BatchAttr>(),
            )
        };
        let err = (rc < 0).then(io::Error::last_os_error);
        match err.as_ref().and_then(io::Error::raw_os_error) {
            // A bucket larger than the chunk: ask for more at once, from the same position.
            Some(libc::ENOSPC) if chunk < (1 << 20) => {
                chunk *= 2;
                keys.resize(chunk, K::default());
                values.resize(chunk, V::default());
                continue;
            }
            // Older kernels, or a map type without batch operations (524: the kernel's ENOTSUPP).
            Some(libc::EINVAL | libc::EOPNOTSUPP | 524) if first => return Ok(None),
            None | Some(libc::ENOENT) => {}
            Some(_) => return Err(err.expect("an error")),
        }
        let n = (attr.count as usize).min(chunk);
        out.extend(keys[..n].iter().copied().zip(values[..n].iter().copied()));
        if err.is_some() {
            // ENOENT: the last bucket was read.
            return Ok(Some(out));
        }
        token_in = token_out;
        first = false;
    }
}
