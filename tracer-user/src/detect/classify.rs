//! Why a process is slowed: which GPU it shares with whom, what the others did on it in the same
//! window, and what NVML says of that GPU. Traced calls alone are enough for compute and copy
//! contention; memory pressure and throttling need NVML.
use super::signals::Signal;
use crate::{
    alert::Cause, alert::Party, identity::Identity, identity::ProcessRef, nvml::GpuSample,
    nvml::REASONS,
};

/// What one process did in the last window, as far as classification needs.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Activity {
    /// Kernel and graph launches.
    pub launches: u64,
    /// Estimated device time of the batches its waits closed, ns.
    pub gpu_ns: u64,
    /// Bytes copied, synchronous or not.
    pub copy_bytes: u64,
    /// Device memory held (traced allocations).
    pub memory_bytes: u64,
    /// When its oldest work not yet known finished was launched (CLOCK_MONOTONIC ns).
    pub open_since: Option<u64>,
    /// When its oldest call stuck in the driver (in flight for a window or more) entered.
    pub stuck_since: Option<u64>,
}

/// A process as classification sees it.
#[derive(Clone, Copy)]
pub struct Seen<'a> {
    /// Which process.
    pub process: ProcessRef<'a>,
    /// Its last window.
    pub activity: Activity,
}

/// The GPUs a process can use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GpuSet {
    /// Every GPU: `CUDA_VISIBLE_DEVICES` unset and NVML does not list the process.
    All,
    /// These GPUs (NVML indices, or `CUDA_VISIBLE_DEVICES` entries as written).
    Only(Vec<String>),
}

/// The GPUs of a process: where NVML lists it, else its `CUDA_VISIBLE_DEVICES` (UUIDs that NVML
/// knows become indices, so that the two forms compare).
pub fn gpus_of(pid: u32, identity: &Identity, gpus: &[GpuSample]) -> GpuSet {
    let listed: Vec<String> = gpus
        .iter()
        .filter(|g| g.processes.iter().any(|p| p.pid == pid))
        .map(|g| g.index.to_string())
        .collect();
    if !listed.is_empty() {
        return GpuSet::Only(listed);
    }
    let Some(visible) = identity.cuda_visible_devices.as_deref() else {
        return GpuSet::All;
    };
    let entries = visible
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|e| {
            match gpus
                .iter()
                .find(|g| e.starts_with("GPU-") && g.uuid.starts_with(e))
            {
                Some(g) => g.index.to_string(),
                None => e.to_owned(),
            }
        })
        .collect();
    GpuSet::Only(entries)
}

/// Whether a process may be a victim or an aggressor: NVML lists it on a GPU, or NVML lists no
/// process at all (no NVML, or it cannot see processes). A process that only calls a library
/// of its own making, which NVML does not see on any GPU, cannot raise or be named in an alert
/// while NVML sees the real ones (its calls are still counted).
pub fn vouched(pid: u32, gpus: &[GpuSample]) -> bool {
    let mut listed = gpus.iter().flat_map(|g| &g.processes).peekable();
    listed.peek().is_none()
        || gpus
            .iter()
            .any(|g| g.processes.iter().any(|p| p.pid == pid))
}

impl GpuSet {
    /// The first GPU both sets hold, if any.
    pub fn shared_with(&self, other: &GpuSet) -> Option<String> {
        match (self, other) {
            (GpuSet::All, GpuSet::All) => Some("all".into()),
            (GpuSet::All, GpuSet::Only(v)) | (GpuSet::Only(v), GpuSet::All) => v.first().cloned(),
            (GpuSet::Only(a), GpuSet::Only(b)) => a.iter().find(|g| b.contains(g)).cloned(),
        }
    }

    /// The set as an alert's `gpu`: `all`, or the GPUs joined by commas.
    pub fn label(&self) -> String {
        match self {
            GpuSet::All => "all".into(),
            GpuSet::Only(v) => v.join(","),
        }
    }

    /// Whether GPU `index` is one of the set.
    pub(super) fn holds(&self, index: u32) -> bool {
        match self {
            GpuSet::All => true,
            GpuSet::Only(v) => v.iter().any(|g| *g == index.to_string()),
        }
    }
}

/// The outcome: cause, GPU, aggressors, and the NVML facts of the victim's GPU.
#[derive(Clone, Debug, PartialEq)]
pub struct Verdict {
    /// Through which resource.
    pub cause: Cause,
    /// The GPU in question.
    pub gpu: String,
    /// Who, biggest share first (at most five).
    pub aggressors: Vec<Party>,
    /// NVML: highest memory used/total among the victim's GPUs.
    pub memory_ratio: Option<f64>,
    /// NVML: highest SM utilization (0-1) among the victim's GPUs.
    pub utilization: Option<f64>,
    /// NVML: throttling clock-event reasons on the victim's GPUs.
    pub reasons: Vec<&'static str>,
}

/// Clock-event reasons that slow kernels down (not idle, not a user's clock setting).
const THROTTLE_BITS: u64 = 0x4 | 0x8 | 0x20 | 0x40 | 0x80;

/// Thresholds classification uses.
#[derive(Clone, Copy, Debug)]
pub struct Thresholds {
    /// Memory used/total at or above which a GPU is under pressure.
    pub memory_pressure_ratio: f64,
    /// NVML utilization (percent) below which a GPU is idle.
    pub idle_gpu_percent: u32,
}

/// Others on the victim's GPU with a positive `weight`, with their share of the others' total
/// weight there, biggest first; and the GPU they share. The victim is left out of the total: its
/// own work is what its baseline already holds, and under contention its GPU-time estimate also
/// counts the time its kernels queued behind the others'.
pub(super) fn shares(
    victim: &Seen<'_>,
    vset: &GpuSet,
    others: &[(Seen<'_>, GpuSet)],
    weight: impl Fn(&Activity) -> f64,
) -> (Vec<Party>, Option<String>) {
    let on_gpu: Vec<(&Seen<'_>, String)> = others
        .iter()
        .filter(|(s, _)| s.process.pid != victim.process.pid && weight(&s.activity) > 0.0)
        .filter_map(|(s, set)| vset.shared_with(set).map(|g| (s, g)))
        .collect();
    let total: f64 = on_gpu.iter().map(|(s, _)| weight(&s.activity)).sum();
    let mut parties: Vec<Party> = on_gpu
        .iter()
        .map(|(s, _)| Party::of(s.process, Some(round3(weight(&s.activity) / total))))
        .collect();
    parties.sort_by(|a, b| {
        b.share
            .unwrap_or(0.0)
            .total_cmp(&a.share.unwrap_or(0.0))
            .then(a.pid.cmp(&b.pid))
    });
    parties.truncate(5);
    let gpu = parties
        .first()
        .and_then(|p| on_gpu.iter().find(|(s, _)| s.process.pid == p.pid))
        .map(|(_, g)| g.clone());
    (parties, gpu)
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// Classifies why `victim`'s `signal` breached, given every process's last window (`everyone`
/// may include the victim) and the latest NVML sample (empty without NVML).
pub fn classify(
    signal: Signal,
    victim: &Seen<'_>,
    everyone: &[Seen<'_>],
    gpus: &[GpuSample],
    limits: Thresholds,
) -> Verdict {
    let vset = gpus_of(victim.process.pid, victim.process.identity, gpus);
    let mine: Vec<&GpuSample> = gpus.iter().filter(|g| vset.holds(g.index)).collect();
    let memory_ratio = mine
        .iter()
        .filter_map(|g| Some(g.memory_used? as f64 / g.memory_total.filter(|t| *t > 0)? as f64))
        .max_by(f64::total_cmp);
    let utilization = mine
        .iter()
        .filter_map(|g| g.sm_util)
        .max()
        .map(|u| f64::from(u) / 100.0);
    let mut reasons: Vec<&'static str> = REASONS
        .iter()
        .filter(|(bit, _)| {
            bit & THROTTLE_BITS != 0 && mine.iter().any(|g| g.reasons.is_some_and(|r| r & bit != 0))
        })
        .map(|(_, name)| *name)
        .collect();
    reasons.dedup();
    let others: Vec<(Seen<'_>, GpuSet)> = everyone
        .iter()
        .filter(|s| s.process.pid != victim.process.pid && vouched(s.process.pid, gpus))
        .map(|s| (*s, gpus_of(s.process.pid, s.process.identity, gpus)))
        .collect();
    let verdict = |cause, aggressors, gpu: Option<String>| Verdict {
        cause,
        gpu: gpu.unwrap_or_else(|| vset.label()),
        aggressors,
        memory_ratio,
        utilization,
        reasons: reasons.clone(),
    };
    let (who, gpu) = super::starved::holders(victim, everyone, gpus);
    if !who.is_empty() {
        return verdict(Cause::Starvation, who, gpu);
    }
    if memory_ratio.is_some_and(|r| r >= limits.memory_pressure_ratio) {
        let (who, gpu) = shares(victim, &vset, &others, |a| a.memory_bytes as f64);
        return verdict(Cause::MemoryPressure, who, gpu);
    }
    // Compute work: the estimated device time when any process has one, else launches.
    let use_time = victim.activity.gpu_ns > 0 || others.iter().any(|(s, _)| s.activity.gpu_ns > 0);
    let compute = move |a: &Activity| {
        if use_time {
            a.gpu_ns as f64
        } else {
            a.launches as f64
        }
    };
    if signal == Signal::CopyTime {
        let (who, gpu) = shares(victim, &vset, &others, |a| a.copy_bytes as f64);
        if !who.is_empty() {
            return verdict(Cause::CopyContention, who, gpu);
        }
    }
    let (who, gpu) = shares(victim, &vset, &others, compute);
    if !who.is_empty() {
        return verdict(Cause::ComputeContention, who, gpu);
    }
    if !reasons.is_empty() && signal != Signal::LaunchLatency {
        return verdict(Cause::Throttling, Vec::new(), None);
    }
    let idle = utilization.is_none_or(|u| u * 100.0 < f64::from(limits.idle_gpu_percent));
    if signal == Signal::LaunchLatency && idle {
        return verdict(Cause::CpuOrDriverContention, Vec::new(), None);
    }
    verdict(Cause::Unexplained, Vec::new(), None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nvml::GpuProcess;

    fn id(cvd: Option<&str>) -> Identity {
        Identity {
            cuda_visible_devices: cvd.map(str::to_owned),
            container_id: Some("c1".into()),
            ..Default::default()
        }
    }
    fn seen<'a>(pid: u32, comm: &'a str, identity: &'a Identity, activity: Activity) -> Seen<'a> {
        Seen {
            process: ProcessRef {
                pid,
                comm,
                identity,
                workload: "",
            },
            activity,
        }
    }
    const LIMITS: Thresholds = Thresholds {
        memory_pressure_ratio: 0.95,
        idle_gpu_percent: 10,
    };

    fn act(launches: u64, gpu_ns: u64, copy_bytes: u64) -> Activity {
        Activity {
            launches,
            gpu_ns,
            copy_bytes,
            memory_bytes: 0,
            open_since: None,
            stuck_since: None,
        }
    }

    #[test]
    fn neighbour_on_the_same_visible_device_is_the_aggressor() {
        let (v, h, other_gpu) = (id(Some("0")), id(Some("0")), id(Some("1")));
        let everyone = [
            seen(1, "server", &v, act(1000, 1_000_000, 0)),
            seen(2, "trainer", &h, act(500, 9_000_000, 0)),
            seen(3, "elsewhere", &other_gpu, act(9000, 50_000_000, 0)),
        ];
        let got = classify(Signal::WaitPerLaunch, &everyone[0], &everyone, &[], LIMITS);
        assert_eq!(
            (got.cause, got.gpu.as_str()),
            (Cause::ComputeContention, "0")
        );
        assert_eq!(got.aggressors.len(), 1);
        assert_eq!(
            (
                got.aggressors[0].pid,
                got.aggressors[0].share,
                got.aggressors[0].container.as_deref()
            ),
            (2, Some(1.0), Some("c1"))
        );
        // Alone on GPU 1, nothing to blame; no NVML: unexplained.
        let got = classify(Signal::WaitPerLaunch, &everyone[2], &everyone, &[], LIMITS);
        assert_eq!(
            (got.cause, got.gpu.as_str(), got.aggressors.len()),
            (Cause::Unexplained, "1", 0)
        );
        // Launch latency up on an idle GPU: the host.
        let got = classify(Signal::LaunchLatency, &everyone[2], &everyone, &[], LIMITS);
        assert_eq!(got.cause, Cause::CpuOrDriverContention);
    }

    #[test]
    fn unset_visible_devices_share_everything_and_copies_blame_copiers() {
        let (a, b, c) = (id(None), id(None), id(Some("GPU-abcd")));
        let everyone = [
            seen(1, "a", &a, act(10, 0, 1 << 20)),
            seen(2, "b", &b, act(10, 0, 3 << 20)),
            seen(3, "c", &c, act(1000, 0, 0)),
        ];
        let got = classify(Signal::CopyTime, &everyone[0], &everyone, &[], LIMITS);
        assert_eq!(
            (got.cause, got.gpu.as_str()),
            (Cause::CopyContention, "all")
        );
        assert_eq!(
            got.aggressors
                .iter()
                .map(|p| (p.pid, p.share))
                .collect::<Vec<_>>(),
            vec![(2, Some(1.0))]
        );
        // The wait signal blames compute, by launches when no estimate exists: c (on a UUID the
        // unset process can also see) did 1000 of the others' 1010.
        let got = classify(Signal::WaitPerLaunch, &everyone[0], &everyone, &[], LIMITS);
        assert_eq!(got.cause, Cause::ComputeContention);
        assert_eq!(
            got.aggressors
                .iter()
                .map(|p| (p.pid, p.share))
                .collect::<Vec<_>>(),
            vec![(3, Some(0.99)), (2, Some(0.01))]
        );
        assert_eq!(got.gpu, "GPU-abcd");
    }

    #[test]
    fn nvml_places_processes_and_names_memory_pressure_and_throttling() {
        let (v, n) = (id(None), id(None));
        let gpu = |index, used, reasons, pids: &[u32]| GpuSample {
            index,
            uuid: format!("GPU-{index}"),
            memory_used: Some(used),
            memory_total: Some(100),
            sm_util: Some(90),
            reasons: Some(reasons),
            processes: pids
                .iter()
                .map(|&pid| GpuProcess {
                    pid,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let everyone = [
            seen(
                1,
                "v",
                &v,
                Activity {
                    memory_bytes: 10,
                    ..act(10, 0, 0)
                },
            ),
            seen(
                2,
                "n",
                &n,
                Activity {
                    memory_bytes: 86,
                    ..act(10, 0, 0)
                },
            ),
        ];
        // Both unset, but NVML puts them on different GPUs: no contention; GPU 0 throttles.
        let gpus = [gpu(0, 50, 0x20 | 0x1, &[1]), gpu(1, 50, 0, &[2])];
        let got = classify(
            Signal::WaitPerLaunch,
            &everyone[0],
            &everyone,
            &gpus,
            LIMITS,
        );
        assert_eq!((got.cause, got.gpu.as_str()), (Cause::Throttling, "0"));
        assert_eq!(
            (got.reasons.clone(), got.memory_ratio, got.utilization),
            (vec!["sw_thermal_slowdown"], Some(0.5), Some(0.9))
        );
        // Same GPU, 96% full: memory pressure, the neighbour by its memory.
        let gpus = [gpu(0, 96, 0, &[1, 2])];
        let got = classify(
            Signal::WaitPerLaunch,
            &everyone[0],
            &everyone,
            &gpus,
            LIMITS,
        );
        assert_eq!((got.cause, got.gpu.as_str()), (Cause::MemoryPressure, "0"));
        assert_eq!(
            got.aggressors
                .iter()
                .map(|p| (p.pid, p.share))
                .collect::<Vec<_>>(),
            vec![(2, Some(1.0))]
        );
    }

    #[test]
    fn processes_nvml_does_not_list_are_neither_victims_nor_aggressors() {
        let (v, fake, real) = (id(Some("0")), id(Some("0")), id(Some("0")));
        let gpu = |pids: &[u32]| GpuSample {
            index: 0,
            uuid: "GPU-0".into(),
            processes: pids
                .iter()
                .map(|&pid| GpuProcess {
                    pid,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let everyone = [
            seen(1, "victim", &v, act(10, 0, 0)),
            seen(2, "fake", &fake, act(5000, 0, 0)),
            seen(3, "real", &real, act(100, 0, 0)),
        ];
        // NVML lists the victim and the real neighbour: the fake library's caller is not named.
        let gpus = [gpu(&[1, 3])];
        let got = classify(
            Signal::WaitPerLaunch,
            &everyone[0],
            &everyone,
            &gpus,
            LIMITS,
        );
        assert_eq!(
            got.aggressors
                .iter()
                .map(|p| (p.pid, p.share))
                .collect::<Vec<_>>(),
            vec![(3, Some(1.0))]
        );
        assert!(vouched(1, &gpus) && vouched(3, &gpus) && !vouched(2, &gpus));
        // Without NVML, or with NVML listing nobody, every traced process counts.
        assert!(vouched(2, &[]) && vouched(2, &[gpu(&[])]));
        let got = classify(
            Signal::WaitPerLaunch,
            &everyone[0],
            &everyone,
            &[gpu(&[])],
            LIMITS,
        );
        assert_eq!(got.aggressors.first().map(|p| p.pid), Some(2));
    }
}
