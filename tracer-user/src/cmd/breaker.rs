//! `cudatrace breaker`: the probe-harm breakers `[state] dir` keeps (a library whose probe
//! harmed a process is not attached on this node until cleared): lists them, or clears one or
//! all after the kernel is fixed or the sites are refused.
use anyhow::{bail, Context as _, Result};

use crate::{cli::BreakerArgs, config::Config, probe::breaker::Breaker, text::printable};

/// Runs `cudatrace breaker`.
pub fn run(args: BreakerArgs) -> Result<()> {
    let cfg = Config::load(&args.config)?;
    let Some(dir) = cfg.state.dir.as_ref() else {
        bail!(
            "{} sets no [state] dir: breakers live in the daemon's memory only and end with it",
            args.config.display()
        );
    };
    let mut breaker = Breaker::load(Some(dir));
    if args.clear.is_none() && !args.clear_all {
        if breaker.open.is_empty() {
            println!("no probe-harm breaker is open");
        }
        for o in &breaker.open {
            let kernel = if o.kernel.is_empty() {
                String::new()
            } else {
                format!(" on kernel {}", printable(&o.kernel))
            };
            println!(
                "open since {}{kernel}: {} ({})",
                o.opened_at,
                printable(&o.library),
                printable(&o.evidence)
            );
        }
        return Ok(());
    }
    let which = args.clear.as_deref();
    if let Some(lib) = which {
        if !breaker.open.iter().any(|o| o.library == lib) {
            bail!(
                "no breaker is open for {}; `cudatrace breaker --config {}` lists them",
                printable(lib),
                args.config.display()
            );
        }
    }
    let n = breaker
        .clear(which)
        .context("cannot write the breaker file")?;
    println!(
        "cleared {n} probe-harm breaker(s); the library is attached at the daemon's next start"
    );
    Ok(())
}
