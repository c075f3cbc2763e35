//! Resolves the probed driver entry points in one library: one ELF parse per library instead of
//! one per attach, and symbols that alias one address are attached once (a second uprobe on the
//! same instruction would count every call twice).
use std::{
    collections::HashMap,
    fs::{File, Metadata},
    os::unix::fs::OpenOptionsExt as _,
    path::Path,
};

use object::{Object, ObjectSection, ObjectSymbol, ReadRef};

mod bounded;
pub mod debug_state;

pub use bounded::{header_refusal, MAX_SYMBOL_READ};
use thiserror::Error;
use tracer_common::Api;

/// Largest library read (NVIDIA's libcuda is about 30 to 100 MiB): a huge sparse file named
/// like one is refused, not read.
pub const MAX_LIBRARY_BYTES: u64 = 2 << 30;

/// The size cap in force ([`MAX_LIBRARY_BYTES`] unless the config's `max_library_mib` says).
static LIBRARY_CAP: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(MAX_LIBRARY_BYTES);

/// Sets the largest library file read (the config's `max_library_mib`), before anything is read.
pub fn set_max_library_bytes(bytes: u64) {
    LIBRARY_CAP.store(bytes, std::sync::atomic::Ordering::Relaxed);
}

fn cap() -> u64 {
    LIBRARY_CAP.load(std::sync::atomic::Ordering::Relaxed)
}

/// Why a library's symbols could not be read.
#[derive(Debug, Error)]
pub enum SymbolError {
    /// Not a regular file (a FIFO, a device, a directory): never read.
    #[error("{path} is not a regular file (a FIFO, a device or a directory): not attached")]
    NotRegular {
        /// The library.
        path: String,
    },
    /// Larger than [`MAX_LIBRARY_BYTES`].
    #[error("{path} is {bytes} bytes, over the {max} byte limit for a library: not attached")]
    TooLarge {
        /// The library.
        path: String,
        /// Its size.
        bytes: u64,
        /// The limit.
        max: u64,
    },
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The library.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The first 64 bytes are not a shared library's for this architecture: nothing more read.
    #[error("{path} is not a shared library for this host: {why}; not attached")]
    NotElf {
        /// The library.
        path: String,
        /// What its header says.
        why: String,
    },
    /// Its symbol tables would take more than [`MAX_SYMBOL_READ`] bytes to read.
    #[error("{path}: reading its symbols needs over {max} bytes (its headers claim huge tables); not attached")]
    TablesTooLarge {
        /// The library.
        path: String,
        /// The budget.
        max: u64,
    },
    /// The file is not an ELF object.
    #[error("{path} is not an ELF shared library: {source}")]
    Parse {
        /// The library.
        path: String,
        /// The parse error.
        source: object::Error,
    },
}

/// Where one api's code sits in the library file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    /// The api.
    pub api: Api,
    /// File offset of the function's first instruction (what uprobes attach to).
    pub offset: u64,
    /// The attached library's tag (`tracer_common::api::COOKIE_LIBRARY_SHIFT`; 0 until attached).
    pub tag: u16,
}

impl Resolved {
    /// The attach cookie: the api's, with the library's tag.
    pub fn cookie(&self) -> u64 {
        self.api.cookie() | (u64::from(self.tag) << tracer_common::api::COOKIE_LIBRARY_SHIFT)
    }
}

/// The outcome of resolving every [`Api`] in one library.
#[derive(Clone, Debug, Default)]
pub struct Resolution {
    /// Apis to attach, one per distinct offset.
    pub found: Vec<Resolved>,
    /// Apis the library does not export.
    pub missing: Vec<Api>,
    /// Apis exported at the same offset as an earlier one: `(alias, attached_as)`.
    pub aliases: Vec<(Api, Api)>,
    /// Apis exported but not attached: their site was refused (`guard`).
    pub refused: Vec<Api>,
}

impl Resolution {
    /// Tags every entry point found with the library's tag (its cookies carry it).
    pub fn set_tag(&mut self, tag: u16) {
        self.found.iter_mut().for_each(|r| r.tag = tag);
    }
}

/// Opens a library to read and probe it: without blocking (a FIFO put at a library's path
/// cannot hang the caller), and only a regular file of at most [`MAX_LIBRARY_BYTES`] (not
/// `/dev/zero`, not a huge sparse file). The open file is what gets read and probed, so a path
/// changed in between cannot swap it.
pub fn open(path: &Path) -> Result<(File, Metadata), SymbolError> {
    let read_error = |source| SymbolError::Read {
        path: path.display().to_string(),
        source,
    };
    let file = File::options()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(path)
        .map_err(read_error)?;
    let meta = check(&file, path)?;
    Ok((file, meta))
}

/// The metadata of an open `file` when it is a regular file of at most [`MAX_LIBRARY_BYTES`].
pub fn check(file: &File, path: &Path) -> Result<Metadata, SymbolError> {
    let meta = file.metadata().map_err(|source| SymbolError::Read {
        path: path.display().to_string(),
        source,
    })?;
    if !meta.is_file() {
        return Err(SymbolError::NotRegular {
            path: path.display().to_string(),
        });
    }
    if meta.len() > cap() {
        return Err(SymbolError::TooLarge {
            path: path.display().to_string(),
            bytes: meta.len(),
            max: cap(),
        });
    }
    Ok(meta)
}

/// Resolves every [`Api`] exported by the open library `file` (`path` names it in errors): its
/// ELF header checked first, then only its headers and symbol tables read, at most
/// [`MAX_SYMBOL_READ`] bytes (the file is never loaded whole).
pub fn resolve(file: &File, path: &Path) -> Result<Resolution, SymbolError> {
    if let Some(why) = header_refusal(file) {
        return Err(SymbolError::NotElf {
            path: path.display().to_string(),
            why,
        });
    }
    let reads = bounded::Bounded::new(file, MAX_SYMBOL_READ);
    let parsed = object::File::parse(&reads);
    let too_large = || SymbolError::TablesTooLarge {
        path: path.display().to_string(),
        max: MAX_SYMBOL_READ,
    };
    let parsed = match parsed {
        Err(_) if reads.exhausted() => return Err(too_large()),
        other => other,
    };
    let res = resolve_object(parsed, path)?;
    if reads.exhausted() {
        return Err(too_large());
    }
    Ok(res)
}

/// Resolves every [`Api`] exported by the ELF image `data` (`path` names it in errors).
pub fn resolve_bytes(data: &[u8], path: &Path) -> Result<Resolution, SymbolError> {
    resolve_object(object::File::parse(data), path)
}

/// Resolves every [`Api`] in a parsed ELF object.
fn resolve_object<'d, R: ReadRef<'d>>(
    parsed: object::Result<object::File<'d, R>>,
    path: &Path,
) -> Result<Resolution, SymbolError> {
    let file = parsed.map_err(|source| SymbolError::Parse {
        path: path.display().to_string(),
        source,
    })?;
    let wanted: HashMap<&str, Api> = Api::ALL.iter().map(|a| (a.symbol(), *a)).collect();
    let mut offsets: HashMap<Api, u64> = HashMap::new();
    for sym in file.dynamic_symbols().chain(file.symbols()) {
        if sym.is_undefined() || !matches!(sym.kind(), object::SymbolKind::Text) {
            continue;
        }
        let Ok(name) = sym.name() else { continue };
        // Versioned names (`cuInit@@libcuda.so.1`) are stored without the version in dynsym.
        let Some(api) = wanted.get(name).copied() else {
            continue;
        };
        if offsets.contains_key(&api) {
            continue;
        }
        if let Some(offset) = file_offset(&file, &sym) {
            offsets.insert(api, offset);
        }
    }
    let mut res = Resolution::default();
    let mut by_offset: HashMap<u64, Api> = HashMap::new();
    for api in Api::ALL {
        match offsets.get(api) {
            None => res.missing.push(*api),
            Some(&offset) => match by_offset.get(&offset) {
                Some(first) => res.aliases.push((*api, *first)),
                None => {
                    by_offset.insert(offset, *api);
                    res.found.push(Resolved {
                        api: *api,
                        offset,
                        tag: 0,
                    });
                }
            },
        }
    }
    Ok(res)
}

/// Exported `cu*` functions listed at most (NVIDIA's libcuda exports about 800).
pub const MAX_EXPORTED: usize = 4096;

/// Every exported function whose name begins with `cu`, with its file offset, in name order;
/// one name per offset (an alias of an earlier one is left out), at most [`MAX_EXPORTED`].
pub fn exported_cu(data: &[u8], path: &Path) -> Result<Vec<(String, u64)>, SymbolError> {
    let file = object::File::parse(data).map_err(|source| SymbolError::Parse {
        path: path.display().to_string(),
        source,
    })?;
    let mut by_name: std::collections::BTreeMap<String, u64> = std::collections::BTreeMap::new();
    for sym in file.dynamic_symbols() {
        if sym.is_undefined() || !sym.is_global() || !matches!(sym.kind(), object::SymbolKind::Text)
        {
            continue;
        }
        let Ok(name) = sym.name() else { continue };
        if !name.starts_with("cu") || by_name.len() >= MAX_EXPORTED {
            continue;
        }
        if let Some(offset) = file_offset(&file, &sym) {
            by_name.entry(name.to_owned()).or_insert(offset);
        }
    }
    let mut seen = std::collections::HashSet::new();
    Ok(by_name
        .into_iter()
        .filter(|(_, offset)| seen.insert(*offset))
        .collect())
}

/// Translates a symbol's virtual address into the file offset uprobes are attached by.
pub(crate) fn file_offset<'d, R: ReadRef<'d>>(
    file: &object::File<'d, R>,
    sym: &object::Symbol<'d, '_, R>,
) -> Option<u64> {
    let section = file.section_by_index(sym.section_index()?).ok()?;
    let (offset, _) = section.file_range()?;
    sym.address()
        .checked_sub(section.address())?
        .checked_add(offset)
}
