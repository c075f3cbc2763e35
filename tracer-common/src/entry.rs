//! The per-thread entry state: what the entry programs save and the return program consumes.
//! User space reads the map at stop to count calls still in progress.

/// One thread's call in progress: when it began, which api (the attach cookie), its arguments
/// (in the layout [`crate::CallEvent::args`] documents).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Entry {
    /// `bpf_ktime_get_ns` at entry.
    pub start_ns: u64,
    /// The attach cookie: api id and `COOKIE_*` flags.
    pub cookie: u64,
    /// The arguments as the entry program read them.
    pub args: [u64; 6],
}

const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(size_of::<Entry>() == 64);
    assert!(offset_of!(Entry, cookie) == 8 && offset_of!(Entry, args) == 16);
};

#[cfg(feature = "user")]
// SAFETY: plain `#[repr(C)]` integers without padding; any bit pattern is valid.
unsafe impl aya::Pod for Entry {}
