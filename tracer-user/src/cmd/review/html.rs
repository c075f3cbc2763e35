//! `cudatrace review --html FILE`: the review as one self-contained page (inline CSS and SVG,
//! no script, nothing fetched): the review's lines, then three plots: alerts per day (per hour
//! for a period of 3 days or less) by tier, each incident's time to resolve per alert row (log
//! scale, the median marked), and each noisiest workload's history with its alerts marked: the
//! signal's values from Prometheus when `--prometheus` is given, else the values each incident
//! recorded (its `now` and its baseline p99). Every name is escaped; plots are bounded in size
//! whatever the period or the archive holds.
use std::{collections::BTreeMap, fmt::Write as _, time::SystemTime};

use serde_json::Value;

use super::Review;
use crate::{backtest::prometheus::Matrix, text::rfc3339};

/// Tier colours: page, critical, warning.
pub const TIER_COLOURS: [&str; 3] = ["#d62728", "#ff7f0e", "#f2c200"];
/// The colour of medians and of the signal's history.
pub const LINE_COLOUR: &str = "#1f77b4";
/// Most bars in the per-day plot.
const MAX_BARS: u64 = 400;
/// Most alert rows in the time-to-resolve plot.
const MAX_ROWS: usize = 12;
/// Most points of a history line.
const MAX_POINTS: usize = 600;
const WIDTH: f64 = 960.0;
const LEFT: f64 = 60.0;

/// Prometheus's history of the period: the series, their first step's time and the step.
pub struct History<'a> {
    /// The series read for the replay.
    pub matrix: &'a Matrix,
    /// Unix seconds of step 0.
    pub from: u64,
    /// Seconds between steps.
    pub step: u64,
}

fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c if crate::text::hidden(c) => out.push('?'),
            c => out.push(c),
        }
    }
    out
}

/// A value in at most 6 characters.
fn short(v: f64) -> String {
    match v {
        v if v >= 1e5 => format!("{v:.1e}"),
        v if v >= 100.0 => format!("{v:.0}"),
        v if v >= 1.0 => format!("{v:.2}"),
        v => format!("{v:.4}"),
    }
}

fn unix(v: &Value, k: &str) -> Option<f64> {
    super::unix_s(v[k].as_str()?)
}

fn tier(v: &Value) -> Option<usize> {
    match v["severity"].as_str()? {
        "page" => Some(0),
        "critical" => Some(1),
        "warning" => Some(2),
        _ => None,
    }
}

fn legend(out: &mut String, y: f64) {
    for (i, (name, colour)) in ["page", "critical", "warning"]
        .iter()
        .zip(TIER_COLOURS)
        .enumerate()
    {
        let x = WIDTH - 260.0 + i as f64 * 85.0;
        let _ = write!(
            out,
            r#"<rect x="{x}" y="{}" width="12" height="12" fill="{colour}"/><text x="{}" y="{}">{name}</text>"#,
            y - 10.0,
            x + 16.0,
            y
        );
    }
}

/// Alerts per bucket (a day, or an hour for short periods) by tier, stacked.
fn per_day(out: &mut String, incidents: &[Value], (from, to): (f64, f64)) {
    let span = (to - from).max(1.0);
    let unit: f64 = if span <= 3.0 * 86_400.0 {
        3_600.0
    } else {
        86_400.0
    };
    let bucket = unit.max((span / MAX_BARS as f64).ceil());
    let n = (span / bucket).ceil() as usize;
    let mut counts = vec![[0u64; 3]; n];
    for v in incidents {
        let (Some(t), Some(k)) = (unix(v, "started_at").or(unix(v, "ended_at")), tier(v)) else {
            continue;
        };
        let i = ((t - from) / bucket).floor();
        if i >= 0.0 && (i as usize) < n {
            counts[i as usize][k] += 1;
        }
    }
    let max = counts
        .iter()
        .map(|c| c.iter().sum::<u64>())
        .max()
        .unwrap_or(0)
        .max(1);
    let (h, top) = (200.0, 30.0);
    let bw = (WIDTH - LEFT - 20.0) / n as f64;
    let per = if bucket == 3_600.0 {
        "hour"
    } else if bucket == 86_400.0 {
        "day"
    } else {
        "bar"
    };
    let _ = write!(
        out,
        r#"<h2>Alerts per {per} by tier</h2><svg id="per-day" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{}">"#,
        h + top + 40.0
    );
    legend(out, 16.0);
    let scale = h / max as f64;
    for (i, c) in counts.iter().enumerate() {
        let x = LEFT + i as f64 * bw;
        let mut y = top + h;
        for (k, count) in c.iter().enumerate() {
            if *count == 0 {
                continue;
            }
            let hh = *count as f64 * scale;
            y -= hh;
            let _ = write!(
                out,
                r#"<rect x="{x:.1}" y="{y:.1}" width="{:.1}" height="{hh:.1}" fill="{}"/>"#,
                (bw - 1.0).max(1.0),
                TIER_COLOURS[k]
            );
        }
    }
    let _ = write!(
        out,
        r##"<line x1="{LEFT}" y1="{0}" x2="{1}" y2="{0}" stroke="#444"/><text x="{2}" y="{3}" text-anchor="end">{max}</text><text x="{2}" y="{0}" text-anchor="end">0</text><text x="{LEFT}" y="{4}">{5}</text><text x="{1}" y="{4}" text-anchor="end">{6}</text></svg>"##,
        top + h,
        WIDTH - 20.0,
        LEFT - 6.0,
        top + 10.0,
        top + h + 20.0,
        esc(&rfc3339(super::super::backtest::at(from as u64))),
        esc(&rfc3339(super::super::backtest::at(to as u64))),
    );
}

/// Each incident's seconds to resolve, per row (log scale), the row's median marked.
fn to_resolve(out: &mut String, r: &Review, incidents: &[Value]) {
    let rows: Vec<_> = r.rows.iter().take(MAX_ROWS).collect();
    let label_w = 300.0;
    let (lo, hi) = (1.0f64, 7.0f64); // 10 s to 10^7 s (115 days), log10
    let x_of = |s: f64| label_w + (s.max(10.0).log10() - lo) / (hi - lo) * (WIDTH - label_w - 20.0);
    let band = 26.0;
    let h = rows.len() as f64 * band + 50.0;
    let _ = write!(
        out,
        r#"<h2>Time to resolve</h2><svg id="to-resolve" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{h}">"#
    );
    legend(out, 14.0);
    for (i, row) in rows.iter().enumerate() {
        let y = 30.0 + i as f64 * band + band / 2.0;
        let label: String = format!("{} · {}", row.alert, row.workload)
            .chars()
            .take(44)
            .collect();
        let _ = write!(
            out,
            r#"<text x="4" y="{:.1}">{}</text>"#,
            y + 4.0,
            esc(&label)
        );
        for v in incidents.iter().filter(|v| row.holds(v)) {
            let (Some(k), Some(d)) = (tier(v), v["duration_s"].as_f64()) else {
                continue;
            };
            let _ = write!(
                out,
                r#"<circle cx="{:.1}" cy="{y:.1}" r="5" fill="{}" fill-opacity="0.8"/>"#,
                x_of(d),
                TIER_COLOURS[k]
            );
        }
        let m = x_of(row.median_s);
        let _ = write!(
            out,
            r#"<line x1="{m:.1}" y1="{:.1}" x2="{m:.1}" y2="{:.1}" stroke="{LINE_COLOUR}" stroke-width="3"/>"#,
            y - 10.0,
            y + 10.0
        );
    }
    let base = 30.0 + rows.len() as f64 * band;
    for (s, name) in [
        (60.0, "1 min"),
        (3_600.0, "1 h"),
        (86_400.0, "1 d"),
        (2_592_000.0, "30 d"),
    ] {
        let x = x_of(s);
        let _ = write!(
            out,
            r##"<line x1="{x:.1}" y1="30" x2="{x:.1}" y2="{base}" stroke="#ccc"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{name}</text>"##,
            base + 16.0
        );
    }
    out.push_str("</svg>");
}

/// One workload's history over the period with its alerts marked.
fn workload_history(
    out: &mut String,
    (name, i): (&str, usize),
    incidents: &[Value],
    history: Option<&History<'_>>,
    (from, to): (f64, f64),
) {
    let mine: Vec<&Value> = incidents
        .iter()
        .filter(|v| super::workload_of(v) == name)
        .collect();
    let signal = {
        let mut n: BTreeMap<&str, usize> = BTreeMap::new();
        for v in &mine {
            if let Some(s) = v["evidence"]["signal"].as_str() {
                *n.entry(s).or_default() += 1;
            }
        }
        n.into_iter()
            .max_by_key(|(_, c)| *c)
            .map(|(s, _)| s.to_owned())
    };
    // (time, value) points: Prometheus's series, else the incidents' own values.
    let mut line: Vec<(f64, f64)> = Vec::new();
    let mut unit = String::from("ms");
    if let (Some(h), Some(sig)) = (history, &signal) {
        for (labels, values) in h.matrix {
            if labels.get("signal") == Some(sig) && crate::backtest::workload_of(labels) == name {
                line.extend(
                    values
                        .iter()
                        .map(|(k, v)| ((h.from + k * h.step) as f64, v * 1e3)),
                );
                break;
            }
        }
    }
    let from_history = !line.is_empty();
    if !from_history {
        unit = mine
            .first()
            .and_then(|v| v["evidence"]["unit"].as_str())
            .unwrap_or("")
            .to_owned();
    }
    let evidence: Vec<(f64, f64, f64, usize)> = mine
        .iter()
        .filter_map(|v| {
            Some((
                unix(v, "started_at")?,
                v["evidence"]["now"].as_f64()?,
                v["evidence"]["baseline_p99"].as_f64().unwrap_or(0.0),
                tier(v)?,
            ))
        })
        .collect();
    if line.len() > MAX_POINTS {
        // Each bucket's largest value: a spike survives the thinning.
        let per = line.len().div_ceil(MAX_POINTS);
        line = line
            .chunks(per)
            .map(|c| {
                c.iter()
                    .fold((c[0].0, f64::MIN), |a, p| (a.0, a.1.max(p.1)))
            })
            .collect();
    }
    let ymax = line
        .iter()
        .map(|p| p.1)
        .chain(
            evidence
                .iter()
                .flat_map(|e| [e.1, e.2])
                .filter(|_| !from_history),
        )
        .filter(|v| v.is_finite())
        .fold(0.0f64, f64::max)
        .max(1e-9)
        * 1.1;
    let (h, top) = (110.0, 24.0);
    let span = (to - from).max(1.0);
    let x_of = |t: f64| LEFT + ((t - from) / span).clamp(0.0, 1.0) * (WIDTH - LEFT - 20.0);
    let y_of = |v: f64| top + h - (v / ymax).clamp(0.0, 1.0) * h;
    let what = match (&signal, from_history) {
        (Some(s), true) => format!("{s} (Prometheus), ms"),
        (Some(s), false) => format!("{s} at each alert (archive), {unit}"),
        (None, _) => "no signal recorded".into(),
    };
    let _ = write!(
        out,
        r#"<h3>{}: {}</h3><svg id="workload-{i}" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{}">"#,
        esc(name),
        esc(&what),
        h + top + 10.0
    );
    for v in &mine {
        let (Some(s), Some(k)) = (unix(v, "started_at"), tier(v)) else {
            continue;
        };
        let e = unix(v, "ended_at").unwrap_or(s);
        let (x0, x1) = (x_of(s), x_of(e));
        let _ = write!(
            out,
            r#"<rect x="{x0:.1}" y="{top}" width="{:.1}" height="{h}" fill="{}" fill-opacity="0.35"/>"#,
            (x1 - x0).max(2.0),
            TIER_COLOURS[k]
        );
    }
    if from_history {
        let pts: Vec<String> = line
            .iter()
            .map(|(t, v)| format!("{:.1},{:.1}", x_of(*t), y_of(*v)))
            .collect();
        let _ = write!(
            out,
            r#"<polyline fill="none" stroke="{LINE_COLOUR}" stroke-width="1.5" points="{}"/>"#,
            pts.join(" ")
        );
    } else {
        for (t, now, p99, k) in &evidence {
            let (x, yb, yn, colour) = (x_of(*t), y_of(*p99), y_of(*now), TIER_COLOURS[*k]);
            let _ = write!(
                out,
                r##"<line x1="{:.1}" y1="{yb:.1}" x2="{:.1}" y2="{yb:.1}" stroke="#666" stroke-width="2"/><circle cx="{x:.1}" cy="{yn:.1}" r="5" fill="{colour}" fill-opacity="0.9"/>"##,
                x - 8.0,
                x + 8.0,
            );
        }
    }
    let _ = write!(
        out,
        r##"<line x1="{LEFT}" y1="{0}" x2="{1}" y2="{0}" stroke="#444"/><text x="{2}" y="{3}" text-anchor="end">{4}</text><text x="{2}" y="{0}" text-anchor="end">0</text></svg>"##,
        top + h,
        WIDTH - 20.0,
        LEFT - 6.0,
        top + 10.0,
        short(ymax)
    );
}

/// The page: the review of `incidents` over `period` ending `now`.
pub fn page(
    r: &Review,
    incidents: &[Value],
    period: (&str, SystemTime, std::time::Duration),
    history: Option<&History<'_>>,
) -> String {
    let (name, now, since) = period;
    let to = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let from = to - since.as_secs_f64();
    let mut out = String::from(
        r#"<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>cudatrace review</title><style>body{font-family:sans-serif;margin:24px;color:#222;background:#fff}pre{font-size:12px;background:#f6f6f6;padding:8px;overflow-x:auto}svg text{font-size:12px;fill:#222}h2{margin-top:28px}</style></head><body>"#,
    );
    let _ = write!(
        out,
        "<h1>cudatrace review: the last {}</h1><p>{} incidents, {} to {}</p><pre>",
        esc(name),
        r.incidents,
        esc(&rfc3339(super::super::backtest::at(from.max(0.0) as u64))),
        esc(&rfc3339(now))
    );
    for l in r.lines(name) {
        out.push_str(&esc(&l));
        out.push('\n');
    }
    if let (Some(p), Some(h)) = (&r.proposals, history) {
        for l in p.lines(h.step) {
            out.push_str(&esc(&l));
            out.push('\n');
        }
    }
    out.push_str("</pre>");
    if r.incidents > 0 {
        per_day(&mut out, incidents, (from, to));
        to_resolve(&mut out, r, incidents);
        out.push_str("<h2>The noisiest workloads, their alerts marked</h2>");
        for (i, (w, _)) in r.noisiest.iter().enumerate() {
            workload_history(&mut out, (w, i), incidents, history, (from, to));
        }
    }
    out.push_str("</body></html>\n");
    out
}

#[cfg(test)]
mod tests;
