//! Options of `cudatrace review`.
use std::path::PathBuf;

use super::IncidentsArgs;

/// Options of `cudatrace review`: the archive as `incidents` takes it, and the sources beside it.
#[derive(clap::Args)]
pub struct ReviewArgs {
    /// The archive, the period (`--since`, default 30d) and `--json`.
    #[command(flatten)]
    pub archive: IncidentsArgs,
    /// A Prometheus holding cudatrace_signal_value over the period: the config (`--config`'s
    /// [detect], else the defaults) and variants of it are replayed there, and the variants
    /// that fire fewer incidents and keep every page are proposed, each with its effect.
    #[arg(long, value_name = "URL")]
    pub prometheus: Option<String>,
    /// Only these series of the replay (`{workload="serving/llm/server"}`).
    #[arg(long = "match", value_name = "SELECTOR", requires = "prometheus")]
    pub selector: Option<String>,
    /// Seconds between the replay's windows (default: the config's detect.window_s).
    #[arg(long, value_name = "SECS", requires = "prometheus",
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub step: Option<u64>,
    /// An Alertmanager (API v2) whose silences say which incidents people silenced, and so
    /// which nobody acted on.
    #[arg(long, value_name = "URL")]
    pub alertmanager: Option<String>,
    /// Also write the review as one self-contained HTML page with its plots.
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
}
