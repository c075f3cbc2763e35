//! Alertmanager's silences (`cudatrace review --alertmanager URL`, API v2): an incident was
//! silenced when a silence whose matchers all match the labels cudatrace sent for it (rebuilt
//! from its archived record, as `sinks::alertmanager::form` makes them; `instance` is this
//! host's) was in force at some time during it. Alertmanager keeps expired silences for its
//! `--data.retention` (120 h by default): older incidents are counted against what it still has.
//! The server is not trusted: the answer is read to [`MAX_BODY`] bytes, [`MAX_SILENCES`] kept,
//! each regular expression bounded in size.
use std::{collections::BTreeMap, time::Duration};

use regex::Regex;
use serde::Deserialize;
use serde_json::Value;

use crate::text::defang;

/// Most silences read.
pub const MAX_SILENCES: usize = 10_000;
/// Largest answer read.
const MAX_BODY: u64 = 16 << 20;
/// Largest compiled regular expression of a matcher.
const MAX_REGEX: usize = 1 << 20;

#[derive(Deserialize)]
struct Silence {
    matchers: Vec<Matcher>,
    #[serde(rename = "startsAt")]
    starts_at: String,
    #[serde(rename = "endsAt")]
    ends_at: String,
}

#[derive(Deserialize)]
struct Matcher {
    name: String,
    value: String,
    #[serde(rename = "isRegex", default)]
    is_regex: bool,
    #[serde(rename = "isEqual", default = "yes")]
    is_equal: bool,
}

fn yes() -> bool {
    true
}

enum Test {
    Is(String),
    Like(Regex),
}

/// One silence: its matchers (label, test, whether it must hold) and when it was in force.
struct Rule {
    matchers: Vec<(String, Test, bool)>,
    from: f64,
    to: f64,
}

/// The silences Alertmanager listed.
pub struct Silences {
    rules: Vec<Rule>,
    /// Silences left out: a matcher that is not a valid (or is too large a) regular expression,
    /// or a time that is not RFC 3339.
    pub unreadable: usize,
}

impl Silences {
    /// The silences of a `/api/v2/silences` answer.
    pub fn parse(body: &[u8]) -> Result<Silences, String> {
        let listed: Vec<Silence> = serde_json::from_slice(body)
            .map_err(|e| format!("not Alertmanager's list of silences: {e}"))?;
        if listed.len() > MAX_SILENCES {
            return Err(format!(
                "{} silences, over {MAX_SILENCES}: expire old ones, or review without --alertmanager",
                listed.len()
            ));
        }
        let mut out = Silences {
            rules: Vec::new(),
            unreadable: 0,
        };
        for s in listed {
            let matchers: Option<Vec<_>> = s
                .matchers
                .into_iter()
                .map(|m| {
                    let test = if m.is_regex {
                        // Alertmanager anchors its expressions.
                        let re = regex::RegexBuilder::new(&format!("^(?:{})$", m.value))
                            .size_limit(MAX_REGEX)
                            .build()
                            .ok()?;
                        Test::Like(re)
                    } else {
                        Test::Is(m.value)
                    };
                    Some((m.name, test, m.is_equal))
                })
                .collect();
            match (
                matchers,
                super::unix_s(&s.starts_at),
                super::unix_s(&s.ends_at),
            ) {
                (Some(matchers), Some(from), Some(to)) => {
                    out.rules.push(Rule { matchers, from, to })
                }
                _ => out.unreadable += 1,
            }
        }
        Ok(out)
    }

    /// Reads `base`'s silences (`/api/v2/silences`).
    pub fn fetch(base: &str) -> Result<Silences, String> {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(30)))
            .http_status_as_error(false)
            .build()
            .into();
        let url = format!("{}/api/v2/silences", base.trim_end_matches('/'));
        let mut answer = agent.get(&url).call().map_err(|e| format!("{url}: {e}"))?;
        let status = answer.status();
        let body = crate::bounded::body(&mut answer, MAX_BODY, &url, "the silences")?;
        if !status.is_success() {
            return Err(format!("{url} answered {status}"));
        }
        Self::parse(&body).map_err(|e| format!("{url}: {e}"))
    }

    /// Silences listed (readable ones).
    pub fn len(&self) -> usize {
        self.rules.len()
    }

    /// Whether none was listed.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Whether a silence matching the archived incident `v` was in force during it.
    pub fn covers(&self, v: &Value, instance: &str) -> bool {
        let (Some(start), Some(end)) = (
            v["started_at"].as_str().and_then(super::unix_s),
            v["ended_at"].as_str().and_then(super::unix_s),
        ) else {
            return false;
        };
        let labels = labels(v, instance);
        self.rules.iter().any(|r| {
            r.from <= end
                && start <= r.to
                && r.matchers.iter().all(|(name, test, equal)| {
                    // A label not sent is the empty string, as Alertmanager matches it.
                    let have = labels.get(name.as_str()).map_or("", String::as_str);
                    let hit = match test {
                        Test::Is(want) => have == want,
                        Test::Like(re) => re.is_match(have),
                    };
                    hit == *equal
                })
        })
    }
}

/// The labels cudatrace sent to Alertmanager for the archived incident `v`.
fn labels(v: &Value, instance: &str) -> BTreeMap<&'static str, String> {
    let s = |x: &Value| match x {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        _ => String::new(),
    };
    let victim = &v["victim"];
    BTreeMap::from([
        ("alertname", s(&v["alert"])),
        ("severity", s(&v["severity"])),
        ("cause", s(&v["cause"])),
        ("signal", s(&v["evidence"]["signal"])),
        ("gpu", s(&v["incident"]["gpu"])),
        ("pid", s(&victim["pid"])),
        ("comm", defang(&s(&victim["comm"])).into_owned()),
        ("namespace", s(&victim["namespace"])),
        ("pod", s(&victim["pod"])),
        ("container", s(&victim["container"])),
        ("workload", defang(&s(&victim["workload"])).into_owned()),
        ("instance", instance.to_owned()),
        ("aggressors", s(&v["incident"]["aggressors"])),
    ])
}

#[cfg(test)]
mod tests;
