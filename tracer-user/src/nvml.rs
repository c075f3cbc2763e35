//! NVML sampling through nvml-wrapper: per GPU utilization, memory, temperature, power, SM
//! clock, clock-event (throttle) reasons, PCIe throughput, and per process memory and
//! utilization. Without NVML (no driver), sampling is off, `cudatrace_nvml_up` is 0 and the
//! reason is logged once.
use std::{collections::HashMap, path::PathBuf};

use nvml_wrapper::{
    enum_wrappers::device::{Clock, PcieUtilCounter, TemperatureSensor},
    enums::device::UsedGpuMemory,
    error::NvmlError,
    Nvml,
};

/// Clock-event reason bits (nvmlClocksEventReasons) and their metric label.
pub const REASONS: [(u64, &str); 9] = [
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
];

/// One process on one GPU.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuProcess {
    /// Process id.
    pub pid: u32,
    /// Device memory used, when NVML knows it.
    pub memory_bytes: Option<u64>,
    /// SM utilization 0-100 over the last sample period, when sampled.
    pub sm_util: Option<u32>,
    /// Memory-controller utilization 0-100, when sampled.
    pub mem_util: Option<u32>,
    /// A client of the GPU's MPS server: NVML lists it in its MPS process query, not its
    /// compute-process list (which holds the server instead).
    pub mps: bool,
    /// The MIG GPU instance it runs on, when MIG is enabled: the unit of contention and of
    /// memory (NVML has no utilization per instance).
    pub gpu_instance: Option<u32>,
}

/// One GPU's sample; a field is `None` when the device does not support it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuSample {
    /// NVML index.
    pub index: u32,
    /// UUID.
    pub uuid: String,
    /// SM utilization 0-100.
    pub sm_util: Option<u32>,
    /// Memory-controller utilization 0-100.
    pub mem_util: Option<u32>,
    /// Device memory used.
    pub memory_used: Option<u64>,
    /// Device memory total.
    pub memory_total: Option<u64>,
    /// Temperature, °C.
    pub temperature: Option<u32>,
    /// Power, milliwatts.
    pub power_mw: Option<u32>,
    /// SM clock, MHz.
    pub sm_clock_mhz: Option<u32>,
    /// Clock-event reason bits.
    pub reasons: Option<u64>,
    /// PCIe KB/s sent and received.
    pub pcie_kbs: Option<(u32, u32)>,
    /// Compute processes.
    pub processes: Vec<GpuProcess>,
    /// In MIG mode: its MIG devices (a container's `MIG-<uuid>` names one).
    pub mig: Vec<MigDevice>,
    /// Its PCI bus id (NVML's `00000000:3B:00.0`), as [`pci_bus`] reads it.
    pub pci_bus: Option<PciBus>,
}

/// A PCI bus id as numbers: domain, bus, device, function.
pub type PciBus = (u32, u32, u32, u32);

/// A PCI bus id, `[DOMAIN:]BUS:DEVICE.FUNCTION` in hex (`0000:3b:00.0`, NVML's
/// `00000000:3B:00.0`), as numbers, so that the two spellings compare.
pub fn pci_bus(s: &str) -> Option<PciBus> {
    let (rest, function) = s.rsplit_once('.')?;
    let mut parts: Vec<&str> = rest.split(':').collect();
    if parts.len() == 2 {
        parts.insert(0, "0");
    }
    let hex = |p: &str| {
        (!p.is_empty() && p.len() <= 8)
            .then(|| u32::from_str_radix(p, 16).ok())
            .flatten()
    };
    match parts.as_slice() {
        [d, b, dev] => Some((hex(d)?, hex(b)?, hex(dev)?, hex(function)?)),
        _ => None,
    }
}

/// One MIG device of a GPU in MIG mode.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MigDevice {
    /// Its UUID, `MIG-...`.
    pub uuid: String,
    /// The GPU instance it belongs to (the unit of contention and of memory).
    pub gpu_instance: u32,
}

/// Most MIG devices read a GPU (an A100 or H100 has at most 7).
const MAX_MIG: u32 = 16;

/// The MIG devices of `d` when it is in MIG mode (none when it is not, or the library lacks the
/// calls): each one's UUID and GPU instance (`nvmlDeviceGetGpuInstanceId`, which nvml-wrapper
/// does not wrap: called through the library's own symbol).
fn mig_devices(nvml: &Nvml, d: &nvml_wrapper::Device<'_>) -> Vec<MigDevice> {
    if !d.mig_mode().is_ok_and(|m| m.current == 1) {
        return Vec::new();
    }
    let (Ok(n), Ok(gi_of)) = (
        d.mig_device_count(),
        nvml.lib().nvmlDeviceGetGpuInstanceId.as_ref(),
    ) else {
        return Vec::new();
    };
    (0..n.min(MAX_MIG))
        .filter_map(|i| {
            let m = d.mig_device_by_index(i).ok()?;
            let uuid = m.uuid().ok()?;
            let mut gi = 0;
            // SAFETY: `m`'s handle is valid while `nvml` is initialized (it is borrowed here),
            // and `gi` is a live `c_uint` the call writes.
            let r = unsafe { gi_of(m.handle(), &mut gi) };
            (r == 0).then_some(MigDevice {
                uuid,
                gpu_instance: gi,
            })
        })
        .collect()
}

/// The sampler; `Off` carries why NVML is unavailable.
// One sampler a process: the size of the `On` variant costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
pub enum Sampler {
    /// NVML initialized.
    On {
        /// The library handle.
        nvml: Nvml,
        /// Last process-utilization timestamp seen per GPU, so each sample is new.
        last_seen: HashMap<u32, u64>,
        /// Each GPU's PCI bus id, once NVML gave it.
        pci: HashMap<u32, PciBus>,
    },
    /// No NVML.
    Off(String),
}

impl Sampler {
    /// Initializes NVML from `lib` (or the loader's `libnvidia-ml.so.1`).
    pub fn new(lib: Option<&PathBuf>) -> Sampler {
        let mut builder = Nvml::builder();
        if let Some(lib) = lib {
            builder.lib_path(lib.as_os_str());
        }
        match builder.init() {
            Ok(nvml) => Sampler::On {
                nvml,
                last_seen: HashMap::new(),
                pci: HashMap::new(),
            },
            Err(e) => Sampler::Off(format!(
                "NVML unavailable ({e}); GPU metrics are off, tracing goes on"
            )),
        }
    }

    /// Whether NVML is up.
    pub fn up(&self) -> bool {
        matches!(self, Sampler::On { .. })
    }

    /// Samples every GPU. An error on one field leaves that field out.
    pub fn sample(&mut self) -> Result<Vec<GpuSample>, NvmlError> {
        let Sampler::On {
            nvml,
            last_seen,
            pci,
        } = self
        else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for index in 0..nvml.device_count()? {
            let d = nvml.device_by_index(index)?;
            let util = d.utilization_rates().ok();
            let mem = d.memory_info().ok();
            let mut processes: HashMap<u32, GpuProcess> = HashMap::new();
            // MPS clients are listed apart (NotSupported or absent from an older library: none).
            let mps = d.mps_running_compute_processes().unwrap_or_default();
            let listed = d.running_compute_processes().unwrap_or_default();
            for (p, client) in listed
                .into_iter()
                .map(|p| (p, false))
                .chain(mps.into_iter().map(|p| (p, true)))
            {
                let e = processes.entry(p.pid).or_insert(GpuProcess {
                    pid: p.pid,
                    ..Default::default()
                });
                e.mps |= client;
                e.gpu_instance = e.gpu_instance.or(p.gpu_instance_id);
                if let UsedGpuMemory::Used(b) = p.used_gpu_memory {
                    e.memory_bytes = Some(b);
                }
            }
            // NotFound means no new samples since last_seen: nothing to add.
            let seen = last_seen.get(&index).copied();
            for s in d.process_utilization_stats(seen).unwrap_or_default() {
                last_seen.insert(index, s.timestamp.max(seen.unwrap_or(0)));
                let e = processes.entry(s.pid).or_insert(GpuProcess {
                    pid: s.pid,
                    ..Default::default()
                });
                e.sm_util = Some(s.sm_util);
                e.mem_util = Some(s.mem_util);
            }
            let mut processes: Vec<GpuProcess> = processes.into_values().collect();
            processes.sort_by_key(|p| p.pid);
            out.push(GpuSample {
                index,
                uuid: d.uuid().unwrap_or_default(),
                sm_util: util.as_ref().map(|u| u.gpu),
                mem_util: util.as_ref().map(|u| u.memory),
                memory_used: mem.as_ref().map(|m| m.used),
                memory_total: mem.as_ref().map(|m| m.total),
                temperature: d.temperature(TemperatureSensor::Gpu).ok(),
                power_mw: d.power_usage().ok(),
                sm_clock_mhz: d.clock_info(Clock::SM).ok(),
                reasons: d.current_throttle_reasons().ok().map(|r| r.bits()),
                pcie_kbs: d
                    .pcie_throughput(PcieUtilCounter::Send)
                    .ok()
                    .zip(d.pcie_throughput(PcieUtilCounter::Receive).ok()),
                processes,
                mig: mig_devices(nvml, &d),
                // A GPU's bus id does not change: read until NVML gives it, then kept.
                pci_bus: match pci.get(&index) {
                    Some(b) => Some(*b),
                    None => {
                        let b = d.pci_info().ok().and_then(|p| pci_bus(&p.bus_id));
                        if let Some(b) = b {
                            pci.insert(index, b);
                        }
                        b
                    }
                },
            });
        }
        Ok(out)
    }
}
