//! Before any probe is attached: every site's instruction, read from the file and classified by
//! the running kernel's rules (`sites`), and the known-bad kernel table (`kernels`) applied.
//! Refused sites are never tried, each said in one line; on a kernel whose row refuses stepped
//! sites, those go too unless `--allow-stepped-probes`.
use std::{fs::File, os::unix::fs::FileExt as _, path::Path};

use tracer_common::Api;

use super::{
    kernels::{applying, Action, Kernel, KnownBad},
    sites::{classify, SiteCounts, SitePath},
    symbols::Resolution,
};

/// The kernel's facts and the operator's choice, fixed for the session.
#[derive(Clone, Debug)]
pub struct Guard {
    /// The running kernel.
    pub kernel: Kernel,
    /// `--allow-stepped-probes`: attach stepped sites even where a known-bad row refuses them.
    pub allow_stepped: bool,
}

/// One site's verdict.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Site {
    /// The entry point (the first of those sharing the address).
    pub api: Api,
    /// File offset.
    pub offset: u64,
    /// The instruction's first bytes, for the lines.
    pub code: Vec<u8>,
    /// How it runs, or why it is not attached.
    pub path: SitePath,
}

impl Guard {
    /// The running kernel, with the operator's choice.
    pub fn running(allow_stepped: bool) -> Guard {
        Guard {
            kernel: Kernel::running(),
            allow_stepped,
        }
    }

    /// The known-bad rows that apply here.
    pub fn rows(&self) -> Vec<&'static KnownBad> {
        applying(&self.kernel)
    }

    /// The row refusing stepped sites, unless the operator allowed them.
    fn refusing_stepped(&self) -> Option<&'static KnownBad> {
        if self.allow_stepped {
            return None;
        }
        self.rows()
            .into_iter()
            .find(|r| r.action == Action::RefuseStepped)
    }

    /// Each found site of `resolution` in `file`, classified.
    pub fn sites(&self, file: &File, resolution: &Resolution) -> Vec<Site> {
        resolution
            .found
            .iter()
            .map(|r| {
                let mut code = vec![0u8; 16];
                let n = file.read_at(&mut code, r.offset).unwrap_or(0);
                code.truncate(n);
                let path = classify(&self.kernel, r.offset, &code);
                code.truncate(n.min(8));
                Site {
                    api: r.api,
                    offset: r.offset,
                    code,
                    path,
                }
            })
            .collect()
    }

    /// Drops the refused sites from `resolution` (their aliases too), saying each in a line;
    /// returns the counts by path of what stays and is refused.
    pub fn apply(&self, path: &Path, file: &File, resolution: &mut Resolution) -> SiteCounts {
        let stepped_refused = self.refusing_stepped();
        let mut counts = SiteCounts::default();
        let mut refused: Vec<Api> = Vec::new();
        for site in self.sites(file, resolution) {
            let verdict = match (site.path, stepped_refused) {
                (SitePath::Stepped, Some(row)) => SitePath::Refused(row.harm),
                (p, _) => p,
            };
            counts.add(verdict);
            if let SitePath::Refused(why) = verdict {
                let opt_in = match (site.path, stepped_refused) {
                    (SitePath::Stepped, Some(row)) => format!(
                        " (known-bad kernel {}: {}; --allow-stepped-probes or the chart's \
                         probes.allowStepped attaches it anyway)",
                        row.id, row.source
                    ),
                    _ => String::new(),
                };
                log::warn!(
                    target: "cudatrace::site_refused",
                    symbol = site.api.symbol(), offset = site.offset;
                    "cudatrace: {} in {} not probed: site at file offset {:#x} ({}) is refused: {why}{opt_in}",
                    site.api.symbol(),
                    path.display(),
                    site.offset,
                    hex(&site.code),
                );
                refused.push(site.api);
            }
        }
        resolution.found.retain(|r| !refused.contains(&r.api));
        let (gone, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut resolution.aliases)
            .into_iter()
            .partition(|(_, to)| refused.contains(to));
        resolution.aliases = kept;
        refused.extend(gone.into_iter().map(|(a, _)| a));
        resolution.refused = refused;
        counts
    }

    /// One line per known-bad row that applies (said once at start).
    pub fn say_rows(&self) {
        for row in self.rows() {
            let what = match row.action {
                Action::RefuseStepped if self.allow_stepped => {
                    "stepped sites attached anyway (--allow-stepped-probes)"
                }
                Action::RefuseStepped => {
                    "stepped sites are not attached; --allow-stepped-probes (chart: probes.allowStepped) attaches them"
                }
                Action::RefuseSites => "the sites it names are not attached",
                Action::Warn => "attached; watch for cudatrace_probe_harm_total",
            };
            log::warn!(
                target: "cudatrace::known_bad_kernel",
                row = row.id;
                "cudatrace: kernel {} ({}) is known-bad for uprobes: {} [{}]: {what}",
                self.kernel.release,
                self.kernel.arch.name(),
                row.harm,
                row.source,
            );
        }
    }
}

/// Bytes as hex, for a line.
pub fn hex(code: &[u8]) -> String {
    code.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use super::*;
    use crate::probe::{kernels::Arch, symbols::Resolved};

    /// A file with these instruction bytes at offsets 0x100, 0x200, ...
    fn file_with(codes: &[&[u8]]) -> (File, std::path::PathBuf) {
        let path = std::env::temp_dir().join(format!(
            "cudatrace-guard-{}-{}",
            std::process::id(),
            codes.len()
        ));
        let mut bytes = vec![0u8; 0x100 * (codes.len() + 1) + 16];
        for (i, c) in codes.iter().enumerate() {
            bytes[0x100 * (i + 1)..0x100 * (i + 1) + c.len()].copy_from_slice(c);
        }
        std::fs::File::create(&path)
            .unwrap()
            .write_all(&bytes)
            .unwrap();
        (File::open(&path).unwrap(), path)
    }

    fn resolution(apis: &[Api]) -> Resolution {
        Resolution {
            found: apis
                .iter()
                .enumerate()
                .map(|(i, a)| Resolved {
                    api: *a,
                    offset: 0x100 * (i as u64 + 1),
                    tag: 0,
                })
                .collect(),
            ..Resolution::default()
        }
    }

    #[test]
    fn refused_sites_and_their_aliases_are_never_attached() {
        let guard = Guard {
            kernel: Kernel::from_fixture("6.18.44", "", "", "", Arch::X86_64),
            allow_stepped: false,
        };
        // push %rbp (emulated), lock add (refused), int3 (refused), sub $8,%rsp (stepped).
        let (file, path) = file_with(&[
            &[0x55],
            &[0xf0, 0x01, 0x07],
            &[0xcc],
            &[0x48, 0x83, 0xec, 8],
        ]);
        let mut r = resolution(&[
            Api::LaunchKernel,
            Api::CtxSynchronize,
            Api::MemAlloc,
            Api::MemFree,
        ]);
        r.aliases.push((Api::CtxSynchronizeV2, Api::CtxSynchronize));
        let counts = guard.apply(&path, &file, &mut r);
        assert_eq!(
            counts,
            SiteCounts {
                emulated: 1,
                stepped: 1,
                refused: 2
            }
        );
        let kept: Vec<Api> = r.found.iter().map(|f| f.api).collect();
        assert_eq!(kept, vec![Api::LaunchKernel, Api::MemFree]);
        assert_eq!(
            r.refused,
            vec![Api::CtxSynchronize, Api::MemAlloc, Api::CtxSynchronizeV2]
        );
        assert!(r.aliases.is_empty());
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn a_known_bad_kernel_refuses_stepped_sites_unless_allowed() {
        let grace = Kernel::from_fixture(
            "6.17.0-1004-nvidia-64k",
            "",
            "Ubuntu 6.17.0-1004.4-nvidia-64k 6.17.1",
            "irqchip.gicv3_pseudo_nmi=1",
            Arch::Aarch64,
        );
        // bl (emulated), paciasp (stepped), stp x29, x30 (stepped).
        let (file, path) = file_with(&[
            &0x9400_0010u32.to_le_bytes(),
            &0xd503_233fu32.to_le_bytes(),
            &0xa9bf_7bfdu32.to_le_bytes(),
        ]);
        let apis = [Api::LaunchKernel, Api::MemAlloc, Api::MemFree];
        let refusing = Guard {
            kernel: grace.clone(),
            allow_stepped: false,
        };
        let mut r = resolution(&apis);
        let c = refusing.apply(&path, &file, &mut r);
        assert_eq!((c.emulated, c.stepped, c.refused), (1, 0, 2));
        assert_eq!(r.found.len(), 1);
        let allowing = Guard {
            kernel: grace,
            allow_stepped: true,
        };
        let mut r = resolution(&apis);
        let c = allowing.apply(&path, &file, &mut r);
        assert_eq!((c.emulated, c.stepped, c.refused), (1, 2, 0));
        assert_eq!(r.found.len(), 3);
        let _ = std::fs::remove_file(path);
    }
}
