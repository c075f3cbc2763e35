//! `cudatrace sites`: what a Grace operator runs first. Reads each libcuda's probe sites and
//! says how the running kernel would run each (no probe is attached, no privilege needed),
//! then the known-bad kernel rows that apply and the totals `cudatrace_probe_sites` will show.
use std::time::Instant;

use anyhow::{bail, Result};

use crate::{
    cli::SitesArgs,
    probe::{
        discovery,
        guard::{hex, Guard},
        kernels::Action,
        sites::{SiteCounts, SitePath},
        symbols,
    },
    text::printable,
};

/// Runs `cudatrace sites`.
pub fn run(args: SitesArgs) -> Result<()> {
    let libs = if args.lib.is_empty() {
        discovery::loader_libraries()
    } else {
        args.lib.clone()
    };
    if libs.is_empty() {
        bail!("no libcuda.so.1 in the loader's directories; pass one with --lib");
    }
    // Every library is opened and read before anything is printed: a wrong --lib is one line.
    let mut opened = Vec::new();
    for lib in &libs {
        let read = symbols::open(lib).and_then(|(file, _)| {
            let r = symbols::resolve(&file, lib)?;
            Ok((file, r))
        });
        match read {
            Ok((_, r)) if r.found.is_empty() => bail!(
                "{} exports none of the CUDA driver entry points cudatrace probes: name a libcuda.so.1 with --lib PATH",
                printable(&lib.display().to_string())
            ),
            Ok(pair) => opened.push((lib.clone(), pair)),
            Err(e) => bail!("{e}: name a libcuda.so.1 with --lib PATH (`ldconfig -p | grep libcuda` lists the host's)"),
        }
    }
    let began = Instant::now();
    let guard = Guard::running(args.allow_stepped_probes);
    let refusing = guard
        .rows()
        .iter()
        .any(|r| r.action == Action::RefuseStepped && !args.allow_stepped_probes);
    let k = &guard.kernel;
    println!(
        "kernel {} ({}, version {}{}, pseudo-NMI {})",
        printable(&k.release),
        k.arch.name(),
        k.version,
        if k.exact {
            ""
        } else {
            ", stable level unknown"
        },
        if k.pseudo_nmi { "on" } else { "off" }
    );
    let mut total = SiteCounts::default();
    let mut sites_read = 0usize;
    for (lib, (file, resolution)) in &opened {
        for site in guard.sites(file, resolution) {
            sites_read += 1;
            let path = match site.path {
                SitePath::Stepped if refusing => {
                    SitePath::Refused("stepped, on a known-bad kernel (--allow-stepped-probes)")
                }
                p => p,
            };
            total.add(path);
            let why = match path {
                SitePath::Refused(why) => why,
                _ => "",
            };
            if args.json {
                println!(
                    "{}",
                    serde_json::json!({"library": lib.display().to_string(), "symbol": site.api.symbol(),
                        "offset": site.offset, "code": hex(&site.code), "path": path.name(), "why": why})
                );
            } else {
                println!(
                    "{:<36} {:#10x}  {:<24} {:<8} {}",
                    site.api.symbol(),
                    site.offset,
                    hex(&site.code),
                    path.name(),
                    why
                );
            }
        }
    }
    for row in guard.rows() {
        println!("known-bad: {} [{}]: {}", row.id, row.source, row.harm);
    }
    println!(
        "sites: {} emulated, {} stepped out of line, {} refused ({} read in {:.2} ms)",
        total.emulated,
        total.stepped,
        total.refused,
        sites_read,
        began.elapsed().as_secs_f64() * 1e3
    );
    Ok(())
}
