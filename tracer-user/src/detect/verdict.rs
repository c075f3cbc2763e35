//! The facts a causal verdict compares, before the victim's signal rose and now: what every
//! traced process submitted, the victim's own work per step and run-queue delay, each cgroup's
//! CPU use, NVML's utilization per process and per GPU. The reference is frozen when an alert
//! is first classified (its breach's start), so that a long alert keeps comparing against the
//! world before it.
use std::collections::{HashMap, HashSet};

use super::change::{per_s, Measure, Recent, Work, WorkHistory};
use crate::{hostcpu::CgroupCpu, nvml::GpuSample};

/// Cgroups and NVML processes remembered at most.
const MAX_KEYS: usize = 4096;

/// The measures of traced work, in the order of [`Traced`]'s arrays.
pub const TRACED: [Measure; 3] = [
    Measure::ThreadsPerS,
    Measure::GraphLaunchesPerS,
    Measure::CopyBytesPerS,
];

/// A kernel's usual launch, learned in windows where its process breached nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Usual {
    /// Threads per launch.
    pub threads_per_launch: f64,
    /// Its grid then, when a launch of it was seen.
    pub grid: Option<[u32; 3]>,
}

/// Work per step: what the victim asks for each time, whatever the pace.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Steps {
    /// Threads per kernel launch.
    pub threads_per_launch: Option<f64>,
    /// Kernel launches per wait.
    pub launches_per_step: Option<f64>,
    /// Bytes per copy.
    pub bytes_per_copy: Option<f64>,
}

fn ratio(a: u64, b: u64) -> Option<f64> {
    (b > 0).then(|| a as f64 / b as f64)
}

impl Steps {
    fn of(w: &Work) -> Steps {
        Steps {
            threads_per_launch: ratio(w.threads, w.launches),
            launches_per_step: ratio(w.launches, w.waits),
            bytes_per_copy: ratio(w.copy_bytes, w.copies),
        }
    }
}

/// One cgroup's CPU use over time.
#[derive(Default)]
struct CgroupTrack {
    last: Option<(f64, u64, u64, Option<u64>)>,
    cpu: Recent,
    throttled: Recent,
    /// Seconds per second some of its tasks waited for a CPU (PSI).
    pressure: Recent,
    pid: Option<u32>,
}

/// What the detector keeps of the host beside the traced processes.
#[derive(Default)]
pub struct HostHistory {
    cgroups: HashMap<String, CgroupTrack>,
    /// NVML SM utilization per process (traced or not).
    sm: HashMap<u32, Recent>,
    /// NVML SM utilization per GPU.
    gpu: HashMap<u32, Recent>,
}

impl HostHistory {
    /// Counts a pass over the cgroups read at `now` (monotonic seconds).
    pub fn cgroups(&mut self, cgroups: Vec<CgroupCpu>, now: f64) {
        let seen: HashSet<String> = cgroups.iter().map(|c| c.path.clone()).collect();
        for c in cgroups {
            if self.cgroups.len() >= MAX_KEYS && !self.cgroups.contains_key(&c.path) {
                continue;
            }
            let t = self.cgroups.entry(c.path).or_default();
            if let Some((then, usage, throttled, pressure)) = t.last {
                let dt = (now - then).max(1e-3);
                let used = c.usage_usec.saturating_sub(usage) as f64 / 1e6;
                t.cpu.push(then, used / dt);
                t.throttled
                    .push(then, c.nr_throttled.saturating_sub(throttled) as f64);
                if let Some((p, was)) = c.pressure_usec.zip(pressure) {
                    t.pressure
                        .push(then, p.saturating_sub(was) as f64 / 1e6 / dt);
                }
            }
            t.last = Some((now, c.usage_usec, c.nr_throttled, c.pressure_usec));
            t.pid = c.pid;
        }
        self.cgroups.retain(|p, _| seen.contains(p));
    }

    /// Counts an NVML sample over the window that started at `start`.
    pub fn nvml(&mut self, gpus: &[GpuSample], start: f64) {
        let mut seen = HashSet::new();
        for g in gpus {
            if let Some(u) = g.sm_util {
                self.gpu
                    .entry(g.index)
                    .or_default()
                    .push(start, f64::from(u));
            }
            for p in &g.processes {
                let Some(u) = p.sm_util else { continue };
                seen.insert(p.pid);
                if self.sm.len() < MAX_KEYS || self.sm.contains_key(&p.pid) {
                    self.sm.entry(p.pid).or_default().push(start, f64::from(u));
                }
            }
        }
        // A process NVML no longer lists is done: it keeps no utilization.
        self.sm.retain(|pid, _| seen.contains(pid));
    }
}

/// Everything before the victim's signal rose, frozen at its alert's first verdict.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Reference {
    /// When the victim's breach began (monotonic seconds).
    pub since: f64,
    /// Per traced process, its [`TRACED`] measures then (`None`: it was not there).
    pub traced: HashMap<u32, [Option<f64>; 3]>,
    /// Per traced process, its work per step then.
    pub steps: HashMap<u32, Steps>,
    /// The victim's work per step then.
    pub victim: Steps,
    /// The victim's run-queue delay then, seconds per second.
    pub run_delay: Option<f64>,
    /// Per cgroup, its CPU seconds per second then.
    pub cgroups: HashMap<String, f64>,
    /// Per process NVML lists, its SM utilization then.
    pub sm: HashMap<u32, f64>,
    /// Per GPU, its SM utilization then.
    pub gpu: HashMap<u32, f64>,
}

/// The same facts now (the windows since the breach began).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Nows {
    /// Per traced process, its [`TRACED`] measures now.
    pub traced: HashMap<u32, [f64; 3]>,
    /// Per traced process, its work per step now.
    pub steps: HashMap<u32, Steps>,
    /// The victim's work per step now.
    pub victim: Steps,
    /// The victim's run-queue delay now, seconds per second.
    pub run_delay: Option<f64>,
    /// Per cgroup: its CPU seconds per second now and a process in it.
    pub cgroups: HashMap<String, (f64, Option<u32>)>,
    /// Periods the victim's own cgroup was throttled since.
    pub throttled: u64,
    /// Per process NVML lists, its SM utilization now.
    pub sm: HashMap<u32, f64>,
    /// Per GPU, its SM utilization now.
    pub gpu: HashMap<u32, f64>,
}

fn run_delay(w: &Work) -> Option<f64> {
    w.run_delay_ns.map(|ns| ns as f64 / 1e9 / w.len.max(1e-3))
}

fn steps_since(h: &WorkHistory, since: f64) -> Steps {
    let pick = |f: fn(&Steps) -> Option<f64>| {
        let n = h.windows().filter(|w| w.start >= since - 1e-6).count();
        (n > 0
            && h.windows()
                .any(|w| w.start >= since - 1e-6 && f(&Steps::of(w)).is_some()))
        .then(|| h.since(since, |w| f(&Steps::of(w))))
    };
    Steps {
        threads_per_launch: pick(|s| s.threads_per_launch),
        launches_per_step: pick(|s| s.launches_per_step),
        bytes_per_copy: pick(|s| s.bytes_per_copy),
    }
}

fn steps_before(h: &WorkHistory, since: f64) -> Steps {
    Steps {
        threads_per_launch: h.reference(since, |w| Steps::of(w).threads_per_launch),
        launches_per_step: h.reference(since, |w| Steps::of(w).launches_per_step),
        bytes_per_copy: h.reference(since, |w| Steps::of(w).bytes_per_copy),
    }
}

impl HostHistory {
    /// The reference of a victim (`pid`, in cgroup `cgroup`) whose breach began at `since`.
    pub fn reference(
        &self,
        since: f64,
        (pid, cgroup): (u32, Option<&str>),
        histories: &HashMap<u32, WorkHistory>,
    ) -> Reference {
        let pressure = cgroup
            .and_then(|c| self.cgroups.get(c))
            .filter(|t| t.pressure.last_start().is_some());
        let traced = histories
            .iter()
            .map(|(p, h)| {
                (
                    *p,
                    TRACED.map(|m| h.reference(since, |w| Some(per_s(m, w)))),
                )
            })
            .collect();
        let steps: HashMap<u32, Steps> = histories
            .iter()
            .map(|(p, h)| (*p, steps_before(h, since)))
            .collect();
        let mine = histories.get(&pid);
        let victim = steps.get(&pid).copied().unwrap_or_default();
        Reference {
            since,
            traced,
            steps,
            victim,
            run_delay: mine
                .and_then(|h| h.reference(since, run_delay))
                .or_else(|| pressure.and_then(|t| t.pressure.reference(since))),
            cgroups: self
                .cgroups
                .iter()
                .filter_map(|(p, t)| Some((p.clone(), t.cpu.reference(since)?)))
                .collect(),
            sm: self
                .sm
                .iter()
                .filter_map(|(p, r)| Some((*p, r.reference(since)?)))
                .collect(),
            gpu: self
                .gpu
                .iter()
                .filter_map(|(g, r)| Some((*g, r.reference(since)?)))
                .collect(),
        }
    }

    /// The same facts now, for a victim in `cgroup`.
    pub fn nows(
        &self,
        since: f64,
        (pid, cgroup): (u32, Option<&str>),
        histories: &HashMap<u32, WorkHistory>,
    ) -> Nows {
        let mine = histories.get(&pid);
        let own = cgroup.and_then(|c| self.cgroups.get(c));
        let steps: HashMap<u32, Steps> = histories
            .iter()
            .map(|(p, h)| (*p, steps_since(h, since)))
            .collect();
        Nows {
            traced: histories
                .iter()
                .map(|(p, h)| (*p, TRACED.map(|m| h.since(since, |w| Some(per_s(m, w))))))
                .collect(),
            victim: steps.get(&pid).copied().unwrap_or_default(),
            steps,
            run_delay: mine
                .filter(|h| h.windows().any(|w| w.run_delay_ns.is_some()))
                .map(|h| h.since(since, run_delay))
                .or_else(|| {
                    own.filter(|t| t.pressure.last_start().is_some())
                        .map(|t| t.pressure.since(since))
                }),
            cgroups: self
                .cgroups
                .iter()
                .map(|(p, t)| (p.clone(), (t.cpu.since(since), t.pid)))
                .collect(),
            throttled: own.map_or(0, |t| t.throttled.sum_since(since) as u64),
            sm: self.sm.iter().map(|(p, r)| (*p, r.since(since))).collect(),
            gpu: self.gpu.iter().map(|(g, r)| (*g, r.since(since))).collect(),
        }
    }
}

/// What a window of `w` submitted, with the run-queue delay read for it.
pub fn work_of(w: &super::signals::Window, start: f64, len: f64, delay: Option<u64>) -> Work {
    Work {
        start,
        len,
        launches: w.launches.saturating_sub(w.graph_launches),
        threads: w.threads,
        graph_launches: w.graph_launches,
        copy_bytes: w.copy_bytes,
        copies: w.copies,
        waits: w.waits + w.sync_copies,
        run_delay_ns: delay,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nvml::GpuProcess;

    fn cg(path: &str, usage_usec: u64, nr_throttled: u64, pressure: u64) -> CgroupCpu {
        CgroupCpu {
            path: path.into(),
            usage_usec,
            nr_throttled,
            pressure_usec: Some(pressure),
            pid: Some(7),
        }
    }

    #[test]
    fn cgroup_rates_and_nvml_utilization_before_and_since() {
        let mut h = HostHistory::default();
        // Every 5 s: /hogs idle until 20 s, then a whole CPU; /victim waits 0.3 s/s for a CPU
        // from then, and its quota throttles it twice a window.
        for k in 0..8u64 {
            let t = k as f64 * 5.0;
            let hot = k > 4;
            let hogs = if hot { (k - 4) * 5_000_000 } else { 0 };
            let waited = if hot { (k - 4) * 1_500_000 } else { 0 };
            let throttled = if hot { (k - 4) * 2 } else { 0 };
            h.cgroups(
                vec![cg("/hogs", hogs, 0, 0), cg("/victim", 0, throttled, waited)],
                t,
            );
            let g = GpuSample {
                index: 0,
                sm_util: Some(if hot { 90 } else { 30 }),
                processes: vec![GpuProcess {
                    pid: 9,
                    sm_util: Some(if hot { 60 } else { 0 }),
                    ..Default::default()
                }],
                ..Default::default()
            };
            // A sample stands for the window that ends when it is taken.
            if k > 0 {
                h.nvml(&[g], t - 5.0);
            }
        }
        let r = h.reference(20.0, (1, Some("/victim")), &HashMap::new());
        let n = h.nows(20.0, (1, Some("/victim")), &HashMap::new());
        assert_eq!(r.cgroups.get("/hogs"), Some(&0.0));
        assert_eq!(n.cgroups.get("/hogs"), Some(&(1.0, Some(7))));
        // No schedstat here: the victim's own cgroup's CPU pressure stands in.
        assert_eq!((r.run_delay, n.run_delay), (Some(0.0), Some(0.3)));
        assert_eq!(n.throttled, 6);
        assert_eq!((r.gpu.get(&0), n.gpu.get(&0)), (Some(&30.0), Some(&90.0)));
        assert_eq!((r.sm.get(&9), n.sm.get(&9)), (Some(&0.0), Some(&60.0)));
        // A cgroup gone from the pass is forgotten.
        h.cgroups(vec![cg("/victim", 0, 0, 0)], 40.0);
        assert!(!h
            .nows(20.0, (1, None), &HashMap::new())
            .cgroups
            .contains_key("/hogs"));
    }
}
