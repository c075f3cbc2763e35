//! A loopback HTTPS server that answers like the Kubernetes API server's pod list: a
//! self-signed certificate for 127.0.0.1 (its PEM written for cudatrace's `ca_file`), bearer
//! token checked, every request's path kept for the test to look at.
use std::{
    io::{Read, Write},
    net::TcpListener,
    path::PathBuf,
    sync::{Arc, Mutex},
};

use crate::guards::TempDir;

/// What one request asked for.
#[derive(Clone, Debug)]
pub struct Request {
    /// Path and query.
    pub target: String,
    /// Whether it carried the right bearer token.
    pub authorized: bool,
}

/// The running server; stops accepting when dropped (its thread is left blocked in accept).
pub struct KubeApi {
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// Folder holding `ca.crt` and `token`.
    pub dir: TempDir,
    requests: Arc<Mutex<Vec<Request>>>,
    body: Arc<Mutex<(u16, String)>>,
}

impl KubeApi {
    /// Serves `pod_list` (JSON) to requests bearing `token`, 401 to others.
    pub fn start(token: &str, pod_list: &str) -> KubeApi {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let key = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()]).expect("certificate");
        let dir = TempDir::new("kube-api");
        dir.write("ca.crt", &key.cert.pem());
        dir.write("token", &format!("{token}\n"));
        let certs = vec![key.cert.der().clone()];
        let private = rustls::pki_types::PrivateKeyDer::Pkcs8(key.signing_key.serialize_der().into());
        let config = Arc::new(rustls::ServerConfig::builder().with_no_client_auth().with_single_cert(certs, private).expect("server config"));
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let body = Arc::new(Mutex::new((200, pod_list.to_owned())));
        let (seen, answer, want) = (requests.clone(), body.clone(), format!("bearer {token}"));
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let _ = stream.set_read_timeout(Some(std::time::Duration::from_secs(5)));
                let Ok(conn) = rustls::ServerConnection::new(config.clone()) else { continue };
                let mut tls = rustls::StreamOwned::new(conn, stream);
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && head.len() < 16384 && tls.read(&mut byte).unwrap_or(0) == 1 {
                    head.push(byte[0]);
                }
                let head = String::from_utf8_lossy(&head).into_owned();
                let target = head.split_whitespace().nth(1).unwrap_or_default().to_owned();
                let authorized = head.lines().any(|l| l.to_ascii_lowercase().strip_prefix("authorization: ").is_some_and(|v| v.trim() == want));
                seen.lock().unwrap().push(Request { target, authorized });
                let (status, text) = if authorized { answer.lock().unwrap().clone() } else { (401, "{}".to_owned()) };
                let reply = format!(
                    "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{text}",
                    text.len()
                );
                let _ = tls.write_all(reply.as_bytes());
                let _ = tls.flush();
                tls.conn.send_close_notify();
                let _ = tls.flush();
            }
        });
        KubeApi { port, dir, requests, body }
    }

    /// From now on, answer `status` with `text` (to authorized requests).
    pub fn answer(&self, status: u16, text: &str) {
        *self.body.lock().unwrap() = (status, text.to_owned());
    }

    /// The requests so far.
    pub fn requests(&self) -> Vec<Request> {
        self.requests.lock().unwrap().clone()
    }

    /// Its CA certificate (PEM) and token files.
    pub fn files(&self) -> (PathBuf, PathBuf) {
        (self.dir.join("ca.crt"), self.dir.join("token"))
    }
}

/// A `PodList` as the API server serves it: one running pod with one container.
pub fn pod_list(namespace: &str, pod: &str, uid: &str, container: &str, container_id: &str) -> String {
    serde_json::json!({
        "kind": "PodList",
        "apiVersion": "v1",
        "metadata": {"resourceVersion": "4242"},
        "items": [{
            "metadata": {"name": pod, "namespace": namespace, "uid": uid, "labels": {"app": pod}},
            "spec": {"nodeName": "gpu-node-7", "containers": [{"name": container, "image": "serving:1"}]},
            "status": {
                "phase": "Running",
                "containerStatuses": [{"name": container, "containerID": format!("containerd://{container_id}"), "ready": true, "restartCount": 0}]
            }
        }]
    })
    .to_string()
}
