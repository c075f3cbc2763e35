//! `cudatrace incidents`: the incident archive (`sinks::archive`) as a table, newest first, with
//! each incident's root cause in words; `--json` prints the archived objects instead, one a line.
use std::time::SystemTime;

use anyhow::{bail, Context as _, Result};
use serde_json::Value;

use crate::{
    cli::IncidentsArgs,
    config::Config,
    sinks::{archive, mitigate::ledger::describe},
    text::printable,
};

/// One table line of an incident: every field escaped as `top` escapes names (an archive's
/// lines carry what tenants named their processes, and may have been edited by hand).
fn line(v: &Value) -> String {
    let s = |k: &str| printable(v[k].as_str().unwrap_or("-")).into_owned();
    let victim = format!(
        "{} (pid {})",
        v["victim"]["comm"].as_str().unwrap_or("?"),
        v["victim"]["pid"].as_u64().unwrap_or(0)
    );
    format!(
        "{:<20}  {:>8.0}  {:<28}  {:<26}  {:<4}  {}{}",
        s("ended_at"),
        v["duration_s"].as_f64().unwrap_or(0.0),
        s("alert"),
        printable(&victim),
        s("gpu"),
        s("root_cause"),
        mitigation(v)
    )
}

/// What `[mitigate]` did for an incident, in words: `; capped trainer (pid 20)`.
fn mitigation(v: &Value) -> String {
    let Some(acts) = v["mitigation"].as_array().filter(|a| !a.is_empty()) else {
        return String::new();
    };
    let said: Vec<String> = acts
        .iter()
        .filter(|a| a["event"] == "act")
        .map(|a| printable(&describe(a, false)).into_owned())
        .collect();
    let undone = if acts.iter().any(|a| a["event"] == "undo") {
        ", undone at its end"
    } else {
        ""
    };
    format!("; {}{undone}", said.join(", "))
}

/// The archive `args` name: `--archive`, else the `[alerts] archive` of `--config` (one line
/// when that sets none), else none.
pub fn archive_of(args: &IncidentsArgs) -> Result<Option<std::path::PathBuf>> {
    match (&args.archive, &args.config) {
        (Some(p), _) => Ok(Some(p.clone())),
        (None, Some(c)) => match Config::load(c)?.alerts.archive {
            Some(p) => Ok(Some(p)),
            None => bail!(
                "{} sets no [alerts] archive; set one, or give --archive PATH",
                printable(&c.display().to_string())
            ),
        },
        (None, None) => Ok(None),
    }
}

/// Runs `cudatrace incidents`.
pub fn run(args: IncidentsArgs) -> Result<()> {
    let Some(path) = archive_of(&args)? else {
        bail!("which archive? give --archive PATH, or --config FILE with [alerts] archive set")
    };
    let shown = printable(&path.display().to_string()).into_owned();
    let since = args.since.map(|d| SystemTime::now() - d);
    let read = archive::read(&path, since)
        .with_context(|| format!("cannot read the incident archive {shown}"))?;
    if read.left_out > 0 {
        log::warn!(
            "cudatrace: {} older incidents of {shown} not shown (the newest {} are; narrow with --since)",
            read.left_out,
            archive::MAX_INCIDENTS
        );
    }
    if read.skipped > 0 {
        log::warn!(
            "cudatrace: skipped {} lines of {shown} that are not incidents",
            read.skipped
        );
    }
    if args.json {
        for v in read.newest_first() {
            println!("{v}");
        }
        return Ok(());
    }
    println!(
        "{:<20}  {:>8}  {:<28}  {:<26}  {:<4}  ROOT CAUSE",
        "ENDED", "SECONDS", "ALERT", "VICTIM", "GPU"
    );
    for v in read.newest_first() {
        println!("{}", line(&v));
    }
    if read.is_empty() {
        log::info!(
            "no incidents in {shown}{}",
            if args.since.is_some() {
                " in that time"
            } else {
                ""
            }
        );
    }
    Ok(())
}
