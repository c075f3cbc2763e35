//! Sending one export request: protobuf POSTed to `ENDPOINT/v1/traces` or `/v1/logs`
//! (http/protobuf), or a gRPC call of `TraceService/Export` or `LogsService/Export` over HTTP/2 (one length-prefixed message; the answer's
//! `grpc-status` says whether it was taken). Headers from `[otlp] headers` on both.
use std::time::Duration;

use anyhow::{bail, Context as _, Result};
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};

use crate::{
    config::otlp::{Otlp, Protocol},
    sinks::client::{client, HttpClient},
};

/// Largest answer read.
const MAX_ANSWER: usize = 64 << 10;

/// What an export carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// An `ExportTraceServiceRequest`.
    Traces,
    /// An `ExportLogsServiceRequest`.
    Logs,
}

/// Where and how exports go.
pub struct Sender {
    client: HttpClient,
    urls: [String; 2],
    protocol: Protocol,
    headers: Vec<(http::HeaderName, http::HeaderValue)>,
    timeout: Duration,
}

impl Sender {
    /// A sender for `cfg`; an error when its CA file cannot be used.
    pub fn new(cfg: &Otlp) -> Result<Sender> {
        let grpc = cfg.protocol == Protocol::Grpc;
        let base = cfg.endpoint.trim_end_matches('/');
        let base = base.strip_suffix("/v1/traces").unwrap_or(base);
        let urls = match cfg.protocol {
            Protocol::HttpProtobuf => [format!("{base}/v1/traces"), format!("{base}/v1/logs")],
            Protocol::Grpc => [
                format!("{base}/opentelemetry.proto.collector.trace.v1.TraceService/Export"),
                format!("{base}/opentelemetry.proto.collector.logs.v1.LogsService/Export"),
            ],
        };
        let headers = cfg
            .headers
            .iter()
            .map(|(k, v)| {
                Ok((
                    http::HeaderName::try_from(k.as_str())?,
                    http::HeaderValue::try_from(v.as_str())?,
                ))
            })
            .collect::<Result<Vec<_>, anyhow::Error>>()
            .context("otlp.headers")?;
        Ok(Sender {
            client: client(cfg.ca_file.as_deref(), "otlp.ca_file", grpc)?,
            urls,
            protocol: cfg.protocol,
            headers,
            timeout: Duration::from_secs(cfg.timeout_s),
        })
    }

    /// Where exports of `kind` go.
    pub fn url(&self, kind: Kind) -> &str {
        &self.urls[kind as usize]
    }

    /// Sends `msg` (an encoded request of `kind`); an error says why it was not taken.
    pub async fn export(&self, kind: Kind, msg: &[u8]) -> Result<()> {
        let msg = msg.to_vec();
        let (body, content_type) = match self.protocol {
            Protocol::HttpProtobuf => (Bytes::from(msg), "application/x-protobuf"),
            Protocol::Grpc => {
                let mut framed = Vec::with_capacity(msg.len() + 5);
                framed.push(0);
                framed.extend_from_slice(&(msg.len() as u32).to_be_bytes());
                framed.extend_from_slice(&msg);
                (Bytes::from(framed), "application/grpc")
            }
        };
        let mut request = http::Request::post(self.url(kind))
            .header(http::header::CONTENT_TYPE, content_type)
            .header(
                http::header::USER_AGENT,
                concat!("cudatrace/", env!("CARGO_PKG_VERSION")),
            );
        if self.protocol == Protocol::Grpc {
            request = request.header("te", "trailers");
        }
        for (k, v) in &self.headers {
            request = request.header(k, v);
        }
        let request = request.body(Full::new(body))?;
        let answer = tokio::time::timeout(self.timeout, async {
            let resp = self.client.request(request).await?;
            let status = resp.status();
            let head_grpc = resp.headers().get("grpc-status").cloned();
            let collected = http_body_util::Limited::new(resp.into_body(), MAX_ANSWER)
                .collect()
                .await
                .map_err(|e| anyhow::anyhow!("reading the answer: {e}"))?;
            let trailer_grpc = collected
                .trailers()
                .and_then(|t| t.get("grpc-status").cloned());
            Ok::<_, anyhow::Error>((status, head_grpc.or(trailer_grpc)))
        })
        .await
        .map_err(|_| anyhow::anyhow!("no answer within {} s", self.timeout.as_secs()))??;
        let (status, grpc_status) = answer;
        if !status.is_success() {
            bail!("answered {status}");
        }
        if self.protocol == Protocol::Grpc {
            match grpc_status.as_ref().and_then(|v| v.to_str().ok()) {
                Some("0") => {}
                Some(code) => bail!("gRPC status {code}"),
                None => bail!("no gRPC status in the answer"),
            }
        }
        Ok(())
    }
}
