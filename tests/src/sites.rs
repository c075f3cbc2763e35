//! What a probe leaves in a process: the file offsets of the entry points a library exports
//! (read with `object`, independently of cudatrace), and the bytes at those places in a live
//! process (`/proc/PID/mem`) compared with the file's.
use std::{
    fs::File,
    os::unix::fs::FileExt as _,
    path::{Path, PathBuf},
};

use object::{Object as _, ObjectSegment as _, ObjectSymbol as _};
use tracer_common::Api;

/// `(symbol, file offset)` of every entry point cudatrace probes that `lib` exports.
pub fn probed_offsets(lib: &Path) -> Vec<(&'static str, u64)> {
    let data = std::fs::read(lib).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let segments: Vec<(u64, u64, u64)> = file
        .segments()
        .map(|s| (s.address(), s.size(), s.file_range().0))
        .collect();
    let mut out = Vec::new();
    for api in Api::ALL {
        let Some(sym) = file
            .dynamic_symbols()
            .find(|s| s.name() == Ok(api.symbol()) && s.is_definition())
        else {
            continue;
        };
        let a = sym.address();
        if let Some((addr, _, off)) = segments.iter().find(|(s, n, _)| (*s..s + n).contains(&a)) {
            out.push((api.symbol(), a - addr + off));
        }
    }
    out
}

/// The executable mappings of `lib`'s file in process `pid`: `(start, end, file offset)`.
fn mappings(pid: u64, lib: &Path) -> Vec<(u64, u64, u64)> {
    let want: PathBuf = std::fs::canonicalize(lib).unwrap();
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    maps.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() < 6 || !f[1].contains('x') || Path::new(f[5]) != want {
                return None;
            }
            let (s, e) = f[0].split_once('-')?;
            let hex = |x: &str| u64::from_str_radix(x, 16).ok();
            Some((hex(s)?, hex(e)?, hex(f[2])?))
        })
        .collect()
}

/// The probed places of `lib` in live process `pid` whose bytes differ from the file's (a
/// breakpoint left behind), as "symbol at address: memory / file"; `None` while the library is
/// not mapped (a remap in progress).
pub fn altered_sites(pid: u64, lib: &Path, offsets: &[(&'static str, u64)]) -> Option<Vec<String>> {
    let maps = mappings(pid, lib);
    if maps.is_empty() {
        return None;
    }
    let file = File::open(lib).unwrap();
    let mem = File::open(format!("/proc/{pid}/mem")).ok()?;
    let mut altered = Vec::new();
    for (symbol, off) in offsets {
        let (start, _, moff) = maps
            .iter()
            .find(|(s, e, o)| (*o..o + (e - s)).contains(off))?;
        let addr = start + off - moff;
        let (mut want, mut got) = ([0u8; 16], [0u8; 16]);
        file.read_exact_at(&mut want, *off).unwrap();
        mem.read_exact_at(&mut got, addr).ok()?;
        if want != got {
            altered.push(format!("{symbol} at {addr:#x}: {got:02x?} / {want:02x?}"));
        }
    }
    Some(altered)
}

/// `(emulated, stepped)` sites of `lib`'s probed entry points as objdump's disassembly names
/// their first instruction (x86-64: a push of a register, a call, a jump or a one-byte nop
/// is emulated; anything else stepped): independent of cudatrace's own decoder.
pub fn objdump_paths(lib: &Path) -> (u64, u64) {
    let out = std::process::Command::new("objdump")
        .args(["-d", "--no-show-raw-insn"])
        .arg(lib)
        .output()
        .expect("objdump (binutils) is needed");
    let text = String::from_utf8_lossy(&out.stdout);
    let probed: Vec<&str> = Api::ALL.iter().map(|a| a.symbol()).collect();
    let mut seen = std::collections::HashSet::new();
    let (mut emulated, mut stepped) = (0, 0);
    let mut lines = text.lines();
    while let Some(l) = lines.next() {
        // "0000000000003a00 <cuLaunchKernel>:" then the first instruction's line.
        let Some((addr, rest)) = l.split_once(" <") else {
            continue;
        };
        let Some(name) = rest.strip_suffix(">:") else {
            continue;
        };
        if !probed.contains(&name) || !seen.insert(addr.to_owned()) {
            continue;
        }
        let first = lines.next().unwrap_or("");
        let insn = first.split('\t').nth(1).unwrap_or("").trim();
        let mnemonic = insn.split_whitespace().next().unwrap_or("");
        let register_push = mnemonic == "push" && insn.contains('%');
        let branch = mnemonic == "call" || mnemonic.starts_with('j');
        if register_push || branch || insn == "nop" {
            emulated += 1;
        } else {
            stepped += 1;
        }
    }
    (emulated, stepped)
}
