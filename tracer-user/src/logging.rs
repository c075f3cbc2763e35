//! Everything cudatrace says on stderr goes through the `log` crate to this logger, in one of two
//! formats (`--log-format`, or `CUDATRACE_LOG_FORMAT`):
//! - `text` (the default): the message alone, one line each, as a person reads it
//!   (`ready: 43 probes attached`);
//! - `json`: one object a line with `ts` (RFC 3339, milliseconds, UTC), `level`, `event` (for
//!   the lines a program waits for: `ready`, `summary`, `discovered`, `attached`, `baseline`,
//!   ...), `msg` (the text line) and the event's fields, so that Loki and other collectors parse
//!   them without regexes, and tests read typed fields.
//!
//! A line that names an event logs with the target `cudatrace::EVENT` and its fields as `log`
//! key-values: `log::info!(target: "cudatrace::ready", probes = n; "ready: {n} probes attached")`.
//! Records of other crates (aya's own logging) are not shown, as before this logger existed.
use std::{
    io::Write as _,
    sync::OnceLock,
    time::{SystemTime, UNIX_EPOCH},
};

use log::kv::{Key, Value, VisitSource};

/// How stderr lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// The message alone.
    #[default]
    Text,
    /// One JSON object a line.
    Json,
}

/// Target prefix of the lines that name an event.
pub const EVENT_PREFIX: &str = "cudatrace::";

/// The logger, once installed.
static LOGGER: OnceLock<Logger> = OnceLock::new();

/// Writes cudatrace's records on stderr in its format.
#[derive(Debug)]
pub struct Logger {
    format: LogFormat,
}

/// Installs the logger (the first call wins); records up to `info` are shown.
pub fn init(format: LogFormat) {
    let logger = LOGGER.get_or_init(|| Logger { format });
    if log::set_logger(logger).is_ok() {
        log::set_max_level(log::LevelFilter::Info);
    }
}

/// The format in force (`text` before [`init`]).
pub fn format() -> LogFormat {
    LOGGER.get().map_or(LogFormat::Text, |l| l.format)
}

impl log::Log for Logger {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::Level::Info && ours(metadata.target())
    }

    fn log(&self, record: &log::Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let line = match self.format {
            LogFormat::Text => record.args().to_string(),
            LogFormat::Json => json_line(record, SystemTime::now()),
        };
        let _ = writeln!(std::io::stderr().lock(), "{line}");
    }

    fn flush(&self) {}
}

/// Whether a record is cudatrace's own (not aya's or another crate's).
fn ours(target: &str) -> bool {
    target == "cudatrace" || target.starts_with(EVENT_PREFIX) || target.starts_with("tracer_user")
}

/// The event a target names, if it names one.
fn event(target: &str) -> Option<&str> {
    target.strip_prefix(EVENT_PREFIX).filter(|e| !e.is_empty())
}

/// Collects a record's key-values as JSON.
struct Fields(serde_json::Map<String, serde_json::Value>);

impl<'kvs> VisitSource<'kvs> for Fields {
    fn visit_pair(&mut self, key: Key<'kvs>, value: Value<'kvs>) -> Result<(), log::kv::Error> {
        let v = if let Some(n) = value.to_u64() {
            serde_json::Value::from(n)
        } else if let Some(n) = value.to_i64() {
            serde_json::Value::from(n)
        } else if let Some(b) = value.to_bool() {
            serde_json::Value::from(b)
        } else if let Some(x) = value.to_f64() {
            serde_json::Value::from(x)
        } else {
            serde_json::Value::from(value.to_string())
        };
        self.0.insert(key.as_str().to_owned(), v);
        Ok(())
    }
}

/// One record as a JSON line: `ts`, `level`, `event` (if any), `msg`, then its fields (a field
/// never replaces those four).
fn json_line(record: &log::Record<'_>, now: SystemTime) -> String {
    let mut fields = Fields(serde_json::Map::new());
    let _ = record.key_values().visit(&mut fields);
    let mut out = serde_json::Map::new();
    out.insert("ts".into(), timestamp(now).into());
    out.insert(
        "level".into(),
        record.level().as_str().to_ascii_lowercase().into(),
    );
    if let Some(e) = event(record.target()) {
        out.insert("event".into(), e.into());
    }
    out.insert("msg".into(), record.args().to_string().into());
    for (k, v) in fields.0 {
        out.entry(k).or_insert(v);
    }
    serde_json::Value::Object(out).to_string()
}

/// RFC 3339 in UTC with milliseconds.
fn timestamp(t: SystemTime) -> String {
    let since = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let whole = UNIX_EPOCH + std::time::Duration::from_secs(since.as_secs());
    let seconds = crate::text::rfc3339(whole);
    // "YYYY-MM-DDTHH:MM:SSZ" → "YYYY-MM-DDTHH:MM:SS.mmmZ"
    match seconds.strip_suffix('Z') {
        Some(s) => format!("{s}.{:03}Z", since.subsec_millis()),
        None => seconds,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn an_event_line_carries_its_fields() {
        let kvs: [(&str, u64); 2] = [("probes", 43), ("libraries", 1)];
        let now = UNIX_EPOCH + Duration::from_millis(1_800_000_000_250);
        let record = log::Record::builder()
            .target("cudatrace::ready")
            .level(log::Level::Info)
            .args(format_args!("ready: 43 probes attached"))
            .key_values(&kvs)
            .build();
        let line = json_line(&record, now);
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"ts": "2027-01-15T08:00:00.250Z", "level": "info", "event": "ready",
                "msg": "ready: 43 probes attached", "probes": 43, "libraries": 1})
        );
    }

    #[test]
    fn a_plain_line_has_no_event_and_a_field_never_replaces_the_four() {
        let kvs: [(&str, &str); 1] = [("msg", "forged")];
        let record = log::Record::builder()
            .target("tracer_user::pipeline")
            .level(log::Level::Info)
            .args(format_args!("cudatrace: \"quoted\"\n"))
            .key_values(&kvs)
            .build();
        let line = json_line(&record, UNIX_EPOCH);
        assert!(!line.contains('\n'), "one line: {line}");
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["msg"], "cudatrace: \"quoted\"\n");
        assert!(v.get("event").is_none());
    }

    #[test]
    fn only_cudatraces_own_records_are_shown() {
        let logger = Logger {
            format: LogFormat::Json,
        };
        let meta = |target| {
            log::Metadata::builder()
                .target(target)
                .level(log::Level::Info)
                .build()
        };
        use log::Log as _;
        assert!(logger.enabled(&meta("cudatrace::summary")));
        assert!(logger.enabled(&meta("tracer_user::sinks::http")));
        assert!(!logger.enabled(&meta("aya::bpf")));
        let debug = log::Metadata::builder()
            .target("cudatrace::x")
            .level(log::Level::Debug)
            .build();
        assert!(!logger.enabled(&debug));
    }
}
