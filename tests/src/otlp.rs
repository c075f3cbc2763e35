//! A loopback OTLP receiver built on the official protobuf definitions (opentelemetry-proto):
//! http/protobuf (`POST /v1/traces`) and gRPC (`TraceService/Export` over HTTP/2, answered
//! trailers-only with `grpc-status: 0`), on one port. It keeps every span with its resource's
//! attributes and the headers of the request that brought it.
use std::{
    collections::BTreeMap,
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use opentelemetry_proto::tonic::{
    collector::{logs::v1::ExportLogsServiceRequest, trace::v1::ExportTraceServiceRequest},
    common::v1::{any_value::Value as Any, KeyValue},
    logs::v1::LogRecord,
    trace::v1::Span,
};
use prost::Message as _;

/// A span as received: its resource's attributes, its own, and the request's headers.
#[derive(Clone, Debug)]
pub struct Received {
    /// The resource's attributes (strings and integers as text).
    pub resource: BTreeMap<String, String>,
    /// The span.
    pub span: Span,
    /// The span's attributes, as text.
    pub attributes: BTreeMap<String, String>,
    /// The request's headers.
    pub headers: BTreeMap<String, String>,
    /// "http" or "grpc".
    pub protocol: &'static str,
}

/// A log record as received: its resource's attributes, its own, and the record.
#[derive(Clone, Debug)]
pub struct ReceivedLog {
    /// The resource's attributes.
    pub resource: BTreeMap<String, String>,
    /// The record's attributes, as text.
    pub attributes: BTreeMap<String, String>,
    /// The record.
    pub record: LogRecord,
}

/// What the receiver holds.
#[derive(Default)]
struct Kept {
    spans: Vec<Received>,
    logs: Vec<ReceivedLog>,
}

/// Attributes as text.
pub fn text(attrs: &[KeyValue]) -> BTreeMap<String, String> {
    attrs
        .iter()
        .map(|kv| {
            let v = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(Any::StringValue(s)) => s.clone(),
                Some(Any::IntValue(i)) => i.to_string(),
                Some(Any::BoolValue(b)) => b.to_string(),
                Some(Any::DoubleValue(d)) => d.to_string(),
                _ => String::new(),
            };
            (kv.key.clone(), v)
        })
        .collect()
}

/// The receiver; it stops when dropped.
pub struct Receiver {
    /// Its address.
    pub addr: SocketAddr,
    kept: Arc<Mutex<Kept>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Receiver {
    /// Starts one on a free loopback port.
    pub fn start() -> Receiver {
        Self::start_on(0)
    }

    /// Starts one on `port` (0: any free one).
    pub fn start_on(port: u16) -> Receiver {
        let kept = Arc::new(Mutex::new(Kept::default()));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (tx, rx) = std::sync::mpsc::channel();
        let held = kept.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(serve(port, held, tx, stopped));
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the receiver listens");
        Receiver {
            addr,
            kept,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// Its http URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The spans received so far.
    pub fn spans(&self) -> Vec<Received> {
        self.kept.lock().unwrap().spans.clone()
    }

    /// The log records received so far.
    pub fn logs(&self) -> Vec<ReceivedLog> {
        self.kept.lock().unwrap().logs.clone()
    }

    /// Waits up to `limit` until `pred` holds of what came; returns whether it did.
    pub fn wait_until(
        &self,
        limit: Duration,
        pred: impl Fn(&[Received], &[ReceivedLog]) -> bool,
    ) -> bool {
        let start = Instant::now();
        while start.elapsed() < limit {
            {
                let k = self.kept.lock().unwrap();
                if pred(&k.spans, &k.logs) {
                    return true;
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    }

    /// Waits up to `limit` until at least `n` spans came; returns them all.
    pub fn wait_for(&self, n: usize, limit: Duration) -> Vec<Received> {
        let start = Instant::now();
        while start.elapsed() < limit && self.kept.lock().unwrap().spans.len() < n {
            std::thread::sleep(Duration::from_millis(50));
        }
        self.spans()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn serve(
    port: u16,
    kept: Arc<Mutex<Kept>>,
    ready: std::sync::mpsc::Sender<SocketAddr>,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    ready.send(listener.local_addr().unwrap()).unwrap();
    let mut conns = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            _ = &mut stopped => break,
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let kept = kept.clone();
                conns.spawn(async move {
                    let service = hyper::service::service_fn(move |req| handle(req, kept.clone()));
                    let _ = hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new())
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
            }
        }
    }
    conns.abort_all();
}

async fn handle(
    req: hyper::Request<hyper::body::Incoming>,
    kept: Arc<Mutex<Kept>>,
) -> Result<hyper::Response<Full<Bytes>>, std::convert::Infallible> {
    let path = req.uri().path().to_owned();
    let headers: BTreeMap<String, String> = req
        .headers()
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_owned()))
        .collect();
    let body = req
        .into_body()
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    let grpc = path.starts_with("/opentelemetry.proto.collector.");
    let msg = if grpc && body.len() >= 5 {
        body.slice(5..)
    } else {
        body
    };
    let protocol = if grpc { "grpc" } else { "http" };
    let bad = || {
        Ok(hyper::Response::builder()
            .status(400)
            .body(Full::default())
            .unwrap())
    };
    match path.as_str() {
        "/v1/traces" | "/opentelemetry.proto.collector.trace.v1.TraceService/Export" => {
            let Ok(request) = ExportTraceServiceRequest::decode(msg) else {
                return bad();
            };
            let mut k = kept.lock().unwrap();
            for rs in request.resource_spans {
                let resource = text(&rs.resource.map(|r| r.attributes).unwrap_or_default());
                for ss in rs.scope_spans {
                    for span in ss.spans {
                        k.spans.push(Received {
                            resource: resource.clone(),
                            attributes: text(&span.attributes),
                            span,
                            headers: headers.clone(),
                            protocol,
                        });
                    }
                }
            }
        }
        "/v1/logs" | "/opentelemetry.proto.collector.logs.v1.LogsService/Export" => {
            let Ok(request) = ExportLogsServiceRequest::decode(msg) else {
                return bad();
            };
            let mut k = kept.lock().unwrap();
            for rl in request.resource_logs {
                let resource = text(&rl.resource.map(|r| r.attributes).unwrap_or_default());
                for sl in rl.scope_logs {
                    for record in sl.log_records {
                        k.logs.push(ReceivedLog {
                            resource: resource.clone(),
                            attributes: text(&record.attributes),
                            record,
                        });
                    }
                }
            }
        }
        _ => {
            return Ok(hyper::Response::builder()
                .status(404)
                .body(Full::default())
                .unwrap())
        }
    }
    let answer = if grpc {
        hyper::Response::builder()
            .header("content-type", "application/grpc")
            .header("grpc-status", "0")
            .body(Full::default())
    } else {
        hyper::Response::builder()
            .header("content-type", "application/x-protobuf")
            .body(Full::default())
    };
    Ok(answer.unwrap())
}
