//! `--web-config-file`: TLS and basic auth for the metrics server, in the format of the
//! Prometheus exporter-toolkit (what node_exporter reads), so the same file and the same
//! Prometheus `scrape_config` work for both:
//!
//! ```text
//! tls_server_config:
//!   cert_file: server.crt   # relative paths: to the web config file's folder
//!   key_file: server.key
//! basic_auth_users:
//!   prometheus: $2y$10$...  # bcrypt hashes (htpasswd -nBC 10 "" | tr -d ':\n')
//! ```
//!
//! Keys it does not implement are errors, not ignored. Checking a bcrypt hash costs tens of
//! milliseconds by design, so each client (see [`super::admission::Client`]) has one check at a
//! time and all together at most [`MAX_CHECKS`]: a client sending wrong passwords queues behind
//! itself, not in front of a scraper. An unknown user is checked against a hash of the users'
//! cost, so that the answer takes as long as for a known one with a wrong password (user names
//! do not leak by time). Passwords that matched are remembered (at most [`MAX_REMEMBERED`]).
use std::{
    collections::{HashMap, HashSet},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use anyhow::{bail, Context as _, Result};
use yaml_rust2::{Yaml, YamlLoader};

use super::admission::Client;

/// Authorization headers remembered as good, at most.
const MAX_REMEMBERED: usize = 64;
/// bcrypt checks running at once, at most (each takes a core for tens of milliseconds).
pub const MAX_CHECKS: usize = 4;

/// TLS and users for the metrics server.
pub struct WebConfig {
    /// TLS, when `tls_server_config` is given.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Basic auth, when `basic_auth_users` is given.
    pub auth: Option<BasicAuth>,
}

/// Users and their bcrypt hashes, and headers that passed.
pub struct BasicAuth {
    users: HashMap<String, String>,
    /// A hash of the users' highest cost, checked for unknown users.
    decoy: String,
    passed: Mutex<HashSet<String>>,
    /// Each client's turn to check, while it has checks waiting.
    turns: Mutex<HashMap<Client, Arc<tokio::sync::Mutex<()>>>>,
    checks: tokio::sync::Semaphore,
}

fn text<'a>(y: &'a Yaml, what: &str) -> Result<&'a str> {
    y.as_str().with_context(|| format!("{what}: give a string"))
}

/// Reads and checks a web config file; errors say which key and what to do.
pub fn load(path: &Path) -> Result<WebConfig> {
    let body = std::fs::read_to_string(path)
        .with_context(|| format!("bad web config {}: cannot read it", path.display()))?;
    parse(&body, path.parent().unwrap_or(Path::new(".")))
        .with_context(|| format!("bad web config {}", path.display()))
}

fn parse(body: &str, dir: &Path) -> Result<WebConfig> {
    let docs = YamlLoader::load_from_str(body).map_err(|e| anyhow::anyhow!("not YAML: {e}"))?;
    let root = docs
        .into_iter()
        .next()
        .unwrap_or(Yaml::Hash(Default::default()));
    let Some(map) = root.as_hash() else {
        bail!("give a YAML mapping of tls_server_config and basic_auth_users")
    };
    let mut config = WebConfig {
        tls: None,
        auth: None,
    };
    for (key, value) in map {
        match key.as_str() {
            Some("tls_server_config") => config.tls = Some(tls(value, dir)?),
            Some("basic_auth_users") => {
                let users = value
                    .as_hash()
                    .context("basic_auth_users: give a mapping of user names to bcrypt hashes")?;
                let mut out = HashMap::new();
                for (u, h) in users {
                    let (u, h) = (
                        text(u, "a basic_auth_users name")?,
                        text(h, "a basic_auth_users hash")?,
                    );
                    if !h.starts_with("$2") {
                        bail!("basic_auth_users.{u}: not a bcrypt hash (make one with `htpasswd -nBC 10 \"\" | tr -d ':\\n'`)");
                    }
                    out.insert(u.to_owned(), h.to_owned());
                }
                let cost = out
                    .values()
                    .filter_map(|h| h.get(4..6)?.parse::<u32>().ok())
                    .max()
                    .unwrap_or(bcrypt::DEFAULT_COST);
                let decoy = bcrypt::hash("cudatrace-decoy", cost.clamp(4, 31))
                    .context("basic_auth_users: cannot make a bcrypt hash of their cost")?;
                config.auth = Some(BasicAuth {
                    users: out,
                    decoy,
                    passed: Mutex::new(HashSet::new()),
                    turns: Mutex::new(HashMap::new()),
                    checks: tokio::sync::Semaphore::new(MAX_CHECKS),
                });
            }
            Some(other) => {
                bail!("{other}: not supported (tls_server_config and basic_auth_users are)")
            }
            None => bail!("keys must be strings"),
        }
    }
    Ok(config)
}

fn tls(y: &Yaml, dir: &Path) -> Result<Arc<rustls::ServerConfig>> {
    use rustls::pki_types::{pem::PemObject as _, CertificateDer, PrivateKeyDer};
    let map = y
        .as_hash()
        .context("tls_server_config: give cert_file and key_file")?;
    let (mut cert, mut key) = (None, None);
    for (k, v) in map {
        let file = |what| -> Result<PathBuf> { Ok(dir.join(text(v, what)?)) };
        match k.as_str() {
            Some("cert_file") => cert = Some(file("tls_server_config.cert_file")?),
            Some("key_file") => key = Some(file("tls_server_config.key_file")?),
            Some(other) => {
                bail!("tls_server_config.{other}: not supported (cert_file and key_file are)")
            }
            None => bail!("keys must be strings"),
        }
    }
    let (Some(cert), Some(key)) = (cert, key) else {
        bail!("tls_server_config: give both cert_file and key_file")
    };
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&cert)
        .and_then(|certs| certs.collect::<Result<_, _>>())
        .map_err(|e| anyhow::anyhow!("tls_server_config.cert_file {}: {e}", cert.display()))?;
    if chain.is_empty() {
        bail!(
            "tls_server_config.cert_file {}: no certificate in it",
            cert.display()
        );
    }
    let private = PrivateKeyDer::from_pem_file(&key)
        .map_err(|e| anyhow::anyhow!("tls_server_config.key_file {}: {e}", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS versions")?
        .with_no_client_auth()
        .with_single_cert(chain, private)
        .map_err(|e| {
            anyhow::anyhow!("tls_server_config: the key does not fit the certificate: {e}")
        })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

impl BasicAuth {
    /// Whether an `Authorization` header names a user with the right password; `client` sent
    /// it.
    pub async fn allows(&self, header: Option<&str>, client: Client) -> bool {
        let Some(given) = header.and_then(|h| h.strip_prefix("Basic ")).map(str::trim) else {
            return false;
        };
        if self
            .passed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(given)
        {
            return true;
        }
        use base64::Engine as _;
        let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(given) else {
            return false;
        };
        let Ok(pair) = String::from_utf8(decoded) else {
            return false;
        };
        let Some((user, password)) = pair.split_once(':') else {
            return false;
        };
        let (hash, known) = match self.users.get(user) {
            Some(h) => (h.clone(), true),
            None => (self.decoy.clone(), false),
        };
        let password = password.to_owned();
        let turn = self
            .turns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(client)
            .or_default()
            .clone();
        let ok = {
            let _my_turn = turn.lock().await;
            let _a_core = self.checks.acquire().await;
            tokio::task::spawn_blocking(move || bcrypt::verify(password, &hash).unwrap_or(false))
                .await
                .unwrap_or(false)
        };
        {
            // The client's turn goes once nobody waits on it (the map holds only waiting clients).
            let mut turns = self.turns.lock().unwrap_or_else(|e| e.into_inner());
            drop(turn);
            if turns
                .get(&client)
                .is_some_and(|t| Arc::strong_count(t) == 1)
            {
                turns.remove(&client);
            }
        }
        let ok = ok && known;
        if ok {
            let mut passed = self.passed.lock().unwrap_or_else(|e| e.into_inner());
            if passed.len() >= MAX_REMEMBERED {
                passed.clear();
            }
            passed.insert(given.to_owned());
        }
        ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_keys_and_bad_hashes_are_errors() {
        let dir = Path::new("/nonexistent");
        assert!(parse("{}", dir).unwrap().tls.is_none());
        let e = |s: &str| format!("{:#}", parse(s, dir).err().unwrap());
        assert_eq!(
            e("http_server_config: {}"),
            "http_server_config: not supported (tls_server_config and basic_auth_users are)"
        );
        assert!(e("basic_auth_users:\n  a: plain\n").contains("not a bcrypt hash"));
        assert!(e("tls_server_config:\n  cert_file: a.crt\n")
            .contains("give both cert_file and key_file"));
        assert!(
            e("tls_server_config:\n  cert_file: a.crt\n  key_file: a.key\n")
                .contains("/nonexistent/a.crt")
        );
        assert!(e("tls_server_config:\n  client_ca_file: x\n")
            .contains("client_ca_file: not supported"));
    }

    #[tokio::test]
    async fn basic_auth_checks_bcrypt_and_remembers() {
        let hash = bcrypt::hash("s3cret", 4).unwrap();
        let c = parse(
            &format!("basic_auth_users:\n  prom: '{hash}'\n"),
            Path::new("."),
        )
        .unwrap();
        let auth = c.auth.unwrap();
        let me = Client::of("10.0.0.1".parse().unwrap());
        use base64::Engine as _;
        let header = |s: &str| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(s)
            )
        };
        assert!(auth.allows(Some(&header("prom:s3cret")), me).await);
        assert!(
            auth.allows(Some(&header("prom:s3cret")), me).await,
            "remembered"
        );
        assert!(!auth.allows(Some(&header("prom:wrong")), me).await);
        assert!(!auth.allows(Some(&header("nobody:s3cret")), me).await);
        assert!(!auth.allows(Some("Bearer x"), me).await);
        assert!(!auth.allows(None, me).await);
        assert!(auth.turns.lock().unwrap().is_empty());
        assert!(auth.decoy.starts_with("$2b$04$"), "the users' cost");
    }
}
