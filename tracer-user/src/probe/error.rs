//! Why a library was not attached, as callers branch on it (one library named with `--lib`:
//! its error is the command's; discovery: said and retried).
use std::{fs::File, fs::Metadata, path::Path};

use thiserror::Error;

use super::symbols::{self, SymbolError};

/// A library that was not attached; each displays as the one line the user reads.
#[derive(Debug, Error)]
pub enum AttachError {
    /// No file at the path.
    #[error(
        "library not found: {path} ({why}); pass the path of a libcuda.so.1 with --lib \
         (`ldconfig -p | grep libcuda` lists the host's)"
    )]
    NotFound {
        /// The path given.
        path: String,
        /// The I/O error.
        why: std::io::Error,
    },
    /// Not one of the host's files `--lib-allow` (or `lib_allow`) names.
    #[error("{path}: not attached: not one of the host's files --lib-allow names ({allowed})")]
    NotAllowed {
        /// The library.
        path: String,
        /// The allow list, described.
        allowed: String,
    },
    /// `max_libraries` distinct files are attached already.
    #[error("{path}: not attached: {max} distinct libraries are attached already (max_libraries)")]
    TooMany {
        /// The library.
        path: String,
        /// The limit.
        max: usize,
    },
    /// The tenant that maps it holds its share of the slots already.
    #[error("{path}: not attached: its tenant {tenant} holds {share} libraries already (half of max_libraries); it is attached when one of them is given back")]
    TenantFull {
        /// The library.
        path: String,
        /// The tenant (pod, user, cgroup).
        tenant: String,
        /// Its share.
        share: usize,
    },
    /// The file exports none of the probed entry points.
    #[error(
        "{path} exports none of the CUDA driver entry points cudatrace probes: is it a libcuda.so.1?"
    )]
    NotLibcuda {
        /// The library.
        path: String,
    },
    /// The probe-harm breaker of this file is open.
    #[error("{path}: not attached: the probe-harm breaker is open for this file since {since} ({evidence}); after a fix, `cudatrace breaker --clear {path}` closes it")]
    BreakerOpen {
        /// The library.
        path: String,
        /// When it opened.
        since: String,
        /// What opened it.
        evidence: String,
    },
    /// Every entry point's site was refused (see the lines before this one).
    #[error("{path}: not attached: every probe site was refused ({why})")]
    AllRefused {
        /// The library.
        path: String,
        /// What refused the last one.
        why: String,
    },
    /// The file could not be used (not regular, too large, unreadable, not ELF).
    #[error(transparent)]
    Symbols(#[from] SymbolError),
    /// The kernel refused a program or a probe.
    #[error("{0:#}")]
    Kernel(anyhow::Error),
}

/// Opens a library to attach: not found is [`AttachError::NotFound`], anything else the file
/// refuses is [`AttachError::Symbols`].
pub fn open_library(path: &Path) -> Result<(File, Metadata), AttachError> {
    symbols::open(path).map_err(|e| match e {
        SymbolError::Read { path, source } if source.kind() == std::io::ErrorKind::NotFound => {
            AttachError::NotFound { path, why: source }
        }
        e => AttachError::Symbols(e),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_path_and_a_directory_are_told_apart() {
        let missing = open_library(Path::new("/nonexistent/libcuda.so.1")).unwrap_err();
        assert!(
            matches!(&missing, AttachError::NotFound { path, .. } if path == "/nonexistent/libcuda.so.1"),
            "{missing:?}"
        );
        assert!(missing.to_string().starts_with(
            "library not found: /nonexistent/libcuda.so.1 (No such file or directory (os error 2)); pass"
        ));
        let dir = open_library(Path::new("/")).unwrap_err();
        assert!(
            matches!(dir, AttachError::Symbols(SymbolError::NotRegular { .. })),
            "{dir:?}"
        );
    }

    #[test]
    fn an_elf_without_entry_points_exports_none() {
        // Any ELF file of the host without the driver's symbols: the test binary itself.
        let exe = std::env::current_exe().unwrap();
        let (file, _) = open_library(&exe).unwrap();
        let resolution = symbols::resolve(&file, &exe).unwrap();
        assert!(resolution.found.is_empty());
    }
}
