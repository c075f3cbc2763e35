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
