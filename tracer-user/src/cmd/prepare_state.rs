//! `cudatrace prepare-state`: `[state] dir`'s `baselines/` made the uid's that `run` switches to
//! (`run_as`), mode 0700. The chart's init container runs it with CAP_CHOWN alone, so that the
//! daemon needs no CAP_CHOWN to keep its baselines.
use anyhow::{Context as _, Result};

use crate::{cli::PrepareStateArgs, config::Config, state::prepare};

/// Runs `cudatrace prepare-state`.
pub fn run(args: PrepareStateArgs) -> Result<()> {
    let cfg = Config::load(&args.config)?;
    let Some(dir) = cfg.state.dir.as_ref() else {
        anyhow::bail!(
            "{} sets no [state] dir: nothing to prepare",
            args.config.display()
        );
    };
    let owner = (cfg.run_as, cfg.run_as_gid.unwrap_or(cfg.run_as));
    let sub = prepare::prepare(dir, owner).context("cannot prepare the state directory")?;
    log::info!(
        target: "cudatrace::state",
        "state: {} is uid {}'s, mode 0700",
        sub.display(),
        owner.0
    );
    Ok(())
}
