//! The metrics server: axum routes served by hyper on their own thread and runtime. Each scrape
//! asks the event loop for a fresh [`Snapshot`] (answered between two drains), then encodes it
//! here, as OpenMetrics or the Prometheus text format by the scrape's `Accept` header. Scrapes
//! are encoded one at a time.
//!
//! Anyone who reaches the port can connect, so connections are bounded: per client and in all
//! ([`super::admission`]: a new one past the limits is closed at once), headers must arrive
//! within [`HEADER_TIMEOUT`], a connection idle for [`super::admission::IDLE_TIMEOUT`] is
//! closed, one lives at most [`CONNECTION_LIFETIME`], and headers are at most
//! [`MAX_HEADER_BYTES`]. With a web config file ([`super::web`]) it speaks TLS only (the
//! handshake within [`HEADER_TIMEOUT`] too) and answers 401, closing the connection, without a
//! user's right password.
use std::{net::SocketAddr, sync::Arc, time::Duration};

use anyhow::{Context as _, Result};
use axum::{
    extract::{Extension, State},
    http::{header, HeaderMap, StatusCode},
    response::IntoResponse,
    routing::get,
    Router,
};
use hyper_util::{
    rt::{TokioIo, TokioTimer},
    service::TowerToHyperService,
};
use prometheus_client::registry::Registry;
use tokio::sync::{mpsc, oneshot, Mutex};

use super::{
    admission::{Admission, Client, Watched},
    web::WebConfig,
    Snapshot, SnapshotCell,
};

/// Time a connection has to send a request's headers.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest life of one connection (a scraper then opens another).
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(60);
/// Largest request head read.
pub const MAX_HEADER_BYTES: usize = 16 * 1024;

/// A scrape's request for a snapshot, answered by the event loop.
pub type SnapshotRequest = oneshot::Sender<Arc<Snapshot>>;

struct Served {
    registry: Registry,
    cell: SnapshotCell,
    requests: mpsc::Sender<SnapshotRequest>,
    /// Held while a scrape refreshes and encodes.
    encoding: Mutex<()>,
    /// Users, when basic auth is on.
    auth: Option<super::web::BasicAuth>,
}

/// `None` when the request may go on, else the 401 to answer (which closes the connection).
async fn refused(
    served: &Served,
    headers: &HeaderMap,
    client: Client,
) -> Option<axum::response::Response> {
    let auth = served.auth.as_ref()?;
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    if auth.allows(given, client).await {
        return None;
    }
    Some(
        (
            StatusCode::UNAUTHORIZED,
            [
                (header::WWW_AUTHENTICATE, "Basic realm=\"cudatrace\""),
                (header::CONNECTION, "close"),
            ],
            "unauthorized\n",
        )
            .into_response(),
    )
}

/// Raises this process's open-file limit to its hard limit (no privilege needed): connections
/// and libraries both take descriptors. Returns the limit in force.
pub fn raise_fd_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit get a valid pointer to an rlimit.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return 0;
        }
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
            return raised.rlim_cur;
        }
    }
    limit.rlim_cur
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
pub fn spawn(
    listener: std::net::TcpListener,
    requests: mpsc::Sender<SnapshotRequest>,
    web: WebConfig,
) -> Result<()> {
    listener
        .set_nonblocking(true)
        .context("cannot make the metrics listener non-blocking")?;
    let cell = SnapshotCell::default();
    let tls = web.tls.map(tokio_rustls::TlsAcceptor::from);
    let served = Arc::new(Served {
        registry: super::registry(&cell),
        cell,
        requests,
        encoding: Mutex::new(()),
        auth: web.auth,
    });
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the metrics runtime")?;
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            let result = runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener)?;
                let app = Router::new()
                    .route("/metrics", get(metrics))
                    .route("/alerts", get(alerts))
                    .route("/", get(index))
                    .with_state(served);
                accept_loop(listener, app, tls).await
            });
            if let Err(e) = result {
                log::error!("cudatrace: metrics server failed: {e}");
            }
        })
        .context("cannot start the metrics thread")?;
    Ok(())
}

/// Serves each accepted connection with the bounds above.
async fn accept_loop(
    listener: tokio::net::TcpListener,
    app: Router,
    tls: Option<tokio_rustls::TlsAcceptor>,
) -> std::io::Result<()> {
    let admission = Admission::default();
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            // Out of descriptors, or the peer gave up first: go on accepting.
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let client = Client::of(peer.ip());
        let Some(ticket) = admission.admit(client) else {
            drop(stream);
            continue;
        };
        let app = app.clone().layer(Extension(client));
        let tls = tls.clone();
        tokio::spawn(async move {
            match tls {
                None => serve(stream, app).await,
                Some(acceptor) => {
                    if let Ok(Ok(stream)) =
                        tokio::time::timeout(HEADER_TIMEOUT, acceptor.accept(stream)).await
                    {
                        serve(stream, app).await;
                    }
                }
            }
            drop(ticket);
        });
    }
}

/// Serves one connection (plain or TLS) for at most [`CONNECTION_LIFETIME`].
async fn serve<S>(stream: S, app: Router)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = TowerToHyperService::new(app);
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .max_buf_size(MAX_HEADER_BYTES);
    let (stream, idle) = Watched::new(stream);
    let connection = http.serve_connection(TokioIo::new(stream), service);
    tokio::select! {
        _ = connection => {}
        _ = idle => {}
        _ = tokio::time::sleep(CONNECTION_LIFETIME) => {}
    }
}

async fn index(
    State(served): State<Arc<Served>>,
    Extension(client): Extension<Client>,
    headers: HeaderMap,
) -> axum::response::Response {
    if let Some(no) = refused(&served, &headers, client).await {
        return no;
    }
    "cudatrace: metrics at /metrics\n".into_response()
}

/// Asks the loop for a new snapshot. Once tracing has stopped the loop answers no more: the
/// last snapshot is served.
async fn refresh(served: &Served) {
    let (tx, rx) = oneshot::channel();
    if served.requests.send(tx).await.is_ok() {
        if let Ok(snapshot) = rx.await {
            served.cell.store(snapshot);
        }
    }
}

/// The pending and firing alerts as one JSON array (what `cudatrace explain` reads live), behind
/// the same authentication and bounds as `/metrics`.
async fn alerts(
    State(served): State<Arc<Served>>,
    Extension(client): Extension<Client>,
    headers: HeaderMap,
) -> axum::response::Response {
    if let Some(no) = refused(&served, &headers, client).await {
        return no;
    }
    let _one_at_a_time = served.encoding.lock().await;
    refresh(&served).await;
    let body = serde_json::to_string(&served.cell.load().alerts).unwrap_or_else(|_| "[]".into());
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response()
}

async fn metrics(
    State(served): State<Arc<Served>>,
    Extension(client): Extension<Client>,
    headers: HeaderMap,
) -> axum::response::Response {
    if let Some(no) = refused(&served, &headers, client).await {
        return no;
    }
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let openmetrics = accept.contains("application/openmetrics-text");
    let _one_at_a_time = served.encoding.lock().await;
    refresh(&served).await;
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
        Ok(()) => (StatusCode::OK, [(header::CONTENT_TYPE, content_type)], body).into_response(),
        Err(_) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain")],
            "encoding failed\n",
        )
            .into_response(),
    }
}
