//! Where discovery's loader hook goes in a dynamic loader file: the file offset of its
//! `_dl_debug_state` (what the uprobe is attached by) and the distance from it to `_r_debug`
//! (the link's cookie, so that the program finds the object list from the address it probes).
//! The loader is a tenant's file as much as the host's: its headers and symbol tables are read
//! bounded, and the probed function must be exactly an empty one (a bare return, after a
//! branch-target marker at most), so that a crafted file cannot make cudatrace probe the middle
//! of an instruction or anything but a return.
use std::{fs::File, os::unix::fs::FileExt as _, path::Path};

use object::{Object, ObjectSymbol};

use super::{bounded::Bounded, file_offset, header_refusal, MAX_SYMBOL_READ};

/// Where the hook goes in one loader file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DebugState {
    /// File offset of the probed function.
    pub offset: u64,
    /// `_r_debug`'s address minus the probed function's, as the link's cookie (wrapping).
    pub cookie: u64,
}

/// The bodies an empty function may have: x86-64 `ret`, or `endbr64; ret`; aarch64 `ret`, or
/// `bti c; ret` (or `paciasp`-free `hint` markers).
#[cfg(not(target_arch = "aarch64"))]
const EMPTY: &[&[u8]] = &[&[0xc3], &[0xf3, 0x0f, 0x1e, 0xfa, 0xc3]];
#[cfg(target_arch = "aarch64")]
const EMPTY: &[&[u8]] = &[
    &[0xc0, 0x03, 0x5f, 0xd6],
    &[0x5f, 0x24, 0x03, 0xd5, 0xc0, 0x03, 0x5f, 0xd6],
];

/// Reads where the hook goes in the open loader `file` (`path` names it in errors): `symbol`
/// (`_dl_debug_state` unless a test names another) and `debug` (`_r_debug`), both exported.
pub fn debug_state(
    file: &File,
    path: &Path,
    symbol: &str,
    debug: &str,
) -> Result<DebugState, String> {
    let shown = path.display();
    if let Some(why) = header_refusal(file) {
        return Err(format!("{shown} is not a loader: {why}"));
    }
    let reads = Bounded::new(file, MAX_SYMBOL_READ);
    let parsed = object::File::parse(&reads).map_err(|e| {
        if reads.exhausted() {
            format!("{shown}: its symbol tables exceed {MAX_SYMBOL_READ} bytes")
        } else {
            format!("{shown} is not a loader: {e}")
        }
    })?;
    let (mut probed, mut list) = (None, None);
    for sym in parsed.dynamic_symbols() {
        if sym.is_undefined() || (probed.is_some() && list.is_some()) {
            continue;
        }
        match sym.name() {
            Ok(n) if n == symbol && probed.is_none() => {
                probed = file_offset(&parsed, &sym).map(|o| (o, sym.address()))
            }
            Ok(n) if n == debug && list.is_none() => list = Some(sym.address()),
            _ => {}
        }
    }
    let Some((offset, at)) = probed else {
        return Err(format!("{shown} exports no {symbol}"));
    };
    let Some(list) = list else {
        return Err(format!("{shown} exports no {debug}"));
    };
    let mut body = [0u8; 8];
    let n = file
        .read_at(&mut body, offset)
        .map_err(|e| format!("cannot read {symbol} in {shown}: {e}"))?;
    if !EMPTY.iter().any(|e| body[..n].starts_with(e)) {
        return Err(format!(
            "{symbol} in {shown} is not an empty function ({:02x?}): not probed",
            &body[..n]
        ));
    }
    Ok(DebugState {
        offset,
        cookie: list.wrapping_sub(at),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This machine's own loader: glibc's exports both, and its `_dl_debug_state` is empty.
    #[test]
    fn the_hosts_loader_has_an_empty_debug_state() {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let path = maps
            .lines()
            .filter_map(|l| l.split_whitespace().nth(5))
            .find(|p| p.rsplit('/').next().is_some_and(|n| n.starts_with("ld-")))
            .expect("this test binary is dynamically linked");
        let file = File::open(path).unwrap();
        let site = debug_state(&file, Path::new(path), "_dl_debug_state", "_r_debug").unwrap();
        assert!(site.offset > 0);
        assert_ne!(site.cookie, 0);
        // A function that is not empty is refused.
        let refused = debug_state(&file, Path::new(path), "_dl_catch_exception", "_r_debug");
        assert!(
            refused
                .as_ref()
                .is_err_and(|e| e.contains("is not an empty function")),
            "{refused:?}"
        );
        let missing = debug_state(&file, Path::new(path), "no_such_symbol", "_r_debug");
        assert_eq!(missing, Err(format!("{path} exports no no_such_symbol")));
        // Not an ELF file.
        let text = File::open("/proc/self/maps").unwrap();
        assert!(debug_state(&text, Path::new("maps"), "_dl_debug_state", "_r_debug").is_err());
    }
}
