//! The `[otlp]` table: slow and failed driver calls as OpenTelemetry spans, sent to an OTLP
//! endpoint. Off unless an endpoint is given, in the file or in `OTEL_EXPORTER_OTLP_ENDPOINT`;
//! the standard `OTEL_EXPORTER_OTLP_*`, `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES`
//! variables fill what the file leaves out.
use std::{collections::BTreeMap, path::PathBuf};

use serde::Deserialize;

use super::{ConfigError, Result};

/// How spans travel.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
pub enum Protocol {
    /// Protobuf over HTTP POST to `ENDPOINT/v1/traces`.
    #[default]
    #[serde(rename = "http/protobuf")]
    HttpProtobuf,
    /// gRPC (HTTP/2) to `ENDPOINT`, service `opentelemetry.proto.collector.trace.v1.TraceService`.
    #[serde(rename = "grpc")]
    Grpc,
}

/// The `[otlp]` table.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct OtlpConfig {
    /// The collector's URL (http or https); none: no export.
    pub endpoint: Option<String>,
    /// `http/protobuf` or `grpc` (default: `OTEL_EXPORTER_OTLP_PROTOCOL`, else http/protobuf).
    pub protocol: Option<Protocol>,
    /// Headers sent with every export (an API key, a tenant).
    pub headers: BTreeMap<String, String>,
    /// Certificates (PEM) to trust besides the public roots, for an https endpoint.
    pub ca_file: Option<PathBuf>,
    /// Seconds one export may take (default 10).
    pub timeout_s: Option<u64>,
    /// A call at least this slow (microseconds) is a span (default 1000); a failed one always.
    pub min_duration_us: Option<u64>,
    /// Spans waiting at most; past it the newest are dropped and counted (default 2048).
    pub max_queue: Option<usize>,
    /// `service.name` of every resource (default: `OTEL_SERVICE_NAME`, else the workload).
    pub service_name: Option<String>,
}

/// The `[otlp]` settings in force: the file's, the environment's where it is silent.
#[derive(Clone, Debug, PartialEq)]
pub struct Otlp {
    /// The collector's URL.
    pub endpoint: String,
    /// How spans travel.
    pub protocol: Protocol,
    /// Headers of every export.
    pub headers: Vec<(String, String)>,
    /// Extra trusted certificates.
    pub ca_file: Option<PathBuf>,
    /// Seconds one export may take.
    pub timeout_s: u64,
    /// The slowest call (µs) that is not a span.
    pub min_duration_us: u64,
    /// Spans waiting at most.
    pub max_queue: usize,
    /// `service.name` for every resource, when set.
    pub service_name: Option<String>,
    /// `OTEL_RESOURCE_ATTRIBUTES`: added to every resource.
    pub resource: Vec<(String, String)>,
}

/// `k1=v1,k2=v2` with percent-encoded values (the OTel variables' format); a pair without `=`
/// is an error naming `what`.
fn pairs(text: &str, what: &str) -> Result<Vec<(String, String)>> {
    text.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').ok_or_else(|| {
                ConfigError::invalid(
                    what,
                    format!(
                        "{what}: {p:?} is not KEY=VALUE: give KEY=VALUE pairs separated by commas"
                    ),
                )
            })?;
            Ok((k.trim().to_owned(), percent_decode(v.trim())))
        })
        .collect()
}

/// `%XX` decoded (invalid escapes kept as they are).
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let hex = std::str::from_utf8(&b[i + 1..i + 3]).ok();
            if let Some(v) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl OtlpConfig {
    /// The settings in force, `var` reading the environment; `None` without an endpoint.
    pub fn resolve(&self, var: impl Fn(&str) -> Option<String>) -> Result<Option<Otlp>> {
        let Some(endpoint) = self
            .endpoint
            .clone()
            .or_else(|| var("OTEL_EXPORTER_OTLP_ENDPOINT"))
            .filter(|e| !e.trim().is_empty())
        else {
            return Ok(None);
        };
        super::check_url(&endpoint).map_err(|e| {
            ConfigError::invalid("otlp.endpoint", format!("otlp.endpoint {endpoint}: {e}"))
        })?;
        let protocol = match (self.protocol, var("OTEL_EXPORTER_OTLP_PROTOCOL")) {
            (Some(p), _) => p,
            (None, None) => Protocol::HttpProtobuf,
            (None, Some(p)) => match p.trim() {
                "http/protobuf" | "" => Protocol::HttpProtobuf,
                "grpc" => Protocol::Grpc,
                other => {
                    return Err(ConfigError::invalid(
                        "otlp.protocol",
                        format!("OTEL_EXPORTER_OTLP_PROTOCOL={other}: give http/protobuf or grpc (http/json is not supported)"),
                    ))
                }
            },
        };
        let mut headers: Vec<(String, String)> = match var("OTEL_EXPORTER_OTLP_HEADERS") {
            Some(h) => pairs(&h, "OTEL_EXPORTER_OTLP_HEADERS")?,
            None => Vec::new(),
        };
        for (k, v) in &self.headers {
            headers.retain(|(n, _)| !n.eq_ignore_ascii_case(k));
            headers.push((k.clone(), v.clone()));
        }
        for (k, v) in &headers {
            if http::HeaderName::try_from(k.as_str()).is_err()
                || http::HeaderValue::try_from(v.as_str()).is_err()
            {
                return Err(ConfigError::invalid(
                    "otlp.headers",
                    format!("otlp.headers: {k:?} is not a valid HTTP header name and value"),
                ));
            }
        }
        let timeout_s = match (self.timeout_s, var("OTEL_EXPORTER_OTLP_TIMEOUT")) {
            (Some(t), _) => t,
            (None, Some(ms)) => ms
                .trim()
                .parse::<u64>()
                .map(|ms| ms.div_ceil(1000))
                .map_err(|_| {
                    ConfigError::invalid(
                        "otlp.timeout_s",
                        format!("OTEL_EXPORTER_OTLP_TIMEOUT={ms}: give milliseconds"),
                    )
                })?,
            (None, None) => 10,
        };
        if !(1..=60).contains(&timeout_s) {
            return Err(ConfigError::invalid(
                "otlp.timeout_s",
                format!("otlp.timeout_s = {timeout_s}: give 1 to 60 seconds"),
            ));
        }
        let max_queue = self.max_queue.unwrap_or(2048);
        if !(1..=1_000_000).contains(&max_queue) {
            return Err(ConfigError::invalid(
                "otlp.max_queue",
                format!("otlp.max_queue = {max_queue}: give 1 to 1000000 spans"),
            ));
        }
        let resource = match var("OTEL_RESOURCE_ATTRIBUTES") {
            Some(r) => pairs(&r, "OTEL_RESOURCE_ATTRIBUTES")?,
            None => Vec::new(),
        };
        Ok(Some(Otlp {
            endpoint,
            protocol,
            headers,
            ca_file: self
                .ca_file
                .clone()
                .or_else(|| var("OTEL_EXPORTER_OTLP_CERTIFICATE").map(PathBuf::from)),
            timeout_s,
            min_duration_us: self.min_duration_us.unwrap_or(1000),
            max_queue,
            service_name: self
                .service_name
                .clone()
                .or_else(|| var("OTEL_SERVICE_NAME"))
                .filter(|s| !s.is_empty()),
            resource,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::text::fake_env as env;

    #[test]
    fn off_without_an_endpoint_and_the_environment_fills_the_rest() {
        assert_eq!(OtlpConfig::default().resolve(env(&[])).unwrap(), None);
        let o = OtlpConfig::default()
            .resolve(env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
                ("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=a%20b,tenant=t1"),
                ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
                ("OTEL_SERVICE_NAME", "gpu-node"),
                ("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=prod"),
            ]))
            .unwrap()
            .unwrap();
        assert_eq!(o.endpoint, "http://collector:4318");
        assert_eq!(o.protocol, Protocol::Grpc);
        assert_eq!(
            o.headers,
            [
                ("x-api-key".into(), "a b".into()),
                ("tenant".into(), "t1".into())
            ]
        );
        assert_eq!(
            (o.timeout_s, o.min_duration_us, o.max_queue),
            (3, 1000, 2048)
        );
        assert_eq!(o.service_name.as_deref(), Some("gpu-node"));
        assert_eq!(
            o.resource,
            [("deployment.environment".into(), "prod".into())]
        );
        // The file wins over the environment.
        let file = OtlpConfig {
            endpoint: Some("https://otel.example:4318".into()),
            protocol: Some(Protocol::HttpProtobuf),
            headers: BTreeMap::from([("tenant".into(), "t2".into())]),
            ..OtlpConfig::default()
        };
        let o = file
            .resolve(env(&[("OTEL_EXPORTER_OTLP_HEADERS", "tenant=t1")]))
            .unwrap()
            .unwrap();
        assert_eq!(
            (o.protocol, o.headers),
            (Protocol::HttpProtobuf, vec![("tenant".into(), "t2".into())])
        );
    }

    #[test]
    fn bad_values_say_what_to_give() {
        let e = |vars: &[(&str, &str)]| {
            OtlpConfig::default()
                .resolve(env(vars))
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            e(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318")]),
            "otlp.endpoint collector:4318: not an http or https URL: give http[s]://HOST[:PORT][/PATH]"
        );
        assert_eq!(
            e(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"), ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")]),
            "OTEL_EXPORTER_OTLP_PROTOCOL=http/json: give http/protobuf or grpc (http/json is not supported)"
        );
        assert_eq!(
            e(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"), ("OTEL_EXPORTER_OTLP_HEADERS", "novalue")]),
            "OTEL_EXPORTER_OTLP_HEADERS: \"novalue\" is not KEY=VALUE: give KEY=VALUE pairs separated by commas"
        );
    }
}
