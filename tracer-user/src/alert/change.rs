//! What a verdict shows of a change: a party's submitted work before the victim's signal rose
//! and now, and the victim's own work per step.
use serde::Serialize;

/// The kinds of submitted work an aggressor is compared by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Measure {
    /// Threads launched per second (launches x grid x block).
    ThreadsPerS,
    /// CUDA graph replays per second.
    GraphLaunchesPerS,
    /// Bytes copied per second.
    CopyBytesPerS,
    /// CPU seconds used per second (a cgroup's `cpu.stat`).
    CpuSecondsPerS,
    /// NVML's SM utilization of the process, percent.
    SmUtilPct,
}

impl Measure {
    /// The JSON name.
    pub fn as_str(self) -> &'static str {
        match self {
            Measure::ThreadsPerS => "threads_per_s",
            Measure::GraphLaunchesPerS => "graph_launches_per_s",
            Measure::CopyBytesPerS => "copy_bytes_per_s",
            Measure::CpuSecondsPerS => "cpu_seconds_per_s",
            Measure::SmUtilPct => "sm_util_pct",
        }
    }
}

/// One named party's change: its measure before the victim's rise and now.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Change {
    /// What was compared.
    pub measure: Measure,
    /// Before the victim's signal rose (the median of its windows then; 0 when it was not there).
    pub before: f64,
    /// Now (the mean of its windows since).
    pub now: f64,
    /// It was not there before.
    pub arrived: bool,
}

impl Change {
    /// How much it rose, in its measure's unit.
    pub fn rise(&self) -> f64 {
        (self.now - self.before).max(0.0)
    }

    /// `before → now` in words, e.g. `threads_per_s 1.2e6 → 6.1e6`.
    pub fn words(&self) -> String {
        let m = self.measure.as_str();
        if self.arrived {
            format!("{m} 0 → {:.3e} (arrived)", self.now)
        } else {
            format!("{m} {:.3e} → {:.3e}", self.before, self.now)
        }
    }
}

/// The victim's own work per step before its signal rose and now: what `workload_change` shows.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct VictimChange {
    /// Threads per kernel launch: (before, now).
    pub threads_per_launch: (f64, f64),
    /// Kernel launches per wait (its steps): (before, now), when it waits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub launches_per_step: Option<(f64, f64)>,
    /// Bytes per copy: (before, now), when it copies.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes_per_copy: Option<(f64, f64)>,
    /// The kernel whose launches grew most, by name when its lookup was seen.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel: Option<String>,
    /// That kernel's grid then and now (the latest launch seen of each).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grid: Option<([u32; 3], [u32; 3])>,
}
