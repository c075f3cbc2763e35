//! A loopback HTTPS server for the tests: a self-signed certificate for 127.0.0.1 (its PEM in
//! a file for the client's CA), every request kept, each answered by the test's closure.
use std::{
    io::{BufReader, Write as _},
    net::TcpListener,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use crate::guards::TempDir;

/// One request as received.
#[derive(Clone, Debug)]
pub struct Request {
    /// Path and query.
    pub target: String,
    /// Headers, names lower-cased.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

impl Request {
    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A certificate for 127.0.0.1 and its key, as PEM files in a folder of their own.
pub struct Certificate {
    /// Holds `cert.pem` and `key.pem`.
    pub dir: TempDir,
    /// The certificate in DER, for a server config.
    pub der: rustls::pki_types::CertificateDer<'static>,
    /// The key in DER.
    pub key: Vec<u8>,
}

impl Certificate {
    /// A new self-signed certificate for 127.0.0.1.
    pub fn new() -> Certificate {
        let made =
            rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()]).expect("certificate");
        let dir = TempDir::new("tls");
        dir.write("cert.pem", &made.cert.pem());
        dir.write("key.pem", &made.signing_key.serialize_pem());
        Certificate {
            dir,
            der: made.cert.der().clone(),
            key: made.signing_key.serialize_der(),
        }
    }

    /// The certificate's PEM file (also the CA a client trusts).
    pub fn pem(&self) -> PathBuf {
        self.dir.join("cert.pem")
    }

    /// The key's PEM file.
    pub fn key_pem(&self) -> PathBuf {
        self.dir.join("key.pem")
    }
}

impl Default for Certificate {
    fn default() -> Self {
        Self::new()
    }
}

type Answer = dyn Fn(&Request) -> (u16, String) + Send + Sync;

/// The running server; its thread is left blocked in accept when it is dropped.
pub struct TlsServer {
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// Its certificate.
    pub cert: Certificate,
    requests: Arc<Mutex<Vec<Request>>>,
}

impl TlsServer {
    /// Serves every request with `answer` (status, JSON body), one request per connection.
    pub fn start(answer: impl Fn(&Request) -> (u16, String) + Send + Sync + 'static) -> TlsServer {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let cert = Certificate::new();
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(cert.key.clone().into());
        let config = Arc::new(
            rustls::ServerConfig::builder()
                .with_no_client_auth()
                .with_single_cert(vec![cert.der.clone()], key)
                .expect("server config"),
        );
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let (kept, answer): (_, Arc<Answer>) = (requests.clone(), Arc::new(answer));
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (config, kept, answer) = (config.clone(), kept.clone(), answer.clone());
                std::thread::spawn(move || {
                    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
                    let Ok(conn) = rustls::ServerConnection::new(config) else {
                        return;
                    };
                    let mut tls = BufReader::new(rustls::StreamOwned::new(conn, stream));
                    let Some(request) = read_request(&mut tls) else {
                        return;
                    };
                    let (status, text) = answer(&request);
                    kept.lock().unwrap().push(request);
                    let reply = format!(
                        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{text}",
                        text.len()
                    );
                    let tls = tls.get_mut();
                    let _ = tls.write_all(reply.as_bytes());
                    tls.conn.send_close_notify();
                    let _ = tls.flush();
                });
            }
        });
        TlsServer {
            port,
            cert,
            requests,
        }
    }

    /// The requests so far.
    pub fn requests(&self) -> Vec<Request> {
        self.requests.lock().unwrap().clone()
    }
}

/// One HTTP/1.1 request (head, then a body of its content-length, at most 1 MiB); `None` at the
/// end of the stream or on a malformed request.
pub(crate) fn read_request(r: &mut impl std::io::BufRead) -> Option<Request> {
    let mut line = String::new();
    r.read_line(&mut line).ok()?;
    let target = line.split_whitespace().nth(1)?.to_owned();
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if r.read_line(&mut h).ok()? == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((n, v)) = h.split_once(':') {
            headers.push((n.trim().to_ascii_lowercase(), v.trim().to_owned()));
        }
    }
    let length: usize = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; length.min(1 << 20)];
    r.read_exact(&mut body).ok()?;
    Some(Request {
        target,
        headers,
        body,
    })
}
