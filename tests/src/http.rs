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

/// A TCP connection to `listen` (`ADDR:PORT`) from the local address `from` (another loopback
/// address is another client to the server).
pub fn connect_from(listen: &str, from: &str) -> std::io::Result<std::net::TcpStream> {
    use socket2::{Domain, Socket, Type};
    let to: std::net::SocketAddr = listen.parse().expect("ADDR:PORT");
    let socket = Socket::new(Domain::for_address(to), Type::STREAM, None)?;
    let local: std::net::SocketAddr = format!("{from}:0").parse().expect("an IP address");
    socket.bind(&local.into())?;
    socket.connect_timeout(&to.into(), Duration::from_secs(5))?;
    Ok(socket.into())
}

/// One HTTP/1.1 GET of `path` on an open connection (kept alive unless `close`), with basic
/// auth `user:password` if given: the status and the body, or what went wrong.
pub fn get_on(
    stream: &mut std::net::TcpStream,
    path: &str,
    auth: Option<&str>,
    close: bool,
) -> Result<(u16, String), String> {
    use std::io::{BufRead as _, BufReader, Read as _, Write as _};
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    let mut req = format!("GET {path} HTTP/1.1\r\nHost: cudatrace\r\n");
    if let Some(a) = auth {
        use base64::Engine as _;
        let token = base64::engine::general_purpose::STANDARD.encode(a);
        req += &format!("Authorization: Basic {token}\r\n");
    }
    if close {
        req += "Connection: close\r\n";
    }
    req += "\r\n";
    stream
        .write_all(req.as_bytes())
        .map_err(|e| e.to_string())?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    if reader.read_line(&mut line).map_err(|e| e.to_string())? == 0 {
        return Err("closed before an answer".into());
    }
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("not HTTP: {line:?}"))?;
    let mut length = 0usize;
    loop {
        line.clear();
        reader.read_line(&mut line).map_err(|e| e.to_string())?;
        if line.trim_end().is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                length = v
                    .trim()
                    .parse()
                    .map_err(|_| format!("bad length: {line:?}"))?;
            }
        }
    }
    let mut body = vec![0u8; length];
    reader.read_exact(&mut body).map_err(|e| e.to_string())?;
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// `/metrics` fetched from the local address `from`, on a connection of its own.
pub fn scrape_from(listen: &str, from: &str, auth: Option<&str>) -> Result<(u16, String), String> {
    let mut s = connect_from(listen, from).map_err(|e| e.to_string())?;
    get_on(&mut s, "/metrics", auth, true)
}
