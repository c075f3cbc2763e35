//! `cudatrace review`: the alert-effectiveness review of the seeds (monthly, `--since 30d`, the
//! default; weekly, `--since 7d`) from the incident archive: per alert, cause and workload how
//! often it fired and at which tier, how long it took to resolve, how many flapped (resolved
//! within `FLAP_S` of starting: nobody could act on them), how many named no aggressor, how many
//! fell in a quiet period; the noisiest workloads; and the period's drift alerts (the P3
//! trends). `--json` prints the same as one object.
use std::{collections::BTreeMap, time::Duration};

use anyhow::{bail, Context as _, Result};
use serde::Serialize;
use serde_json::Value;

use self::silences::Silences;
use crate::{
    backtest::propose::{self, Proposals},
    cli::ReviewArgs,
    config::Config,
    sinks::archive,
    text::printable,
};

/// An incident that resolved this soon after it started flapped.
pub const FLAP_S: f64 = 300.0;
/// The review's period when `--since` is not given.
pub const DEFAULT_SINCE: Duration = Duration::from_secs(30 * 86_400);
/// Noisiest workloads listed.
const NOISIEST: usize = 5;

/// One (alert, cause, workload) row.
#[derive(Debug, Default, PartialEq, Serialize)]
pub struct Row {
    /// The alert's name.
    pub alert: String,
    /// Its cause.
    pub cause: String,
    /// The victim's workload.
    pub workload: String,
    /// Incidents.
    pub count: u64,
    /// Incidents at `page`, `critical` and `warning` (their last severity).
    pub tiers: [u64; 3],
    /// Median and longest seconds from start to resolution.
    pub median_s: f64,
    /// Longest seconds from start to resolution.
    pub max_s: f64,
    /// Resolved within [`FLAP_S`] of starting.
    pub flapping: u64,
    /// Named no aggressor, or no cause.
    pub no_aggressor: u64,
    /// Fell in a quiet period (reported, not sent).
    pub quiet: u64,
    /// Covered by an Alertmanager silence (`--alertmanager`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub silenced: Option<u64>,
}

/// A drift alert of the period: the P3 trend.
#[derive(Debug, PartialEq, Serialize)]
pub struct Drift {
    /// Its workload.
    pub workload: String,
    /// Percent a week.
    pub pct_per_week: f64,
    /// When it ended.
    pub ended_at: String,
}

/// The review of a set of archived incidents.
#[derive(Debug, Default, PartialEq, Serialize)]
pub struct Review {
    /// Incidents reviewed.
    pub incidents: u64,
    /// Per (alert, cause, workload), most incidents first (ties by name).
    pub rows: Vec<Row>,
    /// The workloads with the most incidents, most first (ties by name).
    pub noisiest: Vec<(String, u64)>,
    /// Drift alerts.
    pub drift: Vec<Drift>,
    /// What automatic degradation did (`[mitigate]`, the archive's `mitigation` entries).
    pub mitigation: Mitigation,
    /// What Alertmanager says people did (`--alertmanager`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alertmanager: Option<Acknowledged>,
    /// Changes to `[detect]` measured on Prometheus's history (`--prometheus`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proposals: Option<Proposals>,
}

/// Incidents people answered in Alertmanager, and those nobody did.
#[derive(Debug, Default, PartialEq, Serialize)]
pub struct Acknowledged {
    /// Silences Alertmanager listed (expired ones included, for its retention).
    pub silences: usize,
    /// Silences left out as unreadable.
    pub unreadable: usize,
    /// Incidents a silence covered.
    pub silenced: u64,
    /// Sent (not quiet), never silenced, not acted on by `[mitigate]`, and back to baseline on
    /// their own: alerts nobody acted on, the candidates to retune or retire.
    pub unacknowledged: u64,
}

/// Counts, per row and in all, the incidents `silences` covered and those nobody answered.
pub fn acknowledge(r: &mut Review, incidents: &[Value], silences: &Silences, instance: &str) {
    let mut out = Acknowledged {
        silences: silences.len(),
        unreadable: silences.unreadable,
        ..Acknowledged::default()
    };
    for row in &mut r.rows {
        row.silenced = Some(0);
    }
    for v in incidents {
        let row = r.rows.iter_mut().find(|row| row.holds(v));
        if silences.covers(v, instance) {
            out.silenced += 1;
            if let Some(n) = row.and_then(|r| r.silenced.as_mut()) {
                *n += 1;
            }
        } else if v["quiet"].is_null()
            && v["mitigation"].as_array().is_none_or(Vec::is_empty)
            && v["reason"] == "back_to_baseline"
        {
            out.unacknowledged += 1;
        }
    }
    r.alertmanager = Some(out);
}

/// Automatic degradation's actions over the period.
#[derive(Debug, Default, PartialEq, Serialize)]
pub struct Mitigation {
    /// Incidents acted on (or planned for).
    pub incidents: u64,
    /// Caps the actuator took.
    pub capped: u64,
    /// Caps planned in a dry run.
    pub planned: u64,
    /// Caps the actuator refused or could not take.
    pub refused: u64,
}

/// The victim's workload of an archived incident (its comm when it has none).
pub fn workload_of(v: &Value) -> &str {
    v["victim"]["workload"]
        .as_str()
        .or(v["victim"]["comm"].as_str())
        .unwrap_or("-")
}

/// Unix seconds of an RFC 3339 time.
pub fn unix_s(t: &str) -> Option<f64> {
    let t = humantime::parse_rfc3339_weak(t).ok()?;
    Some(t.duration_since(std::time::UNIX_EPOCH).ok()?.as_secs_f64())
}

impl Row {
    /// Whether the archived incident `v` is of this row (alert, cause, workload).
    pub fn holds(&self, v: &Value) -> bool {
        v["alert"].as_str() == Some(&self.alert)
            && v["cause"].as_str() == Some(&self.cause)
            && workload_of(v) == self.workload
    }
}

fn text(v: &Value, k: &str) -> String {
    v[k].as_str().unwrap_or("-").to_owned()
}

/// Reviews `incidents` (archived objects, any order).
pub fn review(incidents: impl IntoIterator<Item = Value>) -> Review {
    let mut out = Review::default();
    let mut rows: BTreeMap<(String, String, String), Row> = BTreeMap::new();
    let mut durations: BTreeMap<(String, String, String), Vec<f64>> = BTreeMap::new();
    let mut per_workload: BTreeMap<String, u64> = BTreeMap::new();
    for v in incidents {
        let workload = workload_of(&v).to_owned();
        let key = (text(&v, "alert"), text(&v, "cause"), workload.clone());
        let row = rows.entry(key.clone()).or_insert_with(|| Row {
            alert: key.0.clone(),
            cause: key.1.clone(),
            workload: key.2.clone(),
            ..Row::default()
        });
        row.count += 1;
        match v["severity"].as_str() {
            Some("page") => row.tiers[0] += 1,
            Some("critical") => row.tiers[1] += 1,
            Some("warning") => row.tiers[2] += 1,
            _ => {}
        }
        let d = v["duration_s"].as_f64().unwrap_or(0.0).max(0.0);
        durations.entry(key).or_default().push(d);
        if d < FLAP_S {
            row.flapping += 1;
        }
        let named = v["aggressors"].as_array().is_some_and(|a| !a.is_empty());
        if !named || v["cause"] == "unexplained" {
            row.no_aggressor += 1;
        }
        if !v["quiet"].is_null() {
            row.quiet += 1;
        }
        if let Some(pct) = v["evidence"]["drift_pct_per_week"].as_f64() {
            out.drift.push(Drift {
                workload: workload.clone(),
                pct_per_week: pct,
                ended_at: text(&v, "ended_at"),
            });
        }
        if let Some(acts) = v["mitigation"].as_array().filter(|a| !a.is_empty()) {
            out.mitigation.incidents += 1;
            for a in acts.iter().filter(|a| a["event"] == "act") {
                match (a["dry_run"].as_bool(), a["done"].as_bool()) {
                    (Some(true), _) => out.mitigation.planned += 1,
                    (_, Some(true)) => out.mitigation.capped += 1,
                    _ => out.mitigation.refused += 1,
                }
            }
        }
        *per_workload.entry(workload).or_default() += 1;
        out.incidents += 1;
    }
    for (key, mut d) in durations {
        d.sort_by(f64::total_cmp);
        if let (Some(row), Some(max)) = (rows.get_mut(&key), d.last()) {
            row.median_s = d[d.len() / 2];
            row.max_s = *max;
        }
    }
    out.rows = rows.into_values().collect();
    out.rows.sort_by_key(|r| std::cmp::Reverse(r.count));
    let mut noisiest: Vec<(String, u64)> = per_workload.into_iter().collect();
    noisiest.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    noisiest.truncate(NOISIEST);
    out.noisiest = noisiest;
    out.drift.sort_by(|a, b| a.ended_at.cmp(&b.ended_at));
    out
}

impl Review {
    /// The review as lines for a terminal (names escaped as `top` escapes them).
    pub fn lines(&self, period: &str) -> Vec<String> {
        let mut out = vec![format!(
            "review: {} incidents ended in the last {period}",
            self.incidents
        )];
        if self.incidents == 0 {
            return out;
        }
        let tiers = self.rows.iter().fold([0; 3], |mut t, r| {
            (0..3).for_each(|i| t[i] += r.tiers[i]);
            t
        });
        let flapping: u64 = self.rows.iter().map(|r| r.flapping).sum();
        let unnamed: u64 = self.rows.iter().map(|r| r.no_aggressor).sum();
        out.push(format!(
            "tiers: page {}, critical {}, warning {}; flapping (resolved within {:.0} min) {flapping}; without an aggressor {unnamed}",
            tiers[0],
            tiers[1],
            tiers[2],
            FLAP_S / 60.0
        ));
        out.push(
            format!(
            "{:<28}  {:<20}  {:<24}  {:>5}  {:>4} {:>4} {:>4}  {:>8}  {:>8}  {:>4}  {:>7}  {:>5}",
            "ALERT",
            "CAUSE",
            "WORKLOAD",
            "COUNT",
            "PAGE",
            "CRIT",
            "WARN",
            "MEDIAN_S",
            "MAX_S",
            "FLAP",
            "UNNAMED",
            "QUIET"
        ) + if self.alertmanager.is_some() {
                "  SILENCED"
            } else {
                ""
            },
        );
        for r in &self.rows {
            out.push(format!(
                "{:<28}  {:<20}  {:<24}  {:>5}  {:>4} {:>4} {:>4}  {:>8.0}  {:>8.0}  {:>4}  {:>7}  {:>5}",
                printable(&r.alert),
                printable(&r.cause),
                printable(&r.workload),
                r.count,
                r.tiers[0],
                r.tiers[1],
                r.tiers[2],
                r.median_s,
                r.max_s,
                r.flapping,
                r.no_aggressor,
                r.quiet
            ) + &r.silenced.map(|n| format!("  {n:>8}")).unwrap_or_default());
        }
        let noisy: Vec<String> = self
            .noisiest
            .iter()
            .map(|(w, n)| format!("{} ({n})", printable(w)))
            .collect();
        out.push(format!("noisiest workloads: {}", noisy.join(", ")));
        if self.drift.is_empty() {
            out.push("drift (P3 trends): none".into());
        }
        for d in &self.drift {
            out.push(format!(
                "drift (P3 trend): {} +{:.1}%/week, ended {}",
                printable(&d.workload),
                d.pct_per_week,
                printable(&d.ended_at)
            ));
        }
        if let Some(a) = &self.alertmanager {
            out.push(format!(
                "alertmanager: {} silences ({} unreadable); {} incidents silenced; {} unacknowledged (sent, never silenced nor mitigated, back to baseline on their own)",
                a.silences, a.unreadable, a.silenced, a.unacknowledged
            ));
        }
        let m = &self.mitigation;
        if m.incidents > 0 {
            out.push(format!(
                "automatic degradation: {} incidents acted on: {} caps taken, {} planned in dry runs, {} refused",
                m.incidents, m.capped, m.planned, m.refused
            ));
        }
        out
    }
}

/// Runs `cudatrace review`.
pub fn run(args: ReviewArgs) -> Result<()> {
    let Some(path) = super::incidents::archive_of(&args.archive)? else {
        bail!("which archive? give --archive PATH, or --config FILE with [alerts] archive set")
    };
    let shown = printable(&path.display().to_string()).into_owned();
    let since = args.archive.since.unwrap_or(DEFAULT_SINCE);
    let now = std::time::SystemTime::now();
    let read = archive::read(&path, Some(now - since))
        .with_context(|| format!("cannot read the incident archive {shown}"))?;
    if read.left_out > 0 {
        log::warn!(
            "cudatrace: review of the newest {} incidents of {shown} only ({} older left out)",
            archive::MAX_INCIDENTS,
            read.left_out
        );
    }
    let incidents: Vec<Value> = read.newest_first().collect();
    let mut r = review(incidents.iter().cloned());
    if let Some(url) = &args.alertmanager {
        crate::config::check_url(url).map_err(|e| anyhow::anyhow!("--alertmanager {url}: {e}"))?;
        let silences = Silences::fetch(url)
            .map_err(|e| anyhow::anyhow!("cannot read Alertmanager's silences: {e}"))?;
        acknowledge(
            &mut r,
            &incidents,
            &silences,
            &crate::sinks::alertmanager::instance(),
        );
    }
    let mut step_s = 0;
    let mut kept = None;
    if let Some(url) = &args.prometheus {
        let cfg = match &args.archive.config {
            Some(p) => Config::load(p)?,
            None => Config::default(),
        };
        step_s = args.step.unwrap_or(cfg.detect.window_s);
        let secs = |t: std::time::SystemTime| {
            t.duration_since(std::time::SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs())
        };
        let (from, to) = (secs(now - since), secs(now));
        let (matrix, windows) =
            super::backtest::history(url, args.selector.as_deref(), (from, to, step_s))?;
        r.proposals = Some(propose::propose(
            &matrix,
            &cfg.detect,
            (
                super::backtest::at(from),
                Duration::from_secs(step_s),
                windows,
            ),
        ));
        kept = Some((matrix, from));
    }
    let period = humantime::format_duration(since).to_string();
    // The review first: a page that cannot be written loses nothing of it.
    if args.archive.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        for l in r.lines(&period) {
            println!("{l}");
        }
        if let Some(p) = &r.proposals {
            for l in p.lines(step_s) {
                println!("{l}");
            }
        }
    }
    if let Some(file) = &args.html {
        let history = kept.as_ref().map(|(matrix, from)| html::History {
            matrix,
            from: *from,
            step: step_s,
        });
        let page = html::page(&r, &incidents, (&period, now, since), history.as_ref());
        std::fs::write(file, page).with_context(|| {
            format!(
                "cannot write {}: give --html a file in a folder you can write",
                printable(&file.display().to_string())
            )
        })?;
    }
    Ok(())
}

mod html;
pub mod silences;
#[cfg(test)]
mod tests;
