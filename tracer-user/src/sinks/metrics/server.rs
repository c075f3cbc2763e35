//! The metrics server: axum on its own thread and runtime. Each scrape asks the event loop for a
//! fresh [`Snapshot`] (answered between two drains), then encodes it here, as OpenMetrics or the
//! Prometheus text format by the scrape's `Accept` header. Scrapes are encoded one at a time.
use std::{net::SocketAddr, sync::Arc};

use anyhow::{Context as _, Result};
use axum::{
    Router,
    extract::State,
    http::{HeaderMap, StatusCode, header},
    response::IntoResponse,
    routing::get,
};
use prometheus_client::registry::Registry;
use tokio::sync::{Mutex, mpsc, oneshot};

use super::{Snapshot, SnapshotCell};

/// A scrape's request for a snapshot, answered by the event loop.
pub type SnapshotRequest = oneshot::Sender<Arc<Snapshot>>;

struct Served {
    registry: Registry,
    cell: SnapshotCell,
    requests: mpsc::Sender<SnapshotRequest>,
    /// Held while a scrape refreshes and encodes.
    encoding: Mutex<()>,
}

/// Binds the metrics listener, with a one-line error when the address is taken.
pub fn bind(addr: SocketAddr) -> Result<std::net::TcpListener> {
    std::net::TcpListener::bind(addr).map_err(|e| match e.kind() {
        std::io::ErrorKind::AddrInUse => {
            anyhow::anyhow!("port in use: {addr} is taken by another program; pass another with --listen ADDR:PORT")
        }
        _ => anyhow::anyhow!("cannot listen on {addr}: {e}"),
    })
}

/// Serves `/metrics` on its own thread until the process exits; scrapes send their snapshot
/// requests to `requests`.
pub fn spawn(listener: std::net::TcpListener, requests: mpsc::Sender<SnapshotRequest>) -> Result<()> {
    listener.set_nonblocking(true).context("cannot make the metrics listener non-blocking")?;
    let cell = SnapshotCell::default();
    let served = Arc::new(Served { registry: super::registry(&cell), cell, requests, encoding: Mutex::new(()) });
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().context("cannot start the metrics runtime")?;
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            let result = runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener)?;
                let app = Router::new()
                    .route("/metrics", get(metrics))
                    .route("/", get(|| async { "cudatrace: metrics at /metrics\n" }))
                    .with_state(served);
                axum::serve(listener, app).await
            });
            if let Err(e) = result {
                eprintln!("cudatrace: metrics server failed: {e}");
            }
        })
        .context("cannot start the metrics thread")?;
    Ok(())
}

async fn metrics(State(served): State<Arc<Served>>, headers: HeaderMap) -> impl IntoResponse {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or("");
    let openmetrics = accept.contains("application/openmetrics-text");
    let _one_at_a_time = served.encoding.lock().await;
    let (tx, rx) = oneshot::channel();
    // Once tracing has stopped the loop answers no more: the last snapshot is served.
    if served.requests.send(tx).await.is_ok() {
        if let Ok(snapshot) = rx.await {
            served.cell.store(snapshot);
        }
    }
    let mut body = String::new();
    let (result, content_type) = if openmetrics {
        (
            prometheus_client::encoding::text::encode(&mut body, &served.registry),
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )
    } else {
        (
            prometheus_client::encoding::prometheus_text::encode(&mut body, &served.registry),
            "text/plain; version=0.0.4; charset=utf-8",
        )
    };
    match result {
        Ok(()) => (StatusCode::OK, [(header::CONTENT_TYPE, content_type)], body),
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, [(header::CONTENT_TYPE, "text/plain")], "encoding failed\n".into()),
    }
}
