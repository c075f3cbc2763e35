//! The `#[repr(C)]` ABI shared by the eBPF programs and the `cudatrace` binary: which driver entry
//! points exist, how the attach cookie encodes them, and the records the ring buffer carries.
#![no_std]

pub mod api;
pub mod event;

pub use api::{Api, Kind, Layout};
pub use event::{CallEvent, LookupEvent, EventTag, NAME_MAX};

/// Index of the dropped-events slot in the `STATS` per-CPU array.
pub const STAT_DROPPED: u32 = 0;
/// Index of the slot counting returns whose entry state was missing (evicted or attached mid-call).
pub const STAT_ORPHAN_RETURNS: u32 = 1;
/// Number of slots in the `STATS` per-CPU array.
pub const STAT_COUNT: u32 = 2;

/// Index of the on/off switch in the `CONFIG` array: calls are recorded while it holds 1.
pub const CONFIG_ENABLED: u32 = 0;
/// Number of slots in the `CONFIG` array.
pub const CONFIG_COUNT: u32 = 1;

/// Capacity of the per-thread entry-state LRU map (threads inside a driver call at once).
pub const MAX_INFLIGHT: u32 = 16384;
/// Default ring-buffer size in bytes (a power of two, multiple of the page size).
pub const DEFAULT_RINGBUF_BYTES: u32 = 8 << 20;
