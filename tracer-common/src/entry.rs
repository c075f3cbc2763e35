//! The per-thread entry state: what the entry programs save and the return program consumes.
//! User space reads the map at stop to count calls still in progress.

/// One thread's slot: its call in progress (when it began, 0 while idle; which api, the attach
/// cookie; its arguments, in the layout [`crate::CallEvent::args`] documents), and what the
/// thread's last counted launch saw, which spares a map lookup per launch.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Entry {
    /// `bpf_ktime_get_ns` at entry.
    pub start_ns: u64,
    /// The attach cookie: api id and `COOKIE_*` flags.
    pub cookie: u64,
    /// The arguments as the entry program read them.
    pub args: [u64; 6],
    /// The stream of the thread's last launch that was counted in-kernel (`u64::MAX`: none).
    pub last_stream: u64,
    /// Its process's wait epoch then: while it is unchanged, no wait has closed that stream's
    /// batch, so the next launch on it does not open one.
    pub last_epoch: u64,
    /// `CUDA_ERROR_NOT_READY` answers to this thread's polls since its last written poll (none of
    /// them is written: the next successful poll's record carries the count).
    pub polls: u64,
    /// `bpf_ktime_get_ns` at the return of the thread's last launch (0: none yet): a wait's
    /// record carries it, so that user space can tell a host gap before the wait.
    pub last_launch_ns: u64,
    /// The probed address of the thread's last call (its entry point), for the harm check.
    pub entry_ip: u64,
    /// `bpf_ktime_get_ns` at the return of the thread's last call (0: none returned yet).
    pub ended_ns: u64,
    /// 1 when a uprobe session's entry asked for this call's return (it is sampled, may open a
    /// stream batch, or could not be counted at entry): the return counts and writes it without
    /// sampling it again. 0 for every other call.
    pub session: u64,
    /// The cgroup whose share the slot was taken from (`bpf_get_current_cgroup_id` then): it is
    /// given back there, also when the thread has moved to another cgroup since.
    pub cgroup: u64,
}

const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(size_of::<Entry>() == 128 && offset_of!(Entry, last_stream) == 64);
    assert!(offset_of!(Entry, cgroup) == 120);
    assert!(offset_of!(Entry, entry_ip) == 96 && offset_of!(Entry, ended_ns) == 104);
    assert!(offset_of!(Entry, session) == 112);
    assert!(offset_of!(Entry, polls) == 80 && offset_of!(Entry, last_launch_ns) == 88);
    assert!(offset_of!(Entry, cookie) == 8 && offset_of!(Entry, args) == 16);
};

#[cfg(feature = "user")]
// SAFETY: plain `#[repr(C)]` integers without padding; any bit pattern is valid.
unsafe impl aya::Pod for Entry {}
