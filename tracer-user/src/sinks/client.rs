//! The HTTP client every outgoing sink uses (the alert sinks, OTLP): http and https, TLS by
//! rustls verified against the public roots and the certificates of a CA file.
use anyhow::{Context as _, Result};
use bytes::Bytes;
use http_body_util::Full;
use hyper_util::{
    client::legacy::{connect::HttpConnector, Client},
    rt::TokioExecutor,
};

/// The client type.
pub type HttpClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

/// A client trusting the public roots and `ca_file` (its config key `key`, for messages);
/// HTTP/2 only when `http2` (gRPC, also over plain http), else HTTP/1.1.
pub fn client(ca_file: Option<&std::path::Path>, key: &str, http2: bool) -> Result<HttpClient> {
    use rustls::pki_types::{pem::PemObject as _, CertificateDer};
    let mut roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    if let Some(path) = ca_file {
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
            .and_then(|c| c.collect::<Result<_, _>>())
            .map_err(|e| anyhow::anyhow!("{key} {}: {e}", path.display()))?;
        if certs.is_empty() {
            anyhow::bail!("{key} {}: no certificate in it", path.display());
        }
        for cert in certs {
            roots.add(cert).with_context(|| {
                format!("{key} {}: a certificate rustls refuses", path.display())
            })?;
        }
    }
    let tls = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .context("TLS versions")?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let builder = hyper_rustls::HttpsConnectorBuilder::new();
    // hyper-rustls offers h2 by ALPN itself.
    let https = if http2 {
        builder
            .with_tls_config(tls)
            .https_or_http()
            .enable_http2()
            .build()
    } else {
        builder
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .build()
    };
    let mut b = Client::builder(TokioExecutor::new());
    if http2 {
        b.http2_only(true);
    }
    Ok(b.build(https))
}
