//! Proposed changes to `[detect]`, each with its effect measured on history: the same series
//! replayed ([`super::replay`]) once with the config as it is and once per variant (a tier
//! threshold raised, a longer debounce), and the incidents that fired in each compared. A
//! variant is proposed when it fires fewer incidents and keeps every page (the same victim and
//! alert paging at an overlapping time); how much later the latest kept page came is said.
//! `[[detect.schedule]]` periods keep their own tiers: the variants change the defaults only.
use std::{
    collections::BTreeMap,
    time::{Duration, SystemTime},
};

use serde::Serialize;

use super::prometheus::Matrix;
use crate::{
    alert::{AlertChange, AlertState, Severity},
    config::DetectConfig,
};

/// An incident that fired in a replay.
#[derive(Debug, Clone, PartialEq)]
struct Fired {
    pid: u32,
    alert: &'static str,
    /// Highest severity it fired at.
    severity: Severity,
    /// When it first fired, and when it ended (seconds into the range).
    fired: u64,
    ended: u64,
}

/// One variant tried, and what it did to the incidents that fired.
#[derive(Debug, PartialEq, Serialize)]
pub struct Effect {
    /// The change, in words ("warning at +15% instead of +10%").
    pub change: String,
    /// Fired incidents at `page`, `critical` and `warning` with the variant.
    pub tiers: [u64; 3],
    /// Pages of the config as it is that the variant no longer sends.
    pub pages_lost: u64,
    /// The most seconds a kept page came later than it does now.
    pub page_delay_s: u64,
    /// Fewer incidents and every page kept.
    pub proposed: bool,
}

/// The replays' outcome.
#[derive(Debug, Default, PartialEq, Serialize)]
pub struct Proposals {
    /// Windows replayed, each variant.
    pub windows: u64,
    /// Fired incidents at `page`, `critical` and `warning` with the config as it is.
    pub tiers: [u64; 3],
    /// Each variant tried, in the order tried.
    pub variants: Vec<Effect>,
}

fn pct(f: f64) -> String {
    format!("+{:.0}%", f * 100.0)
}

/// The variants of `cfg` tried: each a change in words and the config it makes.
pub fn variants(cfg: &DetectConfig) -> Vec<(String, DetectConfig)> {
    let mut out = Vec::new();
    let mut vary = |change: String, set: &dyn Fn(&mut DetectConfig)| {
        let mut c = cfg.clone();
        set(&mut c);
        out.push((change, c));
    };
    for step in [0.05, 0.10] {
        let w = cfg.warning + step;
        if w < cfg.critical - 1e-9 {
            let change = format!("warning at {} instead of {}", pct(w), pct(cfg.warning));
            vary(change, &|c| c.warning = w);
        }
    }
    let crit = cfg.critical + 0.10;
    if crit < cfg.page - 1e-9 {
        let change = format!("critical at {} instead of {}", pct(crit), pct(cfg.critical));
        vary(change, &|c| c.critical = crit);
    }
    let (pending, firing, resolve) = (
        cfg.pending_windows + 2,
        cfg.firing_after_s.saturating_mul(2).max(1),
        cfg.resolve_after_s.saturating_mul(2).max(1),
    );
    let change = format!(
        "pending after {pending} breaching windows instead of {}",
        cfg.pending_windows
    );
    vary(change, &|c| c.pending_windows = pending);
    let change = format!(
        "firing after {firing} s instead of {} s",
        cfg.firing_after_s
    );
    vary(change, &|c| c.firing_after_s = firing);
    let change = format!(
        "resolved after {resolve} s without a breach instead of {} s",
        cfg.resolve_after_s
    );
    vary(change, &|c| c.resolve_after_s = resolve);
    out
}

/// The incidents that fired when `matrix` is replayed through `cfg`.
fn fired(matrix: Matrix, cfg: &DetectConfig, range: (SystemTime, Duration, u64)) -> Vec<Fired> {
    let from = range.0;
    let secs = |at: &str| {
        humantime::parse_rfc3339(at)
            .ok()
            .and_then(|t| t.duration_since(from).ok())
            .map_or(0, |d| d.as_secs())
    };
    let mut open: BTreeMap<(u32, &'static str, String), Fired> = BTreeMap::new();
    let mut out = Vec::new();
    super::replay(matrix, cfg, range, |c: &AlertChange| {
        let key = (c.victim.pid, c.alert, c.started_at.clone());
        match c.state {
            AlertState::Pending => {}
            AlertState::Firing => {
                let at = secs(&c.at);
                let f = open.entry(key).or_insert(Fired {
                    pid: c.victim.pid,
                    alert: c.alert,
                    severity: c.severity,
                    fired: at,
                    ended: at,
                });
                f.severity = f.severity.max(c.severity);
            }
            AlertState::Resolved => {
                if let Some(mut f) = open.remove(&key) {
                    f.ended = secs(&c.at);
                    out.push(f);
                }
            }
        }
    });
    // Still firing at the range's end.
    let end = range.1.as_secs() * range.2;
    out.extend(open.into_values().map(|mut f| {
        f.ended = end;
        f
    }));
    out
}

fn tiers(f: &[Fired]) -> [u64; 3] {
    f.iter().fold([0; 3], |mut t, f| {
        t[match f.severity {
            Severity::Page => 0,
            Severity::Critical => 1,
            Severity::Warning => 2,
        }] += 1;
        t
    })
}

/// Replays `matrix` over `range` (from, step, windows) with `cfg` and with each of its
/// [`variants`].
pub fn propose(
    matrix: &Matrix,
    cfg: &DetectConfig,
    range: (SystemTime, Duration, u64),
) -> Proposals {
    let now = fired(matrix.clone(), cfg, range);
    let pages: Vec<&Fired> = now
        .iter()
        .filter(|f| f.severity == Severity::Page)
        .collect();
    let mut out = Proposals {
        windows: range.2,
        tiers: tiers(&now),
        variants: Vec::new(),
    };
    for (change, c) in variants(cfg) {
        let then = fired(matrix.clone(), &c, range);
        let (mut lost, mut delay) = (0, 0);
        for p in &pages {
            let kept = then.iter().find(|f| {
                f.severity == Severity::Page
                    && f.pid == p.pid
                    && f.alert == p.alert
                    && f.fired <= p.ended
                    && p.fired <= f.ended
            });
            match kept {
                Some(f) => delay = delay.max(f.fired.saturating_sub(p.fired)),
                None => lost += 1,
            }
        }
        let t = tiers(&then);
        out.variants.push(Effect {
            change,
            proposed: lost == 0 && t.iter().sum::<u64>() < out.tiers.iter().sum::<u64>(),
            tiers: t,
            pages_lost: lost,
            page_delay_s: delay,
        });
    }
    out
}

impl Proposals {
    /// The proposals as lines for a terminal.
    pub fn lines(&self, step_s: u64) -> Vec<String> {
        let [p, c, w] = self.tiers;
        let mut out = vec![format!(
            "replayed on Prometheus's history ({} windows of {step_s} s): page {p}, critical {c}, warning {w} fired",
            self.windows
        )];
        for e in &self.variants {
            let [p2, c2, w2] = e.tiers;
            let gone = (p + c + w).saturating_sub(p2 + c2 + w2);
            let effect = format!("page {p} -> {p2}, critical {c} -> {c2}, warning {w} -> {w2}");
            out.push(if e.proposed {
                let later = match e.page_delay_s {
                    0 => String::new(),
                    d => format!(", the latest {d} s later"),
                };
                format!(
                    "proposed: {}: {gone} of {} incidents gone ({effect}), every page kept{later}",
                    e.change,
                    p + c + w
                )
            } else if e.pages_lost > 0 {
                format!(
                    "not proposed: {}: {} of {p} pages lost ({effect})",
                    e.change, e.pages_lost
                )
            } else {
                format!("not proposed: {}: nothing gone ({effect})", e.change)
            })
        }
        out
    }
}
