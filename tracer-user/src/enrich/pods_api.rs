//! Fetches the node's pod list for [`super::pods`] on a thread of its own: from the API server
//! (pods with `spec.nodeName` this node, as the chart's ClusterRole allows: list pods) or from a
//! configured URL (the kubelet's `/pods`), over HTTPS with the service account's token. Every
//! `refresh_s`, sooner (at most every [`MIN_GAP`]) when a process's pod is not in the list, and
//! with growing delays after failures. Responses are bounded in time and size; what the agent
//! had stays when a fetch fails, and each new kind of failure is said once.
use std::{
    sync::{mpsc, Arc, Mutex},
    time::{Duration, Instant},
};

use super::pods::PodIndex;
use crate::config::KubernetesConfig;

/// The shortest time between two fetches.
pub const MIN_GAP: Duration = Duration::from_secs(5);
/// The largest pod list read: a node's pods with their status are far less.
pub const MAX_BODY: u64 = 16 << 20;
/// How long one fetch may take, connecting and reading the answer.
const TIMEOUT: Duration = Duration::from_secs(10);

/// Where and how pods are fetched.
#[derive(Clone, Debug)]
struct Target {
    url: String,
    token_file: std::path::PathBuf,
    ca_file: std::path::PathBuf,
    refresh: Duration,
}

/// The latest pod index and a way to ask for a sooner refresh; dropped, the thread ends.
pub struct PodNamesSource {
    index: Arc<Mutex<Arc<PodIndex>>>,
    wake: mpsc::SyncSender<()>,
}

impl PodNamesSource {
    /// The latest index (empty before the first fetch).
    pub fn index(&self) -> Arc<PodIndex> {
        self.index.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Asks for a fetch sooner than the refresh period (a process's pod is not listed yet).
    pub fn refresh_soon(&self) {
        let _ = self.wake.try_send(());
    }
}

/// A node name as Kubernetes allows it (a DNS subdomain), so that it is safe in a query.
fn node_name_ok(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

/// The pods URL: the configured one, else the in-cluster API server's pods on `NODE_NAME`.
/// `Ok(None)`: not asked for (no URL and not in a cluster).
fn target(
    cfg: &KubernetesConfig,
    var: impl Fn(&str) -> Option<String>,
) -> Result<Option<Target>, String> {
    let in_cluster = var("KUBERNETES_SERVICE_HOST").is_some();
    if !cfg
        .pod_names
        .unwrap_or(in_cluster || cfg.pods_url.is_some())
    {
        return Ok(None);
    }
    let url = match &cfg.pods_url {
        Some(url) => url.clone(),
        None => {
            let host = var("KUBERNETES_SERVICE_HOST").ok_or(
                "not in a cluster (KUBERNETES_SERVICE_HOST is unset) and no kubernetes.pods_url",
            )?;
            let port = var("KUBERNETES_SERVICE_PORT").unwrap_or_else(|| "443".into());
            let node = var("NODE_NAME").ok_or("NODE_NAME is unset: set it from the downward API (spec.nodeName), as the chart does")?;
            if !node_name_ok(&node) {
                return Err(format!(
                    "NODE_NAME {:?} is not a node name",
                    node.chars().take(64).collect::<String>()
                ));
            }
            let host = if host.contains(':') {
                format!("[{host}]")
            } else {
                host
            };
            format!("https://{host}:{port}/api/v1/pods?fieldSelector=spec.nodeName%3D{node}")
        }
    };
    Ok(Some(Target {
        url,
        token_file: cfg.token_file.clone(),
        ca_file: cfg.ca_file.clone(),
        refresh: Duration::from_secs(cfg.refresh_s),
    }))
}

/// Starts fetching when the config (or being in a cluster) asks for pod names; says in one line
/// why not when it cannot.
pub fn start(cfg: &KubernetesConfig) -> Option<PodNamesSource> {
    let target = match target(cfg, |k| std::env::var(k).ok()) {
        Ok(t) => t?,
        Err(why) => {
            log::warn!("cudatrace: pod names off: {why}; metrics keep pod UIDs and container ids");
            return None;
        }
    };
    let index = Arc::new(Mutex::new(Arc::new(PodIndex::default())));
    let (wake, woken) = mpsc::sync_channel(1);
    let shared = index.clone();
    let spawned = std::thread::Builder::new()
        .name("cudatrace-pods".into())
        .spawn(move || refresher(&target, &shared, &woken));
    if let Err(e) = spawned {
        log::warn!("cudatrace: pod names off: cannot start a thread ({e})");
        return None;
    }
    Some(PodNamesSource { index, wake })
}

/// Fetches until the source is dropped.
fn refresher(target: &Target, index: &Mutex<Arc<PodIndex>>, woken: &mpsc::Receiver<()>) {
    let mut said = String::new();
    let mut failures = 0u32;
    loop {
        let fetched_at = Instant::now();
        let wait = match fetch(target) {
            Ok((fresh, left_out)) => {
                if failures > 0 || said.is_empty() {
                    let more = if left_out > 0 {
                        format!(" ({left_out} more left out)")
                    } else {
                        String::new()
                    };
                    log::warn!(
                        "cudatrace: pod names: {} pods from {}{more}",
                        fresh.len(),
                        target.url
                    );
                    said = "ok".into();
                }
                failures = 0;
                *index.lock().unwrap_or_else(|e| e.into_inner()) = Arc::new(fresh);
                target.refresh
            }
            Err(why) => {
                if why != said {
                    log::warn!("cudatrace: pod names unavailable: {why}; metrics keep pod UIDs and container ids until it answers (retrying)");
                    said = why;
                }
                failures = failures.saturating_add(1);
                (MIN_GAP * 2u32.saturating_pow(failures - 1).min(64))
                    .min(target.refresh.max(MIN_GAP))
            }
        };
        match woken.recv_timeout(wait) {
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
            Ok(()) => std::thread::sleep(MIN_GAP.saturating_sub(fetched_at.elapsed())),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
    }
}

/// One fetch: the token and CA read anew (tokens are rotated), one bounded GET, the list parsed.
fn fetch(t: &Target) -> Result<(PodIndex, usize), String> {
    use ureq::tls::{RootCerts, TlsConfig};
    let token = std::fs::read_to_string(&t.token_file)
        .map_err(|e| format!("cannot read the service account token {} ({e}): mount it, or set kubernetes.pod_names = false", t.token_file.display()))?;
    let certs = crate::bounded::pem_certificates(&t.ca_file)?;
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(TIMEOUT))
        .http_status_as_error(false)
        .tls_config(
            TlsConfig::builder()
                .root_certs(RootCerts::new_with_certs(&certs))
                .build(),
        )
        .build()
        .into();
    let mut answer = agent
        .get(&t.url)
        .header("Authorization", format!("Bearer {}", token.trim()))
        .header("Accept", "application/json")
        .call()
        .map_err(|e| format!("{}: {e}", t.url))?;
    let status = answer.status();
    if status == 401 || status == 403 {
        return Err(format!("{} answered {status}: the service account needs `list` on pods (the chart's ClusterRole)", t.url));
    }
    if !status.is_success() {
        return Err(format!("{} answered {status}", t.url));
    }
    let body = crate::bounded::body(&mut answer, MAX_BODY, &t.url, "the pod list")?;
    PodIndex::parse(&body).map_err(|e| format!("{}: not a PodList: {e}", t.url))
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::text::fake_env as vars;

    #[test]
    fn in_cluster_url_from_the_environment() {
        let cfg = KubernetesConfig::default();
        let env = [
            ("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
            ("KUBERNETES_SERVICE_PORT", "443"),
            ("NODE_NAME", "gpu-node-7"),
        ];
        let t = target(&cfg, vars(&env)).unwrap().unwrap();
        assert_eq!(
            t.url,
            "https://10.0.0.1:443/api/v1/pods?fieldSelector=spec.nodeName%3Dgpu-node-7"
        );
        let v6 = [("KUBERNETES_SERVICE_HOST", "fd00::1"), ("NODE_NAME", "n")];
        assert_eq!(
            target(&cfg, vars(&v6)).unwrap().unwrap().url,
            "https://[fd00::1]:443/api/v1/pods?fieldSelector=spec.nodeName%3Dn"
        );
        // Outside a cluster, not asked for: off without a word.
        assert!(target(&cfg, vars(&[])).unwrap().is_none());
    }

    #[test]
    fn what_is_wrong_is_said() {
        let on = KubernetesConfig {
            pod_names: Some(true),
            ..Default::default()
        };
        assert!(target(&on, vars(&[]))
            .unwrap_err()
            .contains("KUBERNETES_SERVICE_HOST is unset"));
        let no_node = [("KUBERNETES_SERVICE_HOST", "10.0.0.1")];
        assert!(target(&on, vars(&no_node))
            .unwrap_err()
            .contains("NODE_NAME is unset"));
        let bad = [
            ("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
            ("NODE_NAME", "x&labelSelector=y"),
        ];
        assert!(target(&on, vars(&bad))
            .unwrap_err()
            .contains("is not a node name"));
        let off = KubernetesConfig {
            pod_names: Some(false),
            ..Default::default()
        };
        assert!(target(&off, vars(&bad)).unwrap().is_none());
    }
}
