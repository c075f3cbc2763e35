//! The `[detect]` table: how baselines are learned and when a window breaches.
use serde::Deserialize;

use super::{schedule, ConfigError, Result};

/// The `[detect]` table: how baselines are learned and when a window breaches.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DetectConfig {
    /// Length of one evaluation window, seconds.
    pub window_s: u64,
    /// Windows a series is learned for before it can breach.
    pub warmup_windows: usize,
    /// Holt level smoothing (alpha), 0 to 1.
    pub level_smoothing: f64,
    /// Holt trend smoothing (beta), 0 to 1.
    pub trend_smoothing: f64,
    /// Trend damping per window (phi), 0 to 1.
    pub trend_damping: f64,
    /// EWMA weight of the newest squared forecast error, 0 to 1.
    pub spread_smoothing: f64,
    /// Lowest spread as a fraction of the baseline.
    pub min_spread_ratio: f64,
    /// Windows the Hampel filter compares a new value with.
    pub hampel_windows: usize,
    /// Deviations (MAD-estimated) beyond which a window is an outlier.
    pub hampel_k: f64,
    /// Warning when a window exceeds the baseline p99 by this fraction.
    pub warning: f64,
    /// Critical past this fraction over the baseline p99.
    pub critical: f64,
    /// Page past this fraction over the baseline p99.
    pub page: f64,
    /// Consecutive breaching windows before an alert is pending.
    pub pending_windows: u32,
    /// Seconds a breach lasts (from its first window) before a pending alert fires.
    pub firing_after_s: u64,
    /// Seconds without a breaching window before a firing alert resolves.
    pub resolve_after_s: u64,
    /// Calls a window needs (launches, or synchronous copies) for its value to count.
    pub min_samples: u64,
    /// Smallest rise over the baseline p99 that breaches, in microseconds (per launch, per wait
    /// per launch, per copy): keeps jitter of fast calls from alerting.
    pub min_increase_us: f64,
    /// After an alert has fired this long, breaching windows are learned: the new normal.
    pub rebaseline_after_s: u64,
    /// Device memory used over total (NVML) at or above which a GPU is under memory pressure.
    pub memory_pressure_ratio: f64,
    /// NVML utilization (percent) below which a GPU counts as idle.
    pub idle_gpu_percent: u32,
    /// A process is named an aggressor only when the work it submits (threads launched, graph
    /// replays, bytes copied, per second) rose by more than this fraction over its own work
    /// before the victim's signal rose (0.5: +50%), or it arrived since.
    pub aggressor_rise_ratio: f64,
    /// ... and its rise is at least this share of that work now on the GPU (everyone's).
    pub aggressor_min_share: f64,
    /// `cpu_contention` when the victim's threads' run-queue delay rose by at least this many
    /// seconds per second (and by `aggressor_rise_ratio`).
    pub run_delay_min_s_per_s: f64,
    /// A cgroup is named a CPU preemptor when its CPU use rose by at least this many CPUs.
    pub cpu_preemptor_min_cpus: f64,
    /// A process NVML lists without traced calls is named for `untraced_contention` when its
    /// SM utilization rose by at least this many points; a GPU's own utilization, by twice it.
    pub untraced_min_sm_pct: f64,
    /// Alert on slowdowns with no cause seen (`CudatraceSlowdown`): the process's own work
    /// changed, or something untraced shares its GPU.
    pub report_unexplained: bool,
    /// A process whose device memory grows steadily so that its GPU would be full within this
    /// many seconds raises `CudatraceDeviceMemoryLeak`.
    pub leak_horizon_s: u64,
    /// Restarts of one workload (a new process after one of it exited) within
    /// `restart_loop_s` that raise `CudatraceRestartLoop`.
    pub restart_loop_count: u32,
    /// The span, seconds, restarts are counted over; a loop resolves after as long without one.
    pub restart_loop_s: u64,
    /// The season's length, seconds (86400: a daily one): the forecast follows what each part
    /// of it usually looks like, once a whole season is learned.
    pub season_s: u64,
    /// One part of the season, seconds (900: a day of 96 quarter-hours).
    pub season_bucket_s: u64,
    /// Seasons each part's factor is the median of (3: a one-off hour is outvoted).
    pub season_history: usize,
    /// Days of hourly summaries kept per (workload, signal).
    pub history_days: u32,
    /// `CudatraceGradualDegradation` when a signal's level, the season removed, rises by at
    /// least this many percent a week.
    pub drift_pct_per_week: f64,
    /// Days of hourly summaries the drift is estimated over.
    pub drift_window_days: u32,
    /// Seconds the drift must hold before it fires.
    pub drift_hold_s: u64,
    /// `[[detect.schedule]]`: periods with other tiers and debounce times (first match wins).
    pub schedule: Vec<schedule::ScheduleEntry>,
}

impl Default for DetectConfig {
    fn default() -> Self {
        DetectConfig {
            window_s: 5,
            warmup_windows: 6,
            level_smoothing: 0.1,
            trend_smoothing: 0.02,
            trend_damping: 0.9,
            spread_smoothing: 0.1,
            min_spread_ratio: 0.02,
            hampel_windows: 9,
            hampel_k: 3.0,
            warning: 0.10,
            critical: 0.30,
            page: 0.50,
            pending_windows: 3,
            firing_after_s: 30,
            resolve_after_s: 60,
            min_samples: 10,
            min_increase_us: 10.0,
            rebaseline_after_s: 1800,
            memory_pressure_ratio: 0.95,
            idle_gpu_percent: 10,
            aggressor_rise_ratio: 0.5,
            aggressor_min_share: 0.1,
            run_delay_min_s_per_s: 0.02,
            cpu_preemptor_min_cpus: 0.1,
            untraced_min_sm_pct: 10.0,
            report_unexplained: true,
            leak_horizon_s: 3600,
            restart_loop_count: 3,
            restart_loop_s: 600,
            season_s: 86_400,
            season_bucket_s: 900,
            season_history: 3,
            history_days: 7,
            drift_pct_per_week: 3.0,
            drift_window_days: 7,
            drift_hold_s: 86_400,
            schedule: Vec::new(),
        }
    }
}

impl DetectConfig {
    /// Checks the table's values (a schedule entry's, once over them, too).
    pub(crate) fn validate(&self) -> Result<()> {
        let d = self;
        if d.window_s == 0 {
            return Err(ConfigError::invalid(
                "detect.window_s",
                "detect.window_s = 0: give at least 1 second".to_string(),
            ));
        }
        if d.warmup_windows < 3 {
            return Err(ConfigError::invalid(
                "detect.warmup_windows",
                format!(
                    "detect.warmup_windows = {}: give at least 3",
                    d.warmup_windows
                ),
            ));
        }
        for (key, v) in [
            ("level_smoothing", d.level_smoothing),
            ("trend_smoothing", d.trend_smoothing),
            ("spread_smoothing", d.spread_smoothing),
        ] {
            if !(v > 0.0 && v <= 1.0) {
                return Err(ConfigError::invalid(
                    format!("detect.{key}"),
                    format!("detect.{key} = {v}: give a weight above 0 and at most 1"),
                ));
            }
        }
        if !(0.0..=1.0).contains(&d.trend_damping) {
            return Err(ConfigError::invalid(
                "detect.trend_damping",
                format!(
                    "detect.trend_damping = {}: give 0 (no trend) to 1 (undamped)",
                    d.trend_damping
                ),
            ));
        }
        if !(0.0..1.0).contains(&d.min_spread_ratio) {
            return Err(ConfigError::invalid(
                "detect.min_spread_ratio",
                format!(
                    "detect.min_spread_ratio = {}: give 0 to below 1",
                    d.min_spread_ratio
                ),
            ));
        }
        if d.hampel_windows < 3 {
            return Err(ConfigError::invalid(
                "detect.hampel_windows",
                format!(
                    "detect.hampel_windows = {}: give at least 3",
                    d.hampel_windows
                ),
            ));
        }
        if d.hampel_k.is_nan() || d.hampel_k <= 0.0 {
            return Err(ConfigError::invalid(
                "detect.hampel_k",
                format!(
                    "detect.hampel_k = {}: give a positive number of deviations",
                    d.hampel_k
                ),
            ));
        }
        if !(d.warning > 0.0 && d.warning < d.critical && d.critical < d.page) {
            return Err(ConfigError::invalid("detect.warning", format!("detect thresholds warning = {}, critical = {}, page = {}: give fractions over the baseline p99 with 0 < warning < critical < page",
                d.warning,
                d.critical,
                d.page)));
        }
        if d.pending_windows == 0 {
            return Err(ConfigError::invalid(
                "detect.pending_windows",
                "detect.pending_windows = 0: give at least 1".to_string(),
            ));
        }
        if d.resolve_after_s < d.window_s {
            return Err(ConfigError::invalid(
                "detect.resolve_after_s",
                format!(
                    "detect.resolve_after_s = {}: give at least one window ({} s)",
                    d.resolve_after_s, d.window_s
                ),
            ));
        }
        if d.leak_horizon_s == 0 {
            return Err(ConfigError::invalid(
                "detect.leak_horizon_s",
                "detect.leak_horizon_s = 0: give the seconds to full that count as a leak (3600)"
                    .to_string(),
            ));
        }
        if d.restart_loop_count == 0 || d.restart_loop_s == 0 {
            return Err(ConfigError::invalid(
                "detect.restart_loop_count",
                format!(
                    "detect.restart_loop_count = {}, restart_loop_s = {}: give at least 1 of each",
                    d.restart_loop_count, d.restart_loop_s
                ),
            ));
        }
        if d.min_samples == 0 {
            return Err(ConfigError::invalid(
                "detect.min_samples",
                "detect.min_samples = 0: give at least 1".to_string(),
            ));
        }
        if d.min_increase_us.is_nan() || d.min_increase_us < 0.0 {
            return Err(ConfigError::invalid(
                "detect.min_increase_us",
                format!(
                    "detect.min_increase_us = {}: give 0 or more microseconds",
                    d.min_increase_us
                ),
            ));
        }
        if !(d.memory_pressure_ratio > 0.0 && d.memory_pressure_ratio <= 1.0) {
            return Err(ConfigError::invalid(
                "detect.memory_pressure_ratio",
                format!(
                    "detect.memory_pressure_ratio = {}: give a fraction above 0 and at most 1",
                    d.memory_pressure_ratio
                ),
            ));
        }
        super::state::validate_memory(d)?;
        for (key, v) in [
            ("detect.aggressor_rise_ratio", d.aggressor_rise_ratio),
            ("detect.aggressor_min_share", d.aggressor_min_share),
            ("detect.run_delay_min_s_per_s", d.run_delay_min_s_per_s),
            ("detect.cpu_preemptor_min_cpus", d.cpu_preemptor_min_cpus),
            ("detect.untraced_min_sm_pct", d.untraced_min_sm_pct),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(ConfigError::invalid(
                    key,
                    format!("{key} = {v}: give a number of 0 or more"),
                ));
            }
        }
        if d.idle_gpu_percent > 100 {
            return Err(ConfigError::invalid(
                "detect.idle_gpu_percent",
                format!(
                    "detect.idle_gpu_percent = {}: give a percentage",
                    d.idle_gpu_percent
                ),
            ));
        }
        Ok(())
    }
}
