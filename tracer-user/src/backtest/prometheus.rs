//! Reading `cudatrace_signal_value` over a range from Prometheus's HTTP API
//! (`/api/v1/query_range`), in pieces of at most [`POINTS`] steps (Prometheus refuses more than
//! 11,000 points a series), each answer at most [`MAX_BODY`] bytes, at most [`MAX_SERIES`]
//! series and [`MAX_POINTS`] points in all, every query within [`DEADLINE`] of the first. The
//! server is not trusted: points outside [`from`, `to`] are dropped, a point repeated keeps one
//! place, and past a bound the read stops with one line that says which.
use std::{collections::BTreeMap, time::Duration};

use serde::Deserialize;

/// Steps asked for in one query.
pub const POINTS: u64 = 10_000;
/// Largest answer read.
pub const MAX_BODY: u64 = 32 << 20;
/// Most series replayed.
pub const MAX_SERIES: usize = 10_000;
/// Most points kept, all series together (about 50 bytes each in memory).
pub const MAX_POINTS: usize = 2_000_000;
/// How long all the queries together may take.
pub const DEADLINE: Duration = Duration::from_secs(600);
/// Time one query may take.
const TIMEOUT: Duration = Duration::from_secs(120);

/// A series' labels (`__name__` left out).
pub type Labels = BTreeMap<String, String>;

/// Each series' values by step (index from the range's start).
pub type Matrix = BTreeMap<Labels, BTreeMap<u64, f64>>;

#[derive(Deserialize)]
struct Answer {
    status: String,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    data: Option<Data>,
}

#[derive(Deserialize)]
struct Data {
    result: Vec<Series>,
}

#[derive(Deserialize)]
struct Series {
    metric: Labels,
    values: Vec<(f64, String)>,
}

/// The query for `selector`: `cudatrace_signal_value` with its matchers.
pub fn query(selector: Option<&str>) -> Result<String, String> {
    match selector.map(str::trim) {
        None | Some("") => Ok("cudatrace_signal_value".into()),
        Some(s) if s.starts_with('{') && s.ends_with('}') => Ok(format!("cudatrace_signal_value{s}")),
        Some(s) if s.starts_with("cudatrace_signal_value{") && s.ends_with('}') => Ok(s.into()),
        Some(s) => Err(format!(
            "--match {s}: give label matchers of cudatrace_signal_value, such as {{workload=\"serving/llm/server\"}}"
        )),
    }
}

/// Reads `query` from `base` (the server's URL) at `step` seconds over [`from`, `to`] (Unix
/// seconds).
pub fn read(base: &str, query: &str, (from, to, step): (u64, u64, u64)) -> Result<Matrix, String> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(TIMEOUT))
        .http_status_as_error(false)
        .build()
        .into();
    let url = format!("{}/api/v1/query_range", base.trim_end_matches('/'));
    let mut out = Matrix::new();
    let mut start = from;
    let (began, mut points) = (std::time::Instant::now(), 0usize);
    while start <= to {
        if began.elapsed() > DEADLINE {
            return Err(format!(
                "{url}: the queries took over {} s: give a shorter range or a larger --step",
                DEADLINE.as_secs()
            ));
        }
        let end = (start + step * (POINTS - 1)).min(to);
        let mut answer = agent
            .get(&url)
            .query("query", query)
            .query("start", start.to_string())
            .query("end", end.to_string())
            .query("step", step.to_string())
            .call()
            .map_err(|e| format!("{url}: {e}"))?;
        let status = answer.status();
        let body = crate::bounded::body(&mut answer, MAX_BODY, &url, "the answer")?;
        let parsed: Answer = serde_json::from_slice(&body)
            .map_err(|e| format!("{url} answered {status}, not Prometheus's API: {e}"))?;
        if parsed.status != "success" {
            return Err(format!(
                "{url} answered {status}: {}",
                parsed.error.unwrap_or_else(|| parsed.status.clone())
            ));
        }
        for s in parsed.data.map(|d| d.result).unwrap_or_default() {
            let mut labels = s.metric;
            labels.remove("__name__");
            if !out.contains_key(&labels) && out.len() >= MAX_SERIES {
                return Err(format!(
                    "more than {MAX_SERIES} series: narrow them with --match"
                ));
            }
            let values = out.entry(labels).or_default();
            for (t, v) in s.values {
                let Ok(v) = v.parse::<f64>() else { continue };
                if !v.is_finite() || v < 0.0 || !(t >= from as f64 && t <= to as f64) {
                    continue;
                }
                let at = ((t - from as f64) / step as f64).round() as u64;
                if values.insert(at, v).is_none() {
                    points += 1;
                    if points > MAX_POINTS {
                        return Err(format!(
                            "more than {MAX_POINTS} points: narrow the series with --match, or give a larger --step or a shorter range"
                        ));
                    }
                }
            }
        }
        start = end + step;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors() {
        assert_eq!(query(None).unwrap(), "cudatrace_signal_value");
        assert_eq!(
            query(Some("{workload=\"a\"}")).unwrap(),
            "cudatrace_signal_value{workload=\"a\"}"
        );
        assert!(query(Some("up"))
            .unwrap_err()
            .contains("give label matchers"));
    }
}
