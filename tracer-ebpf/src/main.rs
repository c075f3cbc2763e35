//! eBPF programs of cudatrace: one entry program per argument layout (the api id arrives in the
//! attach cookie), one return program that turns the saved entry into a ring-buffer record (or an
//! in-kernel count), the exit hook and the rename hook. Map and program names are tracer-common's (`names`).
#![no_std]
#![no_main]
// atomic_xadd: the BPF target has atomic adds but no compare-and-swap, so core::sync::atomic
// offers no fetch_add there.
#![allow(internal_features)]
// The maps take keys and values as `impl Borrow<K>`: a reference keeps them in place on the
// BPF stack instead of copying them into the call.
#![allow(clippy::needless_borrows_for_generic_args)]
#![feature(core_intrinsics)]

mod aggregate;
mod arch;
mod entry;
mod maps;
mod probes;
mod session;
mod slots;
mod window;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // The verifier rejects any reachable panic path, so this is never executed.
    loop {}
}

// bpf_probe_read_user and bpf_get_current_comm are GPL-only helpers.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
