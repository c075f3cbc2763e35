//! Sending one export request: protobuf POSTed to `ENDPOINT/v1/traces` (http/protobuf), or a
//! gRPC call of `TraceService/Export` over HTTP/2 (one length-prefixed message; the answer's
//! `grpc-status` says whether it was taken). Headers from `[otlp] headers` on both.
use std::time::Duration;

use anyhow::{bail, Context as _, Result};
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message as _;

use crate::{
    config::otlp::{Otlp, Protocol},
    sinks::client::{client, HttpClient},
};

/// Largest answer read.
const MAX_ANSWER: usize = 64 << 10;

/// Where and how exports go.
pub struct Sender {
    client: HttpClient,
    url: String,
    protocol: Protocol,
    headers: Vec<(http::HeaderName, http::HeaderValue)>,
    timeout: Duration,
}

impl Sender {
    /// A sender for `cfg`; an error when its CA file cannot be used.
    pub fn new(cfg: &Otlp) -> Result<Sender> {
        let grpc = cfg.protocol == Protocol::Grpc;
        let base = cfg.endpoint.trim_end_matches('/');
        let url = match cfg.protocol {
            Protocol::HttpProtobuf if base.ends_with("/v1/traces") => base.to_owned(),
            Protocol::HttpProtobuf => format!("{base}/v1/traces"),
            Protocol::Grpc => {
                format!("{base}/opentelemetry.proto.collector.trace.v1.TraceService/Export")
            }
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
            url,
            protocol: cfg.protocol,
            headers,
            timeout: Duration::from_secs(cfg.timeout_s),
        })
    }

    /// Where exports go.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Sends `req`; an error says why it was not taken.
    pub async fn export(&self, req: &ExportTraceServiceRequest) -> Result<()> {
        let msg = req.encode_to_vec();
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
        let mut request = http::Request::post(&self.url)
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
