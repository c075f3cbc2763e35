//! Alert changes over OTLP: each change a log record (severity from the tier: warning WARN,
//! critical ERROR, page FATAL; resolved INFO), and each incident (same GPU, cause and
//! aggressors) a span from its first pending change to the resolution of its last alert, with
//! an event per state change and its victims and aggressors as attributes. The log records
//! carry the incident span's trace and span ids, so a backend links them.
use std::collections::{BTreeSet, HashMap, HashSet};

use opentelemetry_proto::tonic::{
    logs::v1::{LogRecord, SeverityNumber},
    trace::v1::{span, span::SpanKind, Span},
};

use super::span::{attr, int, Ids};
use crate::alert::{AlertChange, AlertState, Incident, Severity};

/// Incidents open at most (past it the oldest is ended early).
const MAX_OPEN: usize = 256;
/// Events one incident span keeps (the rest counted in `dropped_events_count`).
const MAX_EVENTS: usize = 128;

/// An incident being followed.
struct Open {
    trace_id: Vec<u8>,
    span_id: Vec<u8>,
    start_ns: u64,
    events: Vec<span::Event>,
    dropped_events: u32,
    victims: BTreeSet<String>,
    alerts: BTreeSet<&'static str>,
    severity: Severity,
    /// Its alerts not yet resolved (victim pid, signal, alert).
    active: HashSet<(u32, &'static str, &'static str)>,
    opened: u64,
}

/// The incidents open now.
#[derive(Default)]
pub struct Incidents {
    open: HashMap<Incident, Open>,
    next: u64,
}

fn severity(c: &AlertChange) -> (SeverityNumber, &'static str) {
    match (c.state, c.severity) {
        (AlertState::Resolved, _) => (SeverityNumber::Info, "INFO"),
        (_, Severity::Warning) => (SeverityNumber::Warn, "WARN"),
        (_, Severity::Critical) => (SeverityNumber::Error, "ERROR"),
        (_, Severity::Page) => (SeverityNumber::Fatal, "FATAL"),
    }
}

/// The attributes every record of `c` carries.
fn attributes(c: &AlertChange) -> Vec<opentelemetry_proto::tonic::common::v1::KeyValue> {
    let mut a = vec![
        attr("cudatrace.alert", c.alert),
        attr("cudatrace.state", c.state.as_str()),
        attr("cudatrace.severity", c.severity.as_str()),
        attr("cudatrace.cause", c.cause.as_str()),
        attr("cudatrace.gpu", c.gpu.clone()),
        int("cudatrace.victim.pid", i64::from(c.victim.pid)),
        attr("cudatrace.victim.comm", c.victim.comm.clone()),
        attr("cudatrace.aggressors", c.aggressors_label()),
        attr("cudatrace.signal", c.evidence.signal),
        attr("cudatrace.chain", c.chain_text()),
    ];
    if let Some(w) = &c.victim.workload {
        a.push(attr("cudatrace.victim.workload", w.clone()));
    }
    a
}

impl Incidents {
    /// Takes `c` (at `now_ns`, Unix time): its log record, and the incident span when this
    /// change ended its incident (or one had to be ended to stay within bounds).
    pub fn change(
        &mut self,
        c: &AlertChange,
        now_ns: u64,
        ids: &mut Ids,
    ) -> (LogRecord, Vec<Span>) {
        let mut ended = Vec::new();
        if !self.open.contains_key(&c.incident) && self.open.len() >= MAX_OPEN {
            if let Some(oldest) = self
                .open
                .iter()
                .min_by_key(|(_, o)| o.opened)
                .map(|(k, _)| k.clone())
            {
                let o = self.open.remove(&oldest).expect("present");
                ended.push(finish(&oldest, o, now_ns));
            }
        }
        self.next += 1;
        let opened = self.next;
        let o = self.open.entry(c.incident.clone()).or_insert_with(|| {
            let (trace_id, span_id) = ids.fresh();
            Open {
                trace_id,
                span_id,
                start_ns: now_ns,
                events: Vec::new(),
                dropped_events: 0,
                victims: BTreeSet::new(),
                alerts: BTreeSet::new(),
                severity: c.severity,
                active: HashSet::new(),
                opened,
            }
        });
        if o.events.len() < MAX_EVENTS {
            o.events.push(span::Event {
                time_unix_nano: now_ns,
                name: format!("{} {}", c.alert, c.state.as_str()),
                attributes: attributes(c),
                ..span::Event::default()
            });
        } else {
            o.dropped_events += 1;
        }
        o.victims
            .insert(format!("{}:{}", c.victim.pid, c.victim.comm));
        o.alerts.insert(c.alert);
        o.severity = o.severity.max(c.severity);
        match c.state {
            AlertState::Resolved => {
                o.active.remove(&c.key());
            }
            _ => {
                o.active.insert(c.key());
            }
        }
        let (number, text) = severity(c);
        let log =
            LogRecord {
                time_unix_nano: now_ns,
                observed_time_unix_nano: now_ns,
                severity_number: number as i32,
                severity_text: text.into(),
                body: Some(opentelemetry_proto::tonic::common::v1::AnyValue {
                    value: Some(
                        opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue(
                            format!("{} {}: {}", c.alert, c.state.as_str(), c.summary()),
                        ),
                    ),
                }),
                attributes: attributes(c),
                trace_id: o.trace_id.clone(),
                span_id: o.span_id.clone(),
                ..LogRecord::default()
            };
        if c.state == AlertState::Resolved && o.active.is_empty() {
            let o = self.open.remove(&c.incident).expect("present");
            ended.push(finish(&c.incident, o, now_ns));
        }
        (log, ended)
    }
}

/// The span of an incident that ended at `now_ns`.
fn finish(key: &Incident, o: Open, now_ns: u64) -> Span {
    let mut attributes = vec![
        attr("cudatrace.incident.cause", key.cause.as_str()),
        attr("cudatrace.incident.gpu", key.gpu.clone()),
        attr("cudatrace.incident.aggressors", key.aggressors.clone()),
        attr(
            "cudatrace.incident.victims",
            o.victims.iter().cloned().collect::<Vec<_>>().join(","),
        ),
        attr(
            "cudatrace.incident.alerts",
            o.alerts.iter().copied().collect::<Vec<_>>().join(","),
        ),
        attr("cudatrace.incident.severity", o.severity.as_str()),
    ];
    if !o.active.is_empty() {
        attributes.push(attr("cudatrace.incident.ended", "bound"));
    }
    Span {
        trace_id: o.trace_id,
        span_id: o.span_id,
        name: format!("incident {}", key.cause.as_str()),
        kind: SpanKind::Internal as i32,
        start_time_unix_nano: o.start_ns,
        end_time_unix_nano: now_ns.max(o.start_ns),
        attributes,
        events: o.events,
        dropped_events_count: o.dropped_events,
        ..Span::default()
    }
}
