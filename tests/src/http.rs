//! HTTP on loopback for the tests (ureq; TLS only where a test gives its CA), with a timeout on
//! every request.
use std::time::Duration;

use serde_json::Value;

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into()
}

/// GETs `url` (with `accept` as the Accept header); panics unless it answers 2xx.
pub fn get(url: &str, accept: Option<&str>) -> String {
    try_get(url, accept).unwrap_or_else(|e| panic!("GET {url} failed: {e}"))
}

/// GETs `url`; the body, or what went wrong.
pub fn try_get(url: &str, accept: Option<&str>) -> Result<String, String> {
    let mut req = agent().get(url);
    if let Some(a) = accept {
        req = req.header("Accept", a);
    }
    let mut resp = req.call().map_err(|e| e.to_string())?;
    resp.body_mut().read_to_string().map_err(|e| e.to_string())
}

/// GETs `url` and parses the body as JSON.
pub fn get_json(url: &str) -> Result<Value, String> {
    let text = try_get(url, None)?;
    serde_json::from_str(&text).map_err(|e| format!("not JSON ({e}): {text}"))
}

/// POSTs a form to `url` and parses the answer as JSON.
pub fn post_form_json(url: &str, form: &[(&str, &str)]) -> Result<Value, String> {
    let mut resp = agent()
        .post(url)
        .send_form(form.iter().copied())
        .map_err(|e| e.to_string())?;
    let text = resp
        .body_mut()
        .read_to_string()
        .map_err(|e| e.to_string())?;
    serde_json::from_str(&text).map_err(|e| format!("not JSON ({e}): {text}"))
}

/// The `/metrics` text of a daemon listening on `listen` (`ADDR:PORT`).
pub fn scrape(listen: &str) -> String {
    get(&format!("http://{listen}/metrics"), None)
}

/// GETs `url` over TLS trusting only the certificate in `ca` (PEM), with basic auth `user`,
/// `password`, and parses the body as JSON.
pub fn get_json_tls(
    url: &str,
    ca: &std::path::Path,
    user: &str,
    password: &str,
) -> Result<Value, String> {
    use base64::Engine as _;
    use ureq::tls::{Certificate, RootCerts, TlsConfig};
    let pem = std::fs::read(ca).map_err(|e| e.to_string())?;
    let cert = Certificate::from_pem(&pem).map_err(|e| e.to_string())?;
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(10)))
        .tls_config(
            TlsConfig::builder()
                .root_certs(RootCerts::new_with_certs(&[cert]))
                .build(),
        )
        .build()
        .into();
    let auth = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
    );
    let mut resp = agent
        .get(url)
        .header("Authorization", auth)
        .call()
        .map_err(|e| e.to_string())?;
    let text = resp
        .body_mut()
        .read_to_string()
        .map_err(|e| e.to_string())?;
    serde_json::from_str(&text).map_err(|e| format!("not JSON ({e}): {text}"))
}
