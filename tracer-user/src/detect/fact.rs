//! Alerts about facts rather than trends (an allocation refused, a restart loop, a leak): they
//! fire without pending, carry their own evidence, and resolve on their own rule. Made here
//! alike.
use std::time::SystemTime;

use crate::{
    alert::{AlertChange, AlertState, Cause, Evidence, Incident, Party, Severity},
    text::rfc3339,
};

/// `x` to 4 significant digits: what the evidence can stand for.
pub(super) fn significant(x: f64) -> f64 {
    if x == 0.0 || !x.is_finite() {
        return x;
    }
    let scale = 10f64.powi(3 - x.abs().log10().floor() as i32);
    (x * scale).round() / scale
}

/// Evidence of a fact: `signal` in `unit`, its value `now` from `samples` over `window_s`.
pub(super) fn evidence(
    (signal, unit): (&'static str, &'static str),
    now: f64,
    samples: u64,
    window_s: u64,
) -> Evidence {
    Evidence {
        signal,
        unit,
        now,
        window_s,
        samples,
        ..Evidence::default()
    }
}

/// A firing alert of `cause` at `severity` about `victim` on `gpu`, from now.
pub(super) fn firing(
    (cause, severity): (Cause, Severity),
    gpu: String,
    (victim, aggressors): (Party, Vec<Party>),
    evidence: Evidence,
    now_wall: SystemTime,
) -> AlertChange {
    let at = rfc3339(now_wall);
    AlertChange {
        alert: cause.alert_name(),
        state: AlertState::Firing,
        severity,
        cause,
        incident: Incident::of(cause, &gpu, &aggressors),
        gpu,
        victim,
        aggressors,
        evidence,
        started_at: at.clone(),
        at,
        reason: None,
        quiet: None,
        escalated_from: None,
    }
}

/// `r` resolved now, for `reason`.
pub(super) fn resolved(
    mut r: AlertChange,
    reason: &'static str,
    now_wall: SystemTime,
) -> AlertChange {
    r.state = AlertState::Resolved;
    r.at = rfc3339(now_wall);
    r.reason = Some(reason);
    r
}
