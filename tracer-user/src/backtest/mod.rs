//! `cudatrace backtest`: series of `cudatrace_signal_value` read back from Prometheus
//! ([`prometheus`]) replayed through the same detector `run` uses: one window a step, each
//! series' value given whole to its window ([`crate::detect::Detector::preset`]), so that
//! baselines, seasons, drift, tiers and debounce are `run`'s own. The series of one process
//! (same labels but `signal`) are one replayed process; its workload is the `workload` label,
//! else its namespace, pod, container and comm. There is no GPU and no neighbour in a replay:
//! causes are `unexplained` (or `degradation`).
use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, SystemTime},
};

use crate::{
    alert::AlertChange,
    config::DetectConfig,
    detect::{Detector, Processes, Signal, Slot, Tracked},
    identity::{Comm, Identity, PodNames},
};

pub mod prometheus;
pub mod propose;

/// A process's series: (signal, values by step).
type Series = Vec<(Signal, BTreeMap<u64, f64>)>;

/// Processes replayed at most (one a series group: labels but `signal` alike).
pub const MAX_PROCESSES: usize = 4096;

/// One replayed process. `pid` is its place in the replay (one for each instance and pid, so
/// that a pid seen on two instances is two processes); `shown_pid` is the `pid` label.
struct Replayed {
    pid: u32,
    shown_pid: u32,
    comm: Comm,
    identity: Arc<Identity>,
    workload: Arc<str>,
    slot: Slot,
    /// Its series: (signal, values by step).
    series: Series,
}

/// The replayed processes, as the detector reads them.
struct Replay(Vec<Replayed>);

impl Processes for Replay {
    fn tracked(&self) -> impl Iterator<Item = Tracked<'_>> {
        self.0.iter().map(|p| Tracked {
            pid: p.pid,
            comm: &p.comm,
            identity: &p.identity,
            workload: &p.workload,
            memory_bytes: 0,
            devices: None,
            exited: false,
            open_since: None,
            signals: p.slot.as_deref(),
        })
    }

    fn slots_mut(&mut self) -> impl Iterator<Item = (u32, Comm, Arc<str>, &mut Slot)> {
        self.0
            .iter_mut()
            .map(|p| (p.pid, p.comm, p.workload.clone(), &mut p.slot))
    }

    fn slot_mut(&mut self, pid: u32) -> Option<&mut Slot> {
        // Places are 1, 2, 3, ...: found at once, not by a search through every process.
        let i = (pid as usize).checked_sub(1)?;
        self.0
            .get_mut(i)
            .filter(|p| p.pid == pid)
            .map(|p| &mut p.slot)
    }
}

/// What a replay did.
#[derive(Debug, Default, PartialEq)]
pub struct Summary {
    /// Series replayed.
    pub series: usize,
    /// Processes they make.
    pub processes: usize,
    /// Workloads.
    pub workloads: usize,
    /// Windows replayed.
    pub windows: u64,
    /// Alert changes, and of them those that fired.
    pub changes: usize,
    /// Of them, firing.
    pub fired: usize,
}

/// The workload of a series: its `workload` label, else its namespace, pod, container and comm.
pub fn workload_of(l: &prometheus::Labels) -> String {
    if let Some(w) = l.get("workload").filter(|w| !w.is_empty()) {
        return w.clone();
    }
    let get = |k: &str| l.get(k).map(String::as_str).unwrap_or("");
    let parts: Vec<&str> = ["namespace", "pod", "container", "comm"]
        .into_iter()
        .map(get)
        .filter(|v| !v.is_empty())
        .collect();
    if parts.is_empty() {
        "unnamed".into()
    } else {
        parts.join("/")
    }
}

/// How many processes the series make (labels but `signal` alike).
pub fn process_count(matrix: &prometheus::Matrix) -> usize {
    matrix
        .keys()
        .map(|l| l.iter().filter(|(k, _)| *k != "signal").collect::<Vec<_>>())
        .collect::<std::collections::BTreeSet<_>>()
        .len()
}

/// Groups the series into processes (labels but `signal` alike).
fn processes(matrix: prometheus::Matrix) -> (Vec<Replayed>, usize) {
    let mut by: BTreeMap<prometheus::Labels, Series> = BTreeMap::new();
    let mut series = 0;
    for (mut labels, values) in matrix {
        let Some(signal) = labels
            .remove("signal")
            .and_then(|s| Signal::ALL.into_iter().find(|x| x.as_str() == s))
        else {
            continue;
        };
        series += 1;
        by.entry(labels).or_default().push((signal, values));
    }
    let procs = by
        .into_iter()
        .enumerate()
        .map(|(i, (labels, series))| {
            let get = |k: &str| labels.get(k).cloned().unwrap_or_default();
            let pid = i as u32 + 1;
            let shown_pid = get("pid").parse().unwrap_or(pid);
            let kube = (!get("namespace").is_empty()).then(|| PodNames {
                namespace: get("namespace"),
                pod: get("pod"),
                container: get("container"),
                owner: String::new(),
                ..Default::default()
            });
            let workload = workload_of(&labels);
            Replayed {
                pid,
                shown_pid,
                comm: Comm::from(get("comm").as_str()),
                identity: Arc::new(Identity {
                    kube,
                    alive: true,
                    ..Identity::default()
                }),
                workload: Arc::from(workload.as_str()),
                slot: None,
                series,
            }
        })
        .collect();
    (procs, series)
}

/// Replays `matrix` (values by step from `from`, `step` apart, `windows` steps) through a
/// detector of `cfg`; every alert change goes to `out` as it happens.
pub fn replay(
    matrix: prometheus::Matrix,
    cfg: &DetectConfig,
    (from, step, windows): (SystemTime, Duration, u64),
    mut out: impl FnMut(&AlertChange),
) -> Summary {
    let (procs, series) = processes(matrix);
    let mut replay = Replay(procs);
    let mut detector = Detector::new(cfg.clone(), 0.0);
    let mut summary = Summary {
        series,
        processes: replay.0.len(),
        workloads: replay
            .0
            .iter()
            .map(|p| p.workload.clone())
            .collect::<std::collections::BTreeSet<_>>()
            .len(),
        windows,
        ..Summary::default()
    };
    for k in 0..windows {
        for p in &mut replay.0 {
            for (signal, values) in &p.series {
                if let Some(v) = values.get(&k) {
                    detector.preset(&mut p.slot, *signal, v * 1e9);
                }
            }
        }
        // A window ends at its step's time.
        let mono = (k as f64 + 1.0) * step.as_secs_f64();
        let wall = from + step * (k as u32);
        detector.evaluate(&mut replay, mono, wall, &[]);
        for mut c in detector.take_changes() {
            // The pid as the series named it.
            if let Some(p) = (c.victim.pid as usize)
                .checked_sub(1)
                .and_then(|i| replay.0.get(i))
            {
                c.victim.pid = p.shown_pid;
            }
            summary.changes += 1;
            if c.state == crate::alert::AlertState::Firing {
                summary.fired += 1;
            }
            out(&c);
        }
    }
    summary
}

#[cfg(test)]
mod tests;
