//! Why a process is slowed: which GPU it shares with whom, what the others did on it in the same
//! window, and what NVML says of that GPU. Traced calls alone are enough for compute and copy
//! contention; memory pressure and throttling need NVML.
use crate::{
    alert::Cause,
    alert::Party,
    identity::Identity,
    identity::ProcessRef,
    nvml::{pci_bus, GpuSample},
};

pub use super::causes::classify;

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

/// The GPUs of a process: where NVML lists it, else its `CUDA_VISIBLE_DEVICES` (UUIDs and PCI
/// bus ids that NVML knows become indices, so that the forms compare), read through the container's
/// `NVIDIA_VISIBLE_DEVICES` (see [`host_devices`]). On a MIG GPU the unit is the GPU
/// instance, `INDEX/giN`: processes on two instances of one GPU share nothing, and the parent
/// GPU's NVML facts (utilization, memory) are not theirs.
pub fn gpus_of(pid: u32, identity: &Identity, gpus: &[GpuSample]) -> GpuSet {
    let listed: Vec<String> = gpus
        .iter()
        .filter_map(|g| {
            let p = g.processes.iter().find(|p| p.pid == pid)?;
            Some(match p.gpu_instance {
                Some(gi) => format!("{}/gi{gi}", g.index),
                None => g.index.to_string(),
            })
        })
        .collect();
    if !listed.is_empty() {
        return GpuSet::Only(listed);
    }
    match host_devices(identity) {
        None => GpuSet::All,
        Some(entries) => GpuSet::Only(
            entries
                .into_iter()
                .map(|e| {
                    if let Some(unit) = mig_unit(&e, gpus) {
                        return unit;
                    }
                    if let Some(bus) = pci_bus(&e) {
                        if let Some(g) = gpus.iter().find(|g| g.pci_bus == Some(bus)) {
                            return g.index.to_string();
                        }
                    }
                    match gpus
                        .iter()
                        .find(|g| e.starts_with("GPU-") && g.uuid.starts_with(&e))
                    {
                        Some(g) => g.index.to_string(),
                        None => e,
                    }
                })
                .collect(),
        ),
    }
}

/// A MIG device as the GPU instance it runs on (`INDEX/giN`, the unit NVML's process list
/// gives): named in its older form, `MIG-GPU-<uuid>/<gi>/<ci>`, when NVML knows the parent GPU;
/// in the newer, `MIG-<uuid>`, when NVML lists that MIG device under its GPU.
fn mig_unit(entry: &str, gpus: &[GpuSample]) -> Option<String> {
    let rest = entry.strip_prefix("MIG-")?;
    if !rest.starts_with("GPU-") {
        return gpus.iter().find_map(|g| {
            g.mig
                .iter()
                .find(|m| m.uuid == entry)
                .map(|m| format!("{}/gi{}", g.index, m.gpu_instance))
        });
    }
    let mut parts = rest.split('/');
    let (parent, gi) = (parts.next()?, parts.next()?.parse::<u32>().ok()?);
    let g = gpus.iter().find(|g| g.uuid == parent)?;
    Some(format!("{}/gi{gi}", g.index))
}

/// A process's memory per GPU (NVML's index of the UUID it read for each device), when every
/// byte it holds is on a device so named; else empty (its total then stands for each GPU).
pub fn memory_per_gpu(p: &super::Tracked<'_>, gpus: &[GpuSample]) -> Vec<(String, u64)> {
    let Some((devices, held)) = p.devices else {
        return Vec::new();
    };
    let named: Vec<(String, u64)> = held
        .iter()
        .filter_map(|(d, bytes)| {
            let uuid = devices.uuid_of_device((*d)?)?;
            let g = gpus
                .iter()
                .find(|g| crate::event::context::nvml_uuid_key(&g.uuid) == uuid)?;
            Some((g.index.to_string(), *bytes))
        })
        .collect();
    let all = named.iter().map(|n| n.1).sum::<u64>() == p.memory_bytes;
    if all {
        named
    } else {
        Vec::new()
    }
}

/// The devices a process can use, as the host names them (indices or UUIDs), from its
/// environment; `None`: every device. A container's runtime gives it the host's devices listed
/// in `NVIDIA_VISIBLE_DEVICES` and numbers them from 0 in that order, so an index in its
/// `CUDA_VISIBLE_DEVICES` is a position in that list, not a host index. (CUDA's own order is
/// fastest first unless `CUDA_DEVICE_ORDER=PCI_BUS_ID`; on a node of one GPU model it is the
/// bus order NVML's indices follow.)
pub fn host_devices(identity: &Identity) -> Option<Vec<String>> {
    let list = |s: &str| -> Vec<String> {
        s.split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(str::to_owned)
            .collect()
    };
    let runtime = identity.nvidia_visible_devices.as_deref().map(list);
    let Some(cuda) = identity.cuda_visible_devices.as_deref().map(list) else {
        return runtime;
    };
    let Some(runtime) = runtime else {
        return Some(cuda);
    };
    Some(
        cuda.into_iter()
            // An index past the container's devices ends the list, as CUDA reads it.
            .map_while(|e| match e.parse::<usize>() {
                Ok(k) => runtime.get(k).cloned(),
                Err(_) => Some(e),
            })
            .collect(),
    )
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
    /// The victim's run-queue delay, seconds per second: (before, now), when read.
    pub run_delay: Option<(f64, f64)>,
    /// Periods the victim's own CPU quota throttled it since its signal rose.
    pub throttled: Option<u64>,
    /// The facts the verdict used, in words, in the order it weighed them.
    pub chain: Vec<String>,
}

/// Clock-event reasons that slow kernels down (not idle, not a user's clock setting).
pub(super) const THROTTLE_BITS: u64 = 0x4 | 0x8 | 0x20 | 0x40 | 0x80;

/// Thresholds classification uses.
#[derive(Clone, Copy, Debug)]
pub struct Thresholds {
    /// Memory used/total at or above which a GPU is under pressure.
    pub memory_pressure_ratio: f64,
    /// NVML utilization (percent) below which a GPU is idle.
    pub idle_gpu_percent: u32,
    /// What counts as a rise of a party's submitted work.
    pub rise: super::change::Rise,
    /// Smallest rise of the victim's run-queue delay, seconds per second.
    pub run_delay_min: f64,
    /// Smallest rise of a cgroup's CPU use, CPUs, to be named.
    pub cpu_preemptor_min: f64,
    /// Smallest rise of an untraced process's SM utilization, points.
    pub untraced_min_sm: f64,
}

/// Others on the victim's GPU with a positive `weight`, with their share of the others' total
/// weight there, biggest first; and the GPU they share. The victim is left out of the total: its
/// own work is what its baseline already holds, and under contention its device time also
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

pub(super) fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests;
