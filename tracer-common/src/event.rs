//! Ring-buffer records. Every record starts with a `u32` tag ([`EventTag`]) so the reader can tell
//! a plain call from a kernel-name lookup, which carries the looked-up name.

/// Bytes of a kernel name carried by a lookup record; a name that fills it is read again into a
/// [`LongLookupEvent`].
pub const NAME_MAX: usize = 256;
/// Bytes of a kernel name carried by a long lookup record (CUTLASS, FlashAttention and FlashInfer
/// names run to thousands of bytes); names longer than this are cut, and told apart by what fits.
pub const LONG_NAME_MAX: usize = 4096;

/// First field of every ring-buffer record.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventTag {
    /// A [`CallEvent`].
    Call = 1,
    /// A [`LookupEvent`].
    Lookup = 2,
    /// An [`ExitEvent`].
    Exit = 3,
    /// A [`NameEvent`].
    Name = 4,
    /// A [`FaultEvent`].
    Fault = 5,
    /// A [`LongLookupEvent`].
    LongLookup = 6,
}

/// `FaultEvent::code` when the siginfo could not be read.
pub const SI_CODE_UNKNOWN: i32 = i32::MAX;

/// A synchronous fault signal (SIGSEGV, SIGILL, SIGBUS, SIGTRAP) generated for a thread that
/// has hit a probe: where it faulted, and the thread's last probe hit, for the harm check.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultEvent {
    /// [`EventTag::Fault`].
    pub tag: u32,
    /// The signal.
    pub sig: u32,
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// `si_code` (SEGV_MAPERR, ILL_ILLOPC, ...; SI_USER and below: sent from user space;
    /// [`SI_CODE_UNKNOWN`]: could not be read).
    pub code: i32,
    /// 1 while the thread was inside a probed call (between entry and return).
    pub in_call: u32,
    /// The user program counter at the fault.
    pub pc: u64,
    /// `si_addr`: the faulting address.
    pub addr: u64,
    /// The probed entry address of the thread's last call.
    pub entry_ip: u64,
    /// The attach cookie of the thread's last call (its api).
    pub cookie: u64,
    /// Nanoseconds since the thread's last probe hit (its entry, or its return).
    pub since_hit_ns: u64,
}

/// A thread's name: written at a thread's first traced call (before that call's record), and
/// when a tracked process's leader is renamed (`prctl(PR_SET_NAME)`, a write to its comm,
/// exec). Call records carry no name; user space keeps each process's.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NameEvent {
    /// Always [`EventTag::Name`] as `u32`.
    pub tag: u32,
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// 1 for a rename, 0 for a thread's first call.
    pub renamed: u32,
    /// The name, NUL-padded.
    pub comm: [u8; 16],
}

/// A traced process has exited (its last thread, or its leader): user space drops its state.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ExitEvent {
    /// Always [`EventTag::Exit`] as `u32`.
    pub tag: u32,
    /// Process id.
    pub pid: u32,
    /// The leader's `task_struct.exit_code` as `wait(2)` reports it (`exit(n)`: `n << 8`; a
    /// signal: its number, `| 0x80` with a core dump), when [`EXIT_STATUS_KNOWN`] is set.
    pub status: i32,
    /// [`EXIT_STATUS_KNOWN`] when `status` was read.
    pub flags: u32,
}

/// [`ExitEvent::flags`]: the status was read.
pub const EXIT_STATUS_KNOWN: u32 = 1;

/// One completed driver call, written at the uretprobe. It carries no thread name: user space
/// reads its process's once and hears of a change from a [`NameEvent`].
///
/// `args` holds the call's arguments as the entry probe saw them; their meaning depends on the
/// [`crate::Layout`] of `api`:
/// - `Launch`: `[function, grid_x | grid_y << 32, grid_z | block_x << 32, block_y | block_z << 32,
///   shared_mem_bytes, stream]` (for `cuLaunchKernelEx` read from its `CUlaunchConfig`);
/// - every other layout: the first six integer arguments as they were (`rdi rsi rdx rcx r8 r9` on
///   x86-64, `x0`-`x5` on aarch64).
///
/// `out` is the value an out-parameter held after a successful return (`*dptr` of an allocation,
/// `*hfunc` of a lookup), else 0.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CallEvent {
    /// Always [`EventTag::Call`] or [`EventTag::Lookup`] as `u32`.
    pub tag: u32,
    /// The [`crate::Api`] id.
    pub api: u32,
    /// Process id (tgid).
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// `bpf_ktime_get_ns` at entry (CLOCK_MONOTONIC).
    pub start_ns: u64,
    /// Time from entry to return.
    pub duration_ns: u64,
    /// The `CUresult` returned (0 is success).
    pub result: i32,
    /// `FLAG_*` of [`crate::launches`]: whether the call is counted in-kernel already.
    pub flags: u32,
    /// Arguments, see the type's documentation.
    pub args: [u64; 6],
    /// Out-parameter value after return, or 0.
    pub out: u64,
}

/// A kernel-name lookup (`cuModuleGetFunction`, `cuLibraryGetKernel`) with the name read at return.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct LookupEvent {
    /// The call itself; `call.tag` is [`EventTag::Lookup`].
    pub call: CallEvent,
    /// The name, NUL-terminated unless it filled the buffer.
    pub name: [u8; NAME_MAX],
}

/// A kernel-name lookup whose name filled a [`LookupEvent`]'s: read again, up to
/// [`LONG_NAME_MAX`] bytes. Lookups are rare (at module load), so the size costs little.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct LongLookupEvent {
    /// The call itself; `call.tag` is [`EventTag::LongLookup`].
    pub call: CallEvent,
    /// The name, NUL-terminated unless it filled the buffer.
    pub name: [u8; LONG_NAME_MAX],
}

impl CallEvent {
    /// Grid dimensions of a launch record.
    pub fn grid(&self) -> [u32; 3] {
        [lo(self.args[1]), hi(self.args[1]), lo(self.args[2])]
    }
    /// Block dimensions of a launch record.
    pub fn block(&self) -> [u32; 3] {
        [hi(self.args[2]), lo(self.args[3]), hi(self.args[3])]
    }
}

/// Packs two `u32` into one slot the way launch records do.
pub const fn pack(lo: u32, hi: u32) -> u64 {
    lo as u64 | (hi as u64) << 32
}
const fn lo(v: u64) -> u32 {
    v as u32
}
const fn hi(v: u64) -> u32 {
    (v >> 32) as u32
}

// Record layouts, checked at compile time on both sides.
const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(size_of::<ExitEvent>() == 16 && offset_of!(ExitEvent, pid) == 4);
    assert!(offset_of!(ExitEvent, status) == 8 && offset_of!(ExitEvent, flags) == 12);
    assert!(size_of::<CallEvent>() == 96 && size_of::<NameEvent>() == 32);
    assert!(size_of::<FaultEvent>() == 64 && offset_of!(FaultEvent, pc) == 24);
    assert!(offset_of!(FaultEvent, cookie) == 48 && offset_of!(FaultEvent, since_hit_ns) == 56);
    assert!(
        offset_of!(CallEvent, api) == 4
            && offset_of!(CallEvent, pid) == 8
            && offset_of!(CallEvent, tid) == 12
    );
    assert!(offset_of!(CallEvent, start_ns) == 16 && offset_of!(CallEvent, duration_ns) == 24);
    assert!(offset_of!(CallEvent, result) == 32 && offset_of!(CallEvent, args) == 40);
    assert!(offset_of!(CallEvent, flags) == 36 && offset_of!(CallEvent, out) == 88);
    assert!(size_of::<LookupEvent>() == 96 + NAME_MAX && offset_of!(LookupEvent, name) == 96);
    assert!(size_of::<LongLookupEvent>() == 96 + LONG_NAME_MAX);
};

#[cfg(feature = "user")]
mod pod {
    // SAFETY: plain `#[repr(C)]` integers and arrays with explicit padding; any bit
    // pattern is valid.
    unsafe impl aya::Pod for super::CallEvent {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::LookupEvent {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::LongLookupEvent {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::ExitEvent {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::NameEvent {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::FaultEvent {}
}
