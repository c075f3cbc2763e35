//! What the detector remembers per workload, across its processes and across restarts of
//! cudatrace: for each signal a [`Series`] (baseline, season, hourly history, drift). Processes
//! of one workload share it: a new pid (a restart, a new pod of the same Deployment) starts
//! with its workload's baseline, not a warm-up. Bounded by `[state] max_workloads` (the
//! longest unseen are dropped first, said once); the `state` module saves and loads it.
use std::{collections::HashMap, sync::Arc};

use serde::{Deserialize, Serialize};

use super::{
    baseline::{Baseline, Learned, Params},
    history::History,
    season::{Season, SeasonParams},
};
use crate::alert::{AlertChange, Party};

/// Longest workload name kept from a state file.
const MAX_NAME: usize = 256;

/// One (workload, signal): its baseline over values with the season removed, its season, its
/// hourly history and its drift alert.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Series {
    /// The baseline, of values with the season removed.
    pub baseline: Baseline,
    /// The season.
    pub season: Season,
    /// Hourly summaries.
    pub history: History,
    /// Since when (seconds since the epoch) the drift has been over the threshold.
    pub drift_since: Option<f64>,
    /// The drift alert, while firing.
    #[serde(skip)]
    pub drift: Option<AlertChange>,
    /// Whether an hour closed since the drift was last looked at.
    #[serde(skip)]
    pub hour_closed: bool,
}

impl Series {
    fn new(params: Params) -> Series {
        Series {
            baseline: Baseline::new(params),
            season: Season::default(),
            history: History::default(),
            drift_since: None,
            drift: None,
            hour_closed: false,
        }
    }

    /// The baseline p99 at wall time `t`, the season in; `None` while warming up.
    pub fn p99(&self, t: f64, sp: &SeasonParams) -> Option<f64> {
        Some(self.baseline.p99()? * self.season.factor(t, sp))
    }

    /// The forecast at wall time `t`, the season in.
    pub fn forecast(&self, t: f64, sp: &SeasonParams) -> f64 {
        self.baseline.forecast() * self.season.factor(t, sp)
    }

    /// A window that breached (not stuck): only the season learns it.
    pub fn season_only(&mut self, v: f64, t: f64, sp: &SeasonParams) {
        if self.season.learn(v, t, sp) {
            self.baseline.rescale(1.0 / self.season.factor(t, sp));
        }
    }

    /// Learns window value `v` at wall time `t`, keeping `keep_hours` of history.
    pub fn learn(&mut self, v: f64, t: f64, sp: &SeasonParams, keep_hours: usize) -> Learned {
        let d = v / self.season.factor(t, sp);
        let learned = self.baseline.learn(d);
        if self.season.learn(v, t, sp) {
            // From now on the baseline learns values with the season out: take it out of
            // what it learned before.
            self.baseline.rescale(1.0 / self.season.factor(t, sp));
        }
        if self.history.learn(v, d, t, keep_hours) {
            self.hour_closed = true;
        }
        learned
    }
}

/// One workload's series, and when it was last seen.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Remembered {
    /// A series per signal, in `Signal::ALL`'s order.
    pub series: [Series; 3],
    /// When a process of it was last evaluated, seconds since the epoch.
    pub seen: f64,
    /// Its latest process, as alerts name it.
    #[serde(skip)]
    pub latest: Option<Party>,
}

/// The per-workload memory.
pub struct Memory {
    workloads: HashMap<Arc<str>, Remembered>,
    params: Params,
    season: SeasonParams,
    keep_hours: usize,
    max: usize,
    /// Whether dropping workloads over `max` was said.
    said: bool,
}

impl Memory {
    /// An empty memory with these settings, holding at most `max` workloads.
    pub fn new(params: Params, season: SeasonParams, keep_hours: usize, max: usize) -> Memory {
        Memory {
            workloads: HashMap::new(),
            params,
            season,
            keep_hours,
            max: max.max(1),
            said: false,
        }
    }

    /// The season's settings.
    pub fn season(&self) -> &SeasonParams {
        &self.season
    }

    /// Hours of history kept.
    pub fn keep_hours(&self) -> usize {
        self.keep_hours
    }

    /// Workload `w`'s series of signal `i`, made on first use; `t` is now (wall seconds).
    pub fn series(&mut self, w: &Arc<str>, i: usize, t: f64) -> &mut Series {
        let params = self.params;
        let r = self
            .workloads
            .entry(w.clone())
            .or_insert_with(|| Remembered {
                series: std::array::from_fn(|_| Series::new(params)),
                seen: t,
                latest: None,
            });
        r.seen = t;
        &mut r.series[i]
    }

    /// Notes workload `w`'s latest process, as alerts name it.
    pub fn note(&mut self, w: &str, party: Party) {
        if let Some(r) = self.workloads.get_mut(w) {
            r.latest = Some(party);
        }
    }

    /// Every workload and its series.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (&Arc<str>, &mut Remembered)> {
        self.workloads.iter_mut()
    }

    /// Every workload and its series.
    pub fn iter(&self) -> impl Iterator<Item = (&Arc<str>, &Remembered)> {
        self.workloads.iter()
    }

    /// Workloads held.
    pub fn len(&self) -> usize {
        self.workloads.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.workloads.is_empty()
    }

    /// Drops workloads past the bound (not those with a drift alert firing), each time the
    /// longest unseen of the tenant holding the most, so that a tenant starting hundreds of
    /// one-off workloads drops its own and not another tenant's saved baseline; says so the
    /// first time. Returns how many went.
    pub fn bound(&mut self) -> usize {
        if self.workloads.len() <= self.max {
            return 0;
        }
        let over = self.workloads.len() - self.max;
        let droppable = self
            .workloads
            .iter()
            .filter(|(_, r)| r.series.iter().all(|s| s.drift.is_none()))
            .map(|(k, r)| (crate::identity::workload::tenant_of(k), r.seen, k.clone()));
        let gone_keys = super::fair::longest_unseen_of_largest(droppable, over);
        for k in &gone_keys {
            self.workloads.remove(k);
        }
        let gone = gone_keys.len();
        if gone > 0 && !self.said {
            self.said = true;
            log::warn!(
                target: "cudatrace::state",
                "state: more than max_workloads = {} workloads: the longest unseen are dropped (raise [state] max_workloads to keep more)",
                self.max
            );
        }
        gone
    }

    /// Takes a loaded workload in, when its name and numbers are sane and it fits the settings
    /// (a season of other settings is started over); false when it was refused.
    pub fn adopt(&mut self, name: &str, mut r: Remembered) -> bool {
        if name.is_empty() || name.len() > MAX_NAME || !r.seen.is_finite() {
            return false;
        }
        for s in &mut r.series {
            if !s.baseline.sane() || !s.history.fits(self.keep_hours) {
                return false;
            }
            s.baseline.set_params(self.params);
            if !s.season.fits(&self.season) {
                s.season = Season::default();
            }
            s.drift_since = s.drift_since.filter(|t| t.is_finite());
        }
        if self.workloads.len() >= self.max && !self.workloads.contains_key(name) {
            return false;
        }
        self.workloads.insert(Arc::from(name), r);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_past_the_bound_drops_its_own_workloads() {
        let mut m = Memory::new(
            Params::default(),
            SeasonParams {
                len_s: 86_400,
                bucket_s: 3600,
                history: 3,
            },
            24,
            4,
        );
        // The victim's workload, seen first (the longest unseen of all).
        m.series(&Arc::from("serving/llm/server"), 0, 1.0);
        // 300 one-off jobs of another namespace, each newer than the last.
        for k in 0..300 {
            m.series(
                &Arc::from(format!("batch/job-{k}/main").as_str()),
                0,
                2.0 + k as f64,
            );
            m.bound();
        }
        assert_eq!(m.len(), 4);
        let kept: Vec<String> = m.iter().map(|(k, _)| k.to_string()).collect();
        assert!(kept.contains(&"serving/llm/server".to_owned()), "{kept:?}");
        assert!(kept.contains(&"batch/job-299/main".to_owned()), "{kept:?}");
    }
}
