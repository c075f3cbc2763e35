//! A library's symbols read without loading the file: the ELF header checked first (64 bytes),
//! then only the ranges the parser asks for (headers, symbol and string tables), each read once
//! and kept, and never more than [`MAX_SYMBOL_READ`] bytes in all. A sparse 1 GiB file, or one
//! whose headers claim a 1 GiB symbol table, costs a refusal, not the memory.
use std::{cell::Cell, fs::File, ops::Range, os::unix::fs::FileExt as _};

use object::{read::ReadCache, ReadRef};

/// Bytes read from one library at most to find its entry points (NVIDIA's libcuda needs well
/// under 1 MiB: its dynamic symbol and string tables and its headers).
pub const MAX_SYMBOL_READ: u64 = 16 << 20;

/// `e_machine` of the architecture this binary runs on: a library built for another cannot be
/// the one a process here runs.
#[cfg(target_arch = "x86_64")]
const MACHINE: u16 = 62;
#[cfg(target_arch = "aarch64")]
const MACHINE: u16 = 183;

/// Why the first 64 bytes are not those of a 64-bit little-endian shared library for this
/// architecture (`None`: they are).
pub fn header_refusal(file: &File) -> Option<String> {
    let mut h = [0u8; 64];
    match file.read_at(&mut h, 0) {
        Ok(64) => {}
        Ok(n) => return Some(format!("it is {n} bytes, shorter than an ELF header")),
        Err(e) => return Some(format!("its header cannot be read ({e})")),
    }
    if h[..4] != *b"\x7fELF" {
        return Some("it does not start with the ELF magic".into());
    }
    if h[4] != 2 || h[5] != 1 {
        return Some("it is not a 64-bit little-endian ELF object".into());
    }
    let e_type = u16::from_le_bytes([h[16], h[17]]);
    if e_type != 3 {
        return Some(format!("its ELF type is {e_type}, not a shared object (3)"));
    }
    let machine = u16::from_le_bytes([h[18], h[19]]);
    if machine != MACHINE {
        return Some(format!(
            "it is built for ELF machine {machine}, not this host's ({MACHINE})"
        ));
    }
    None
}

/// A file read through a cache, with a budget of bytes checked before anything is allocated.
pub struct Bounded<'f> {
    cache: ReadCache<&'f File>,
    left: Cell<u64>,
}

impl<'f> Bounded<'f> {
    /// Reads of `file`, at most `budget` bytes in all.
    pub fn new(file: &'f File, budget: u64) -> Bounded<'f> {
        Bounded {
            cache: ReadCache::new(file),
            left: Cell::new(budget),
        }
    }

    /// Whether the budget ran out (a read was refused for it).
    pub fn exhausted(&self) -> bool {
        self.left.get() == 0
    }

    fn spend(&self, bytes: u64) -> Result<(), ()> {
        match self.left.get().checked_sub(bytes) {
            Some(left) => {
                self.left.set(left);
                Ok(())
            }
            None => {
                self.left.set(0);
                Err(())
            }
        }
    }
}

impl<'a> ReadRef<'a> for &'a Bounded<'_> {
    fn len(self) -> Result<u64, ()> {
        (&self.cache).len()
    }

    fn read_bytes_at(self, offset: u64, size: u64) -> Result<&'a [u8], ()> {
        // A range read before costs nothing again (the cache keeps it), but the parser asks
        // for each table once or twice, so charging every ask bounds the memory all the same.
        self.spend(size)?;
        (&self.cache).read_bytes_at(offset, size)
    }

    fn read_bytes_at_until(self, range: Range<u64>, delimiter: u8) -> Result<&'a [u8], ()> {
        // The cache reads at most 4 KiB for one string; what it keeps is charged.
        let name = (&self.cache).read_bytes_at_until(range, delimiter)?;
        self.spend(name.len() as u64 + 32)?;
        Ok(name)
    }
}
