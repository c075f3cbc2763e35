//! Entry points handed out by `cuGetProcAddress_v2`, checked against the probes: the CUDA
//! runtime calls the driver through the addresses it returns, so an address that is not a
//! probed symbol's first instruction (a driver that hands out internal entry points) means
//! calls that no probe sees. Said once per process and entry point, and kept on the process.
//! Each name is checked once per process: the maps of a process that asks in a loop are read
//! at most `2 * MAX_UNPROBED` times over its life.
use tracer_common::Api;

use crate::{
    event::{Detail, Event},
    probe::{loader::LibraryProbes, proc_maps},
    registry::Process,
    text::printable,
};

/// Entry points remembered per process at most.
pub const MAX_UNPROBED: usize = 64;

/// Whether `symbol` is a probed entry point (or its per-thread variant, which the runtime asks
/// for by the plain name).
fn probed_name(symbol: &str) -> bool {
    Api::ALL.iter().any(|a| {
        let s = a.symbol();
        s == symbol
            || s.strip_prefix(symbol)
                .is_some_and(|rest| rest == "_ptsz" || rest == "_ptds")
    })
}

/// Checks one successful `cuGetProcAddress_v2` of `process` against `libraries`' probes.
pub fn check(libraries: &[LibraryProbes], process: &mut Process, ev: &Event) {
    let Detail::Resolve {
        symbol: Some(symbol),
        address,
    } = &ev.detail
    else {
        return;
    };
    if ev.result != 0 || *address == 0 || !probed_name(symbol) {
        return;
    }
    // Each name once (a probed name and its per-thread forms are fewer than MAX_UNPROBED * 2).
    if process.resolves_checked.iter().any(|s| s == symbol)
        || process.resolves_checked.len() >= 2 * MAX_UNPROBED
        || process.unprobed.len() >= MAX_UNPROBED
    {
        return;
    }
    process.resolves_checked.push(symbol.clone());
    let Ok(maps) = std::fs::File::open(format!("/proc/{}/maps", ev.pid)) else {
        return;
    };
    // No file mapping holds it (the process exited meanwhile, its maps read empty): nothing
    // can be said.
    let Some((m, offset)) = proc_maps::file_offset_of(maps, *address) else {
        return;
    };
    let probed = libraries
        .iter()
        .filter(|l| l.file == (m.dev, m.inode))
        .any(|l| l.resolution.found.iter().any(|r| r.offset == offset));
    if probed {
        return;
    }
    let place = format!("{} at offset {offset:#x}", printable(&m.path));
    log::warn!(
        target: "cudatrace::unprobed",
        pid = ev.pid,
        symbol = printable(symbol).as_ref();
        "cudatrace: pid {} ({}) was given {} by cuGetProcAddress_v2 at {address:#x} ({place}), which is not a probed entry point: its calls through it are not traced",
        ev.pid,
        printable(&process.comm),
        printable(symbol)
    );
    process.unprobed.push(symbol.clone());
}
