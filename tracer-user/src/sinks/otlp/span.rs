//! One recorded driver call as an OTLP span: named by its entry point, its real start and end
//! in wall-clock time, who made it (`process.pid`, `thread.id`, `process.executable.name`, the
//! Kubernetes names, `container.id`), its `CUresult`, and its arguments under `cuda.`.
use opentelemetry_proto::tonic::{
    common::v1::{any_value::Value, AnyValue, KeyValue},
    trace::v1::{span::SpanKind, status::StatusCode, Span, Status},
};

use crate::{
    event::{Detail, Event},
    identity::Identity,
};

/// A string attribute.
pub fn attr(key: &str, v: impl Into<String>) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue {
            value: Some(Value::StringValue(v.into())),
        }),
        ..KeyValue::default()
    }
}

/// An integer attribute.
pub fn int(key: &str, v: i64) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue {
            value: Some(Value::IntValue(v)),
        }),
        ..KeyValue::default()
    }
}

/// Span and trace ids: 8 random bytes read once, then a counter (unique, not secret).
pub struct Ids {
    seed: [u8; 8],
    next: u64,
}

impl Ids {
    /// Seeded from the kernel's random bytes (the clock and pid when those cannot be read).
    pub fn new() -> Ids {
        let mut seed = [0u8; 8];
        let read = std::fs::File::open("/dev/urandom")
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut seed));
        if read.is_err() {
            let t = crate::event::monotonic_ns() ^ u64::from(std::process::id()) << 32;
            seed = t.to_le_bytes();
        }
        Ids { seed, next: 1 }
    }

    /// A new (trace id, span id).
    pub fn fresh(&mut self) -> (Vec<u8>, Vec<u8>) {
        let n = self.next;
        self.next = self.next.wrapping_add(1);
        let mut trace = Vec::with_capacity(16);
        trace.extend_from_slice(&self.seed);
        trace.extend_from_slice(&n.to_be_bytes());
        let mut span = n.to_be_bytes().to_vec();
        span[0] ^= self.seed[0] | 1;
        (trace, span)
    }
}

impl Default for Ids {
    fn default() -> Self {
        Self::new()
    }
}

/// The call `ev` of a process (`identity`, `host`), `kernel` its launch's kernel name, as a
/// span; `wall_offset_ns` turns CLOCK_MONOTONIC into Unix time.
pub fn of_call(
    ev: &Event,
    (identity, host): (&Identity, &str),
    kernel: Option<&str>,
    wall_offset_ns: i128,
    ids: &mut Ids,
) -> Span {
    let start = (i128::from(ev.start_ns) + wall_offset_ns).max(0) as u64;
    let mut attributes = vec![
        int("process.pid", i64::from(ev.pid)),
        int("thread.id", i64::from(ev.tid)),
        attr("process.executable.name", ev.comm.to_string()),
        attr("host.name", host),
        int("cuda.result", i64::from(ev.result)),
    ];
    if let Some(name) = tracer_common::results::result_name(ev.result) {
        attributes.push(attr("cuda.result_name", name));
    }
    if let Some(k) = &identity.kube {
        attributes.push(attr("k8s.namespace.name", k.namespace.clone()));
        attributes.push(attr("k8s.pod.name", k.pod.clone()));
        if !k.container.is_empty() {
            attributes.push(attr("k8s.container.name", k.container.clone()));
        }
    }
    if let Some(uid) = &identity.pod_uid {
        attributes.push(attr("k8s.pod.uid", uid.clone()));
    }
    if let Some(id) = &identity.container_id {
        attributes.push(attr("container.id", id.clone()));
    }
    if let Some(dev) = &identity.cuda_visible_devices {
        attributes.push(attr("cuda.visible_devices", dev.clone()));
    }
    details(&ev.detail, kernel, &mut attributes);
    let (trace_id, span_id) = ids.fresh();
    let failed = ev.result != 0;
    Span {
        trace_id,
        span_id,
        name: ev.api.symbol().to_owned(),
        kind: SpanKind::Client as i32,
        start_time_unix_nano: start,
        end_time_unix_nano: start.saturating_add(ev.duration_ns),
        attributes,
        status: Some(Status {
            code: if failed {
                StatusCode::Error
            } else {
                StatusCode::Unset
            } as i32,
            message: if failed {
                tracer_common::results::result_name(ev.result)
                    .map_or_else(|| format!("CUresult {}", ev.result), str::to_owned)
            } else {
                String::new()
            },
        }),
        ..Span::default()
    }
}

/// The call's arguments as `cuda.` attributes.
fn details(d: &Detail, kernel: Option<&str>, out: &mut Vec<KeyValue>) {
    let dims = |v: &[u32; 3]| format!("{}x{}x{}", v[0], v[1], v[2]);
    let stream = |out: &mut Vec<KeyValue>, s: Option<u64>| {
        if let Some(s) = s {
            out.push(attr("cuda.stream", format!("{s:#x}")));
        }
    };
    match d {
        Detail::Launch {
            grid,
            block,
            shared_mem_bytes,
            stream: s,
            ..
        } => {
            out.push(attr("cuda.grid", dims(grid)));
            out.push(attr("cuda.block", dims(block)));
            out.push(int("cuda.shared_mem_bytes", i64::from(*shared_mem_bytes)));
            stream(out, Some(*s));
            if let Some(k) = kernel {
                out.push(attr("cuda.kernel", k));
            }
        }
        Detail::Graph { stream: s, .. } => stream(out, Some(*s)),
        Detail::Copy {
            bytes,
            direction,
            stream: s,
            ..
        } => {
            out.push(int("cuda.bytes", *bytes as i64));
            out.push(attr("cuda.direction", *direction));
            stream(out, *s);
        }
        Detail::Sync { stream: s, event } => {
            stream(out, *s);
            if let Some(e) = event {
                out.push(attr("cuda.event", format!("{e:#x}")));
            }
        }
        Detail::Alloc {
            bytes, stream: s, ..
        } => {
            out.push(int("cuda.bytes", *bytes as i64));
            stream(out, *s);
        }
        Detail::Free { stream: s, .. } => stream(out, *s),
        Detail::Record { event, stream: s } => {
            stream(out, Some(*s));
            out.push(attr("cuda.event", format!("{event:#x}")));
        }
        Detail::Poll { stream: s, event } => {
            stream(out, *s);
            if let Some(e) = event {
                out.push(attr("cuda.event", format!("{e:#x}")));
            }
        }
        Detail::Capture { stream: s, .. } => stream(out, Some(*s)),
        Detail::GraphBuild { .. }
        | Detail::Lookup { .. }
        | Detail::Resolve { .. }
        | Detail::Context(_) => {}
    }
}
