//! Gradual degradation (`CudatraceGradualDegradation`, warning): each hour a workload's signal
//! closes, its drift over the last `drift_window_days` of hourly summaries (season removed) is
//! estimated; at `drift_pct_per_week` or more, held for `drift_hold_s`, the alert fires with the
//! rate and the workload. It resolves at the first hour the rate is under the threshold.
use std::time::SystemTime;

use super::{evaluate::wall_s, fact, Detector, Signal};
use crate::{
    alert::{AlertChange, Cause, Evidence, Party, Severity},
    config::DetectConfig,
};

impl Detector {
    /// Looks at the drift of every (workload, signal) that closed an hour since the last window.
    pub(super) fn drifts(&mut self, now_wall: SystemTime, cfg: &DetectConfig) {
        let t = wall_s(now_wall);
        let hour = (t / 3600.0) as u64;
        let window_h = u64::from(cfg.drift_window_days) * 24;
        let threshold = cfg.drift_pct_per_week / 100.0;
        for (name, w) in self.memory.iter_mut() {
            for (i, s) in w.series.iter_mut().enumerate() {
                if !std::mem::take(&mut s.hour_closed) {
                    continue;
                }
                let Some(d) = s.history.drift(hour, window_h) else {
                    continue;
                };
                if d.per_week < threshold {
                    s.drift_since = None;
                    if let Some(r) = s.drift.take() {
                        self.outbox
                            .push(fact::resolved(r, "drift_stopped", now_wall));
                    }
                    continue;
                }
                let since = *s.drift_since.get_or_insert(t);
                let signal = Signal::ALL[i];
                let evidence = Evidence {
                    baseline: fact::significant(d.from / 1e9),
                    baseline_p99: fact::significant(d.from / 1e9),
                    ratio: fact::significant(d.to / d.from),
                    drift_pct_per_week: Some(fact::significant(d.per_week * 100.0)),
                    ..fact::evidence(
                        (signal.as_str(), signal.unit()),
                        fact::significant(d.to / 1e9),
                        d.hours as u64,
                        window_h * 3600,
                    )
                };
                match s.drift.as_mut() {
                    Some(r) => r.evidence = evidence,
                    None if t - since >= cfg.drift_hold_s as f64 => {
                        let victim = w.latest.clone().unwrap_or_else(|| Party::workload(name));
                        let r = fact::firing(
                            (Cause::Degradation, Severity::Warning),
                            String::new(),
                            (victim, Vec::new()),
                            evidence,
                            now_wall,
                        );
                        log::info!(
                            target: "cudatrace::drift",
                            workload = &**name,
                            signal = signal.as_str();
                            "drift: workload={} signal={} {:+.2}% a week over {} days",
                            crate::text::printable(name),
                            signal.as_str(),
                            d.per_week * 100.0,
                            cfg.drift_window_days
                        );
                        self.outbox.push(r.clone());
                        s.drift = Some(r);
                    }
                    None => {}
                }
            }
        }
    }

    /// Degradation alerts now firing.
    pub(super) fn drift_records(&self) -> impl Iterator<Item = &AlertChange> {
        self.memory
            .iter()
            .flat_map(|(_, w)| w.series.iter().filter_map(|s| s.drift.as_ref()))
    }
}
