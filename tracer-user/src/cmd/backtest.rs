//! `cudatrace backtest`: the alerts a config would have raised over a range of history, from
//! `cudatrace_signal_value` in Prometheus (`crate::backtest`). Each change is one JSON line on
//! stdout, as `run` prints them (`at`: the window's time); a summary line on stderr.
use std::{
    io::Write as _,
    time::{Instant, SystemTime},
};

use anyhow::{bail, Result};

use crate::{
    backtest::{self, prometheus},
    cli::BacktestArgs,
    config::{self, Config},
    text::rfc3339,
};

/// Most windows one replay may have.
pub const MAX_WINDOWS: u64 = 5_000_000;

/// Reads the series of `selector` (`cudatrace_signal_value`'s matchers) from `prometheus` over
/// [`from`, `to`] (Unix seconds) at `step` seconds, bounded as a replay needs: the series and
/// the number of windows.
pub fn history(
    prometheus: &str,
    selector: Option<&str>,
    (from, to, step): (u64, u64, u64),
) -> Result<(prometheus::Matrix, u64)> {
    config::check_url(prometheus).map_err(|e| anyhow::anyhow!("--prometheus {prometheus}: {e}"))?;
    let windows = (to - from) / step + 1;
    if windows > MAX_WINDOWS {
        bail!(
            "{windows} windows of {step} s from {} to {}, over {MAX_WINDOWS}: give a larger --step or a shorter range",
            rfc3339(at(from)),
            rfc3339(at(to))
        );
    }
    let query = prometheus::query(selector).map_err(anyhow::Error::msg)?;
    let matrix = prometheus::read(prometheus, &query, (from, to, step))
        .map_err(|e| anyhow::anyhow!("cannot read {query} from Prometheus: {e}"))?;
    if matrix.is_empty() {
        bail!(
            "{prometheus} holds no {query} from {} to {}: check the range, the selector, and that Prometheus scrapes cudatrace",
            rfc3339(at(from)),
            rfc3339(at(to))
        );
    }
    let procs = backtest::process_count(&matrix);
    if procs > backtest::MAX_PROCESSES {
        bail!(
            "{} series make {procs} processes, over {}: narrow them with --match",
            matrix.len(),
            backtest::MAX_PROCESSES
        );
    }
    Ok((matrix, windows))
}

/// Unix seconds as a time.
pub fn at(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(secs)
}

/// Runs `cudatrace backtest`.
pub fn run(args: BacktestArgs) -> Result<()> {
    let cfg = match &args.config {
        Some(path) => Config::load(path)?,
        None => Config::default(),
    };
    let secs = |t: SystemTime| {
        t.duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    };
    let (from, to) = (secs(args.from), secs(args.to));
    if to <= from {
        bail!(
            "--to {} is not after --from {}: give a range forward in time",
            rfc3339(args.to),
            rfc3339(args.from)
        );
    }
    let step = args.step.unwrap_or(cfg.detect.window_s);
    let started = Instant::now();
    let (matrix, windows) = history(&args.prometheus, args.selector.as_deref(), (from, to, step))?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let from_t = at(from);
    let s = backtest::replay(
        matrix,
        &cfg.detect,
        (from_t, std::time::Duration::from_secs(step), windows),
        |c| {
            if let Ok(line) = serde_json::to_string(c) {
                let _ = writeln!(out, "{line}");
            }
        },
    );
    let _ = out.flush();
    log::info!(
        target: "cudatrace::backtest",
        series = s.series,
        windows = s.windows,
        changes = s.changes,
        fired = s.fired;
        "backtest: {} series ({} processes, {} workloads), {} windows of {step} s from {} to {}: {} alert changes, {} fired, in {:.2} s",
        s.series,
        s.processes,
        s.workloads,
        s.windows,
        rfc3339(args.from),
        rfc3339(args.to),
        s.changes,
        s.fired,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
