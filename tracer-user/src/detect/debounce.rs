//! The debounce state machine of one (process, signal): a breach goes `pending` after
//! `pending_windows` consecutive breaching windows, `firing` once it has lasted
//! `firing_after_s`, and resolves after `resolve_after_s` without one (a pending one at the first
//! normal window). While firing, windows that breach above its severity for `firing_after_s`
//! raise it (never lower: severity goes down only through resolution).
use crate::{alert::AlertChange, alert::AlertState, alert::Severity, config::DetectConfig};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// No breach, or fewer than `pending_windows` in a row.
    Normal,
    /// Breaching, not yet for `firing_after_s`.
    Pending,
    /// Breaching long enough to page.
    Firing,
}

/// One (process, signal): its alert's debounce state (the baseline is its workload's).
pub struct Track {
    pub phase: Phase,
    /// Consecutive breaching windows.
    pub breaches: u32,
    /// Monotonic seconds when the current run of breaching windows began.
    pub since: f64,
    /// Monotonic seconds at the end of the last breaching window.
    pub last_breach: f64,
    /// When the alert fired.
    pub fired_at: f64,
    /// Lowest tier over the current run: the severity it sustains.
    pub tier: Severity,
    /// Whether a window of the current run had a call stuck.
    pub stuck: bool,
    /// While firing: since when (monotonic seconds) every window breached above the alert's
    /// severity, and the lowest tier over those windows (what it escalates to).
    pub higher: Option<(f64, Severity)>,
    /// The alert's latest record, while pending or firing.
    pub record: Option<AlertChange>,
    /// The last window's value, the baseline p99 and the baseline's forecast for that window
    /// (ns, or ns per MiB), once the baseline is ready.
    pub last: Option<(f64, f64, f64)>,
    /// The world before this breach began, frozen at its first verdict.
    pub reference: Option<Box<super::verdict::Reference>>,
}

impl Default for Track {
    fn default() -> Self {
        Self::new()
    }
}

impl Track {
    /// A track in its normal phase.
    pub fn new() -> Track {
        Track {
            phase: Phase::Normal,
            breaches: 0,
            since: 0.0,
            last_breach: 0.0,
            fired_at: 0.0,
            tier: Severity::Warning,
            stuck: false,
            higher: None,
            record: None,
            last: None,
            reference: None,
        }
    }
}

impl Track {
    /// A window that did not breach (`Some(false)`) or had too few calls (`None`).
    pub fn settle(&mut self, known: Option<bool>, now: f64, cfg: &DetectConfig) {
        match (self.phase, known) {
            (Phase::Normal, Some(_)) => {
                // A run that ended before it alerted: the next one freezes its own reference.
                self.breaches = 0;
                self.stuck = false;
                self.reference = None;
            }
            (Phase::Normal, None) | (Phase::Pending, None) => {}
            (Phase::Pending, Some(_)) => self.end(),
            (Phase::Firing, _) => {
                self.higher = None;
                if now - self.last_breach >= cfg.resolve_after_s as f64 {
                    self.end();
                }
            }
        }
    }

    /// Back to normal; the record, marked resolved, is handed out by `evaluate`.
    fn end(&mut self) {
        self.phase = Phase::Normal;
        self.breaches = 0;
        self.stuck = false;
        self.higher = None;
        self.reference = None;
        if let Some(r) = self.record.as_mut() {
            r.state = AlertState::Resolved;
            r.reason = Some("back_to_baseline");
        }
    }
}
