//! Attach-cookie flags: what an entry point's return probe must read and do, beside its api id.

/// Cookie flag: at return, read the out-parameter the first argument points to.
pub const COOKIE_READ_OUT: u64 = 1 << 16;
/// Cookie flag: at return, read the NUL-terminated name the third argument points to.
pub const COOKIE_READ_NAME: u64 = 1 << 17;
/// Cookie flag: a kernel launch, counted in-kernel when aggregating.
pub const COOKIE_LAUNCH: u64 = 1 << 18;
/// Cookie flag: stream 0 is this thread's default stream (`_ptsz`/`_ptds`).
pub const COOKIE_PER_THREAD: u64 = 1 << 19;
/// Cookie flag: a successful return closes the batch of the stream in the first argument.
pub const COOKIE_CLOSES_ARG_STREAM: u64 = 1 << 20;
/// Cookie flag: a successful return closes the batch of the default stream (synchronous copies).
pub const COOKIE_CLOSES_DEFAULT_STREAM: u64 = 1 << 21;
/// Cookie flag: a successful return closes the batches of every stream of the process.
pub const COOKIE_CLOSES_ALL: u64 = 1 << 22;
/// Cookie flag: at return, read the out-parameter the second argument points to.
pub const COOKIE_READ_OUT_ARG1: u64 = 1 << 23;
/// Cookie flag: a poll. A `CUDA_ERROR_NOT_READY` answer writes no record (the thread's slot
/// counts it); a successful one closes the batch it covers, like a wait.
pub const COOKIE_POLL: u64 = 1 << 24;
/// Cookie flag: a successful return closes the batch the event in the first argument covers.
pub const COOKIE_CLOSES_EVENT: u64 = 1 << 25;
/// Cookie flag: a successful return begins a stream capture in the process.
pub const COOKIE_CAPTURE_BEGIN: u64 = 1 << 26;
/// Cookie flag: the return ends a stream capture in the process, whatever its result.
pub const COOKIE_CAPTURE_END: u64 = 1 << 27;
/// Cookie flag: the name [`COOKIE_READ_NAME`] reads is the first argument's, not the third's.
pub const COOKIE_NAME_ARG0: u64 = 1 << 28;
/// Cookie flag: the first argument points at a `CUDA_MEMCPY2D`, read at entry into the record's
/// arguments as [`crate::params`] lays them out.
pub const COOKIE_PARAMS_2D: u64 = 1 << 29;
/// Cookie flag: the first argument points at a `CUDA_MEMCPY3D`, read likewise.
pub const COOKIE_PARAMS_3D: u64 = 1 << 30;
/// Cookie flag: a batch of copies `(dsts, srcs, sizes, count, ...)`: the sizes are summed at
/// entry, and the stream is argument 7 (argument 8 with [`COOKIE_BATCH_FAIL_IDX`]).
pub const COOKIE_BATCH: u64 = 1 << 31;
/// Cookie flag: the CUDA 12.8 batch layout, with `failIdx` before the stream.
pub const COOKIE_BATCH_FAIL_IDX: u64 = 1 << 32;
/// Cookie flag: the out-parameter is 16 bytes (a `CUuuid`): its second half is read into the
/// record's third argument.
pub const COOKIE_READ_OUT_16: u64 = 1 << 33;
/// Cookie flag: at return, the `CUmemLocation` (type, id) of the `CUmemAllocationProp` the
/// third argument points to is read into the record's fourth argument (`cuMemCreate`'s device).
pub const COOKIE_READ_PROP_LOCATION: u64 = 1 << 34;
/// Offset of `location` in `CUmemAllocationProp` (`{int type; int requestedHandleTypes;
/// CUmemLocation location; ...}`).
pub const PROP_LOCATION_OFFSET: u64 = 8;
/// `CU_MEM_LOCATION_TYPE_DEVICE`: a location whose id is a CUDA ordinal.
pub const CU_MEM_LOCATION_TYPE_DEVICE: u32 = 1;
/// `CUDA_ERROR_ILLEGAL_STATE`: what `cuStreamEndCapture` answers on a stream that was not
/// capturing (no capture ended).
pub const CUDA_ERROR_ILLEGAL_STATE: i32 = 401;
/// `CUDA_ERROR_NOT_READY`: what a poll answers while the work it asks about runs.
pub const CUDA_ERROR_NOT_READY: i32 = 600;
/// Mask of the api id inside a cookie.
pub const COOKIE_API_MASK: u64 = 0xffff;
/// Where the attached library's tag sits in a cookie (bits 48 to 63): set per library file by
/// user space when it attaches, so that a fault record names the library whose probe the thread
/// hit last even when the process is gone before its maps can be read. 0: no tag.
pub const COOKIE_LIBRARY_SHIFT: u32 = 48;

/// The library tag of a cookie (0: none).
pub const fn library_tag(cookie: u64) -> u16 {
    (cookie >> COOKIE_LIBRARY_SHIFT) as u16
}
