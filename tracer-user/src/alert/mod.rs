//! The alert change model: one record per state change of a (victim, signal) alert, with its
//! cause, aggressors and evidence. The detector makes them; the sinks (stdout, webhook,
//! Alertmanager, metrics) carry them.
use serde::Serialize;

use crate::identity::ProcessRef;

mod cause;
pub mod change;

/// Where an alert is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AlertState {
    /// Breaching for `pending_windows` windows.
    Pending,
    /// Breaching for `firing_after_s`.
    Firing,
    /// Back to normal (or the victim exited).
    Resolved,
}

impl AlertState {
    /// The JSON name.
    pub fn as_str(self) -> &'static str {
        match self {
            AlertState::Pending => "pending",
            AlertState::Firing => "firing",
            AlertState::Resolved => "resolved",
        }
    }
}

/// How far over its baseline p99 the victim's signal is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// Over `warning` (default +10%).
    Warning,
    /// Over `critical` (default +30%).
    Critical,
    /// Over `page` (default +50%).
    Page,
}

impl Severity {
    /// The JSON name.
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Warning => "warning",
            Severity::Critical => "critical",
            Severity::Page => "page",
        }
    }

    /// How soon someone answers it (the seeds' tiers): the `response` annotation.
    pub fn response(self) -> &'static str {
        match self {
            Severity::Warning => "within a day",
            Severity::Critical => "within 2 hours",
            Severity::Page => "at once",
        }
    }
}

/// Where each alert's runbook is: this, then the alert's name in lower case (docs/alerts.md).
pub const RUNBOOK_BASE: &str = "https://github.com/cudatrace/cudatrace/blob/main/docs/alerts.md#";

/// Through which resource the victim is slowed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    /// A call of the victim's has been stuck in the driver for a window or more behind work
    /// another process queued earlier on the same GPU (the victim completes too few calls to
    /// be slow: it is starved).
    Starvation,
    /// A process's traced device memory grows steadily: its GPU would be full within
    /// `leak_horizon_s`.
    MemoryLeak,
    /// A workload's process keeps exiting and starting again (`restart_loop_count` restarts in
    /// `restart_loop_s`).
    RestartLoop,
    /// An allocation failed with `CUDA_ERROR_OUT_OF_MEMORY`; the aggressors are the processes
    /// holding the most device memory on that GPU.
    OutOfMemory,
    /// Another process keeps the same GPU's compute busy.
    ComputeContention,
    /// Another process copies over the same GPU's copy engines / PCIe link.
    CopyContention,
    /// The GPU's memory is nearly full.
    MemoryPressure,
    /// The GPU's clocks are held down (thermal or power).
    Throttling,
    /// A workload's signal, the season removed, has risen by `drift_pct_per_week` or more a
    /// week over `drift_window_days`, held for `drift_hold_s`.
    Degradation,
    /// The victim's own submitted work grew (threads per launch, launches per step, bytes per
    /// copy) and nobody else's did: its requests changed.
    WorkloadChange,
    /// The victim's launching threads waited longer for a CPU (run-queue delay); the named
    /// cgroups' CPU use rose.
    CpuContention,
    /// The GPU is busier with work no traced process submitted: NVML lists the named processes
    /// on it without traced calls, or (none named) its utilization rose unexplained.
    UntracedContention,
    /// Launches got slower while the GPU is idle, with neither a run-queue delay nor a
    /// neighbour's change to explain it: the driver.
    CpuOrDriverContention,
    /// None of the above is seen.
    Unexplained,
    /// cudatrace's own probe harmed the process (a fault at or just past a probed entry, in the
    /// XOL page, or at a corrupted return, right after a probe hit): cudatrace is the culprit.
    ProbeHarm,
    /// A fault that looks like cudatrace's probe's harm, from one tenant while others use the
    /// library and nothing corroborates it: the probes stay; that tenant is named.
    ProbeHarmSuspected,
}

/// A process named in an alert.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Party {
    /// Process id.
    pub pid: u32,
    /// Its comm.
    pub comm: String,
    /// Kubernetes namespace, once the node's pod list names the pod.
    pub namespace: Option<String>,
    /// Pod name, else the pod UID, when in a pod.
    pub pod: Option<String>,
    /// Container name, else the container id, when in a container.
    pub container: Option<String>,
    /// For an aggressor: its share of what the aggressors did to the contended resource in the
    /// window (GPU time, else launches; bytes copied; device memory).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub share: Option<f64>,
    /// Its workload (`identity::workload`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workload: Option<String>,
    /// For an aggressor: what it submitted before the victim's signal rose and now (the
    /// evidence that it changed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub change: Option<change::Change>,
    /// For a CPU preemptor: its cgroup.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
    /// Its start time (`/proc/PID/stat` field 22; 0: unknown), what the actuator tells a reused
    /// pid by; not written out.
    #[serde(skip)]
    pub start_time: u64,
}

impl Party {
    /// A workload no running process of which is known (pid 0).
    pub fn workload(name: &str) -> Party {
        Party {
            pid: 0,
            comm: String::new(),
            namespace: None,
            pod: None,
            container: None,
            share: None,
            workload: Some(name.to_owned()),
            change: None,
            cgroup: None,
            start_time: 0,
        }
    }

    /// A process as an alert names it; `share` for an aggressor.
    pub fn of(p: ProcessRef<'_>, share: Option<f64>) -> Party {
        let workload = (!p.workload.is_empty()).then(|| p.workload.to_owned());
        let [namespace, pod, container] = p.identity.pod_labels();
        Party {
            pid: p.pid,
            comm: p.comm.to_owned(),
            namespace,
            pod,
            container,
            share,
            workload,
            change: None,
            cgroup: None,
            start_time: p.identity.start_time,
        }
    }
}

/// Why the alert holds: the victim's signal now against its baseline, and what NVML said.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Evidence {
    /// `launch_latency_p99`, `wait_per_launch` or `copy_time_per_mib`.
    pub signal: &'static str,
    /// Unit of the three values below.
    pub unit: &'static str,
    /// The baseline's forecast for the window.
    pub baseline: f64,
    /// The baseline p99 the thresholds are over.
    pub baseline_p99: f64,
    /// The latest breaching window's value.
    pub now: f64,
    /// `now / baseline_p99`.
    pub ratio: f64,
    /// Window length, seconds.
    pub window_s: u64,
    /// Calls behind `now` (launches, or synchronous copies).
    pub samples: u64,
    /// NVML: device memory used over total on the victim's GPU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_memory_used_ratio: Option<f64>,
    /// NVML: SM utilization of the victim's GPU, 0 to 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_utilization: Option<f64>,
    /// NVML: clock-event reasons holding the clocks down.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub clock_event_reasons: Vec<&'static str>,
    /// Seconds the victim's oldest stuck call has been in the driver, when one is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stuck_s: Option<f64>,
    /// A restart loop's exit statuses within its span, oldest first (`exit 1`, `killed by
    /// SIGKILL`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub exit_statuses: Vec<String>,
    /// A leak's predicted seconds until its GPU is full, at the growth rate in `now`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time_to_full_s: Option<f64>,
    /// A gradual degradation's rise, percent a week.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drift_pct_per_week: Option<f64>,
    /// The victim's own work per step before its signal rose and now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub victim_work: Option<change::VictimChange>,
    /// The victim's threads' run-queue delay, seconds per second: (before, now).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_delay_s_per_s: Option<(f64, f64)>,
    /// Periods the victim's own CPU quota throttled it since its signal rose.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_throttled_periods: Option<u64>,
    /// The causal chain in words, in the order the verdict used it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub chain: Vec<String>,
}

/// One alert state change: the JSON line on stdout and the webhook's body.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AlertChange {
    /// Alert name, from the cause.
    pub alert: &'static str,
    /// The new state.
    pub state: AlertState,
    /// Severity tier.
    pub severity: Severity,
    /// The cause.
    pub cause: Cause,
    /// The GPU the victim and aggressors share (index or UUID; `all` when no process restricts
    /// its devices and NVML is absent).
    pub gpu: String,
    /// The process slowed.
    pub victim: Party,
    /// The processes slowing it, biggest share first.
    pub aggressors: Vec<Party>,
    /// Baseline against now.
    pub evidence: Evidence,
    /// When the breach began (RFC 3339).
    pub started_at: String,
    /// When this state change happened (RFC 3339).
    pub at: String,
    /// Why a resolved alert ended: `back_to_baseline` or `victim_exited`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<&'static str>,
    /// The incident the alert belongs to: fixed when it goes pending, so that its victims
    /// group together while their aggressors' shares move.
    pub incident: Incident,
    /// The `[[alerts.quiet]]` entry in force for this change: recorded, not sent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quiet: Option<String>,
    /// A firing alert whose severity rose: the severity it had (its Alertmanager alert of that
    /// severity ends as this one starts).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub escalated_from: Option<Severity>,
}

/// One incident: the (aggressor set, GPU, cause) its victims' alerts share. The aggressor set
/// is the fewest biggest aggressors that together hold at least half the share, by pid, so
/// that two victims of one trainer name the same set although each sees the other as a small
/// aggressor too.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Incident {
    /// The GPU.
    pub gpu: String,
    /// The cause.
    pub cause: Cause,
    /// The aggressor set as `pid:comm` joined by commas, by pid ("" when none).
    pub aggressors: String,
}

impl Incident {
    /// The incident of an alert with this cause, GPU and aggressors (biggest share first).
    pub fn of(cause: Cause, gpu: &str, aggressors: &[Party]) -> Incident {
        let mut held = 0.0;
        let mut set: Vec<&Party> = Vec::new();
        for a in aggressors {
            if held >= 0.5 {
                break;
            }
            held += a.share.unwrap_or(0.0);
            set.push(a);
        }
        set.sort_by_key(|a| a.pid);
        let list: Vec<String> = set
            .iter()
            .map(|a| format!("{}:{}", a.pid, crate::text::list_field(&a.comm)))
            .collect();
        Incident {
            gpu: gpu.to_owned(),
            cause,
            aggressors: list.join(","),
        }
    }
}

impl AlertChange {
    /// Identity of the alert across its state changes.
    pub fn key(&self) -> (u32, &'static str, &'static str) {
        (self.victim.pid, self.evidence.signal, self.alert)
    }

    /// The aggressors as `pid:comm` joined by commas: the metric label and the annotation.
    pub fn aggressors_label(&self) -> String {
        let list: Vec<String> = self
            .aggressors
            .iter()
            .map(|a| format!("{}:{}", a.pid, crate::text::list_field(&a.comm)))
            .collect();
        list.join(",")
    }

    /// The causal chain in one line (`; ` between facts), tenant text made printable: the
    /// `chain` annotation and attribute.
    pub fn chain_text(&self) -> String {
        let facts: Vec<String> = self
            .evidence
            .chain
            .iter()
            .map(|f| crate::text::defang(f).into_owned())
            .collect();
        facts.join("; ")
    }

    /// One line for Alertmanager's `summary` annotation.
    pub fn summary(&self) -> String {
        let who = |p: &Party| format!("{} (pid {})", crate::text::defang(&p.comm), p.pid);
        let by = if self.aggressors.is_empty() {
            String::new()
        } else {
            let list: Vec<String> = self
                .aggressors
                .iter()
                .map(|a| format!("{} {:.0}%", who(a), a.share.unwrap_or(0.0) * 100.0))
                .collect();
            format!(" by {}", list.join(", "))
        };
        if self.cause == Cause::MemoryLeak {
            return format!(
                "{} device memory grows {:.0} bytes/s: GPU {} full in {:.0} s at this rate",
                who(&self.victim),
                self.evidence.now,
                self.gpu,
                self.evidence.time_to_full_s.unwrap_or(f64::NAN)
            );
        }
        if self.cause == Cause::ProbeHarmSuspected {
            return format!(
                "suspected (not corroborated) probe harm in {}: {}",
                who(&self.victim),
                self.chain_text()
            );
        }
        if self.cause == Cause::ProbeHarm {
            return format!(
                "cudatrace's probe harmed {}: {}",
                who(&self.victim),
                self.chain_text()
            );
        }
        if self.cause == Cause::RestartLoop {
            return format!(
                "{} restarted {} times in {} s (exits: {})",
                who(&self.victim),
                self.evidence.samples,
                self.evidence.window_s,
                self.evidence.exit_statuses.join(", ")
            );
        }
        if self.cause == Cause::OutOfMemory {
            return format!(
                "{} could not allocate {} bytes on GPU {}: out of device memory ({} failed in {} s){}",
                who(&self.victim),
                self.evidence.now,
                self.gpu,
                self.evidence.samples,
                self.evidence.window_s,
                by.replacen(" by ", "; held by ", 1),
            );
        }
        if let Some(stuck) = self.evidence.stuck_s {
            return format!(
                "{} starved{by} on GPU {}: a call stuck in the driver for {stuck:.1} s ({} baseline p99 {:.3e} {})",
                who(&self.victim),
                self.gpu,
                self.evidence.signal,
                self.evidence.baseline_p99,
                self.evidence.unit,
            );
        }
        format!(
            "{} slowed{by} on GPU {}: {} {:.3e} {} vs baseline p99 {:.3e} ({}, {:.1}x)",
            who(&self.victim),
            self.gpu,
            self.evidence.signal,
            self.evidence.now,
            self.evidence.unit,
            self.evidence.baseline_p99,
            self.cause.as_str(),
            self.evidence.ratio
        )
    }
}

#[cfg(test)]
pub(crate) mod tests;
