//! A loopback HTTPS server that answers like the Kubernetes API server's pod list: bearer token
//! checked, every request's path kept for the test to look at.
use std::{
    path::PathBuf,
    sync::{Arc, Mutex},
};

use crate::{
    guards::TempDir,
    tls::{Request, TlsServer},
};

/// The running server, with the token file cudatrace reads.
pub struct KubeApi {
    /// Its port on 127.0.0.1.
    pub port: u16,
    server: TlsServer,
    token: TempDir,
    body: Arc<Mutex<(u16, String)>>,
    want: String,
}

impl KubeApi {
    /// Serves `pod_list` (JSON) to requests bearing `token`, 401 to others.
    pub fn start(token: &str, pod_list: &str) -> KubeApi {
        let body = Arc::new(Mutex::new((200, pod_list.to_owned())));
        let want = format!("Bearer {token}");
        let (answer, expected) = (body.clone(), want.clone());
        let server = TlsServer::start(move |r: &Request| {
            if r.header("authorization") == Some(expected.as_str()) {
                answer.lock().unwrap().clone()
            } else {
                (401, "{}".to_owned())
            }
        });
        let dir = TempDir::new("kube-token");
        dir.write("token", &format!("{token}\n"));
        KubeApi {
            port: server.port,
            server,
            token: dir,
            body,
            want,
        }
    }

    /// From now on, answer `status` with `text` (to authorized requests).
    pub fn answer(&self, status: u16, text: &str) {
        *self.body.lock().unwrap() = (status, text.to_owned());
    }

    /// The requests so far: path and query, and whether it bore the token.
    pub fn requests(&self) -> Vec<(String, bool)> {
        self.server
            .requests()
            .into_iter()
            .map(|r| {
                (
                    r.target.clone(),
                    r.header("authorization") == Some(self.want.as_str()),
                )
            })
            .collect()
    }

    /// Its CA certificate (PEM) and token files.
    pub fn files(&self) -> (PathBuf, PathBuf) {
        (self.server.cert.pem(), self.token.join("token"))
    }
}

/// A `PodList` as the API server serves it: one running pod with one container, owned by the
/// StatefulSet its name says (`NAME-N`), or by none.
pub fn pod_list(
    namespace: &str,
    pod: &str,
    uid: &str,
    container: &str,
    container_id: &str,
) -> String {
    let owners = match pod.rsplit_once('-') {
        Some((set, n)) if n.parse::<u32>().is_ok() => serde_json::json!([
            {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": set, "uid": "s", "controller": true}
        ]),
        _ => serde_json::json!([]),
    };
    serde_json::json!({
        "kind": "PodList",
        "apiVersion": "v1",
        "metadata": {"resourceVersion": "4242"},
        "items": [{
            "metadata": {"name": pod, "namespace": namespace, "uid": uid, "labels": {"app": pod}, "ownerReferences": owners},
            "spec": {"nodeName": "gpu-node-7", "containers": [{"name": container, "image": "serving:1"}]},
            "status": {
                "phase": "Running",
                "containerStatuses": [{"name": container, "containerID": format!("containerd://{container_id}"), "ready": true, "restartCount": 0}]
            }
        }]
    })
    .to_string()
}
