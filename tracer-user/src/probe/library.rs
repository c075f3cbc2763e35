//! What is attached per library (`LibraryProbes`), its rows for the metrics (`ProbeRow`), its
//! start-up line (`report`), and the counts over all libraries.
use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
};

use tracer_common::Api;

use super::{discovery::FileKey, loader::Probes, sites::SiteCounts, symbols::Resolution};

/// The file's (device, inode).
pub fn file_key(file: &std::fs::File) -> std::io::Result<FileKey> {
    use std::os::unix::fs::MetadataExt as _;
    let meta = file.metadata()?;
    Ok((meta.dev(), meta.ino()))
}

/// The library's tag in its probes' cookies, from its file: never 0 (no tag). Two files may
/// share one (16 bits); a fault whose tag names two attached libraries is told by its maps.
pub fn tag_of(key: FileKey) -> u16 {
    let h = (key.0 ^ key.1.rotate_left(17)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    ((h >> 48) as u16).max(1)
}

/// What was attached in one library.
#[derive(Debug, Clone)]
pub struct LibraryProbes {
    /// The library as given (or found).
    pub path: PathBuf,
    /// Symbols resolved in the library, with their aliases and absentees.
    pub resolution: Resolution,
    /// The file probed: device and inode.
    pub file: FileKey,
    /// Its probe sites by how the kernel runs them.
    pub sites: SiteCounts,
}

impl LibraryProbes {
    pub(super) fn new(
        path: &Path,
        resolution: Resolution,
        file: FileKey,
        sites: SiteCounts,
    ) -> LibraryProbes {
        LibraryProbes {
            path: path.to_path_buf(),
            resolution,
            file,
            sites,
        }
    }
}

/// One entry point of one attached library.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeRow {
    /// The entry point's symbol.
    pub symbol: &'static str,
    /// The library's path.
    pub library: String,
    /// Whether it is probed (false: the library does not export it).
    pub attached: bool,
}

impl Probes {
    /// Probe sites of every attached library, by path.
    pub fn site_counts(&self) -> SiteCounts {
        let mut all = SiteCounts::default();
        for l in &self.libraries {
            all.emulated += l.sites.emulated;
            all.stepped += l.sites.stepped;
            all.refused += l.sites.refused;
        }
        all
    }

    /// Number of probes (entry plus return) attached in all libraries.
    pub fn probe_count(&self) -> usize {
        self.libraries
            .iter()
            .map(|l| l.resolution.found.len() * 2)
            .sum()
    }

    /// Every entry point of every attached library, attached or not.
    pub fn rows(&self) -> Vec<ProbeRow> {
        let mut rows = Vec::new();
        for lib in &self.libraries {
            let library = lib.path.display().to_string();
            let r = &lib.resolution;
            let row = |symbol, attached| ProbeRow {
                symbol,
                library: library.clone(),
                attached,
            };
            rows.extend(r.found.iter().map(|f| row(f.api.symbol(), true)));
            rows.extend(r.aliases.iter().map(|(a, _)| row(a.symbol(), true)));
            rows.extend(r.missing.iter().map(|a| row(a.symbol(), false)));
            rows.extend(r.refused.iter().map(|a| row(a.symbol(), false)));
        }
        rows
    }
}

/// One line per library: attached symbols, aliases and the entry points it does not export.
pub fn report(lib: &LibraryProbes) -> String {
    let r = &lib.resolution;
    let mut s = format!(
        "{}: attached {} of {} entry points (inode {} on device {}:{})",
        lib.path.display(),
        r.found.len(),
        Api::ALL.len(),
        lib.file.1,
        libc::major(lib.file.0),
        libc::minor(lib.file.0)
    );
    if !r.aliases.is_empty() {
        let aliases: Vec<String> = r
            .aliases
            .iter()
            .map(|(a, b)| format!("{}={}", a.symbol(), b.symbol()))
            .collect();
        let _ = write!(s, "; same code as an attached one: {}", aliases.join(" "));
    }
    if !r.missing.is_empty() {
        let missing: Vec<&str> = r.missing.iter().map(|a| a.symbol()).collect();
        let _ = write!(s, "; not exported: {}", missing.join(" "));
    }
    if !r.refused.is_empty() {
        let refused: Vec<&str> = r.refused.iter().map(|a| a.symbol()).collect();
        let _ = write!(s, "; refused sites: {}", refused.join(" "));
    }
    let _ = write!(
        s,
        "; sites: {} emulated, {} stepped out of line ({})",
        lib.sites.emulated,
        lib.sites.stepped,
        super::kernels::Arch::HOST.name()
    );
    s
}
