//! Real servers on loopback the tests talk to: Prometheus, Alertmanager (Debian's packages), and
//! a webhook receiver.
use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::{free_port, guards::TempDir, http, poll};

/// A server program on a free loopback port, with its own temporary folder holding its config
/// file; killed and cleaned up when dropped.
pub struct Server {
    child: Child,
    /// Its port.
    pub port: u16,
    _dir: TempDir,
}

impl Server {
    /// Writes `config` to `config_name` in a new folder and starts `program` with
    /// `args(config path, folder, port)`; `package` names what to install when it is missing.
    pub fn start(
        program: &str,
        package: &str,
        config_name: &str,
        config: &str,
        args: impl Fn(&Path, &Path, u16) -> Vec<String>,
    ) -> Server {
        Self::start_prepared(program, package, config_name, config, |_| {}, args)
    }

    /// As [`Server::start`], with `prepare(folder)` run before the program starts.
    pub fn start_prepared(
        program: &str,
        package: &str,
        config_name: &str,
        config: &str,
        prepare: impl FnOnce(&Path),
        args: impl Fn(&Path, &Path, u16) -> Vec<String>,
    ) -> Server {
        let dir = TempDir::new(program);
        let path = dir.write(config_name, config);
        prepare(dir.path());
        let port = free_port();
        let child = Command::new(program)
            .args(args(&path, dir.path(), port))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {program} ({e}): the Debian package {package} is needed; scripts/setup.sh installs it"));
        Server {
            child,
            port,
            _dir: dir,
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A real Prometheus scraping one target every second.
pub struct Prometheus(Server);

impl Prometheus {
    /// Starts it, scraping `127.0.0.1:target`.
    pub fn start(target: u16) -> Prometheus {
        Self::start_scraping(&format!("  - job_name: cudatrace\n    static_configs:\n      - targets: ['127.0.0.1:{target}']\n"))
    }

    /// Starts it with these `scrape_configs` entries (YAML, indented two spaces), every second.
    pub fn start_scraping(scrape_configs: &str) -> Prometheus {
        Self::start_with(scrape_configs, None, None)
    }

    /// Starts it with these `scrape_configs`, evaluating the rules of `rule_file` every second,
    /// with `history` (OpenMetrics text with timestamps, `# EOF` at the end) backfilled into
    /// its storage by `promtool tsdb create-blocks-from openmetrics` first.
    pub fn start_with(
        scrape_configs: &str,
        rule_file: Option<&Path>,
        history: Option<&str>,
    ) -> Prometheus {
        let rules = rule_file
            .map(|f| format!("rule_files: ['{}']\n", f.display()))
            .unwrap_or_default();
        let config = format!("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n{rules}scrape_configs:\n{scrape_configs}");
        let prepare = |dir: &Path| {
            let Some(text) = history else { return };
            let input = dir.join("history.om");
            std::fs::write(&input, text).unwrap();
            let out = Command::new("promtool")
                .args(["tsdb", "create-blocks-from", "openmetrics"])
                .arg(&input)
                .arg(dir.join("data"))
                .output()
                .expect("promtool (Debian package prometheus) is needed");
            assert!(
                out.status.success(),
                "promtool backfill: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        };
        Prometheus(Server::start_prepared(
            "prometheus",
            "prometheus",
            "prometheus.yml",
            &config,
            prepare,
            |config, dir, port| {
                vec![
                    format!("--config.file={}", config.display()),
                    format!("--storage.tsdb.path={}", dir.join("data").display()),
                    format!("--web.listen-address=127.0.0.1:{port}"),
                ]
            },
        ))
    }

    /// Its base URL.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.0.port)
    }

    /// Waits (up to 60 s) until it answers `/-/ready`; panics past that.
    pub fn wait_ready(&self) {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(60) {
            if http::try_get(&format!("{}/-/ready", self.url()), None).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!("Prometheus not ready within 60 s");
    }

    /// The label sets of the series `selector` matches (`/api/v1/series`).
    pub fn series(&self, selector: &str) -> Vec<Value> {
        let url = format!("http://127.0.0.1:{}/api/v1/series", self.0.port);
        http::post_form_json(&url, &[("match[]", selector)])
            .ok()
            .and_then(|v| v["data"].as_array().cloned())
            .unwrap_or_default()
    }

    /// Instant query; returns (labels, value) per sample (none while it does not answer).
    pub fn query(&self, promql: &str) -> Vec<(Value, f64)> {
        let url = format!("http://127.0.0.1:{}/api/v1/query", self.0.port);
        let Ok(v) = http::post_form_json(&url, &[("query", promql)]) else {
            return Vec::new();
        };
        v["data"]["result"]
            .as_array()
            .map(|r| {
                r.iter()
                    .map(|s| {
                        (
                            s["metric"].clone(),
                            s["value"][1].as_str().unwrap().parse().unwrap(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Waits (up to 30 s) until the query returns exactly `want` as its single value; returns
    /// the last value seen.
    pub fn wait_for(&self, promql: &str, want: f64) -> f64 {
        let start = Instant::now();
        let mut last = f64::NAN;
        while start.elapsed() < Duration::from_secs(30) {
            if let [(_, v)] = self.query(promql).as_slice() {
                last = *v;
                if last == want {
                    return last;
                }
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        last
    }
}

/// A real Alertmanager (Debian's prometheus-alertmanager) on loopback.
pub struct Alertmanager {
    server: Server,
    /// With a web config: the CA to trust, and the user and password to send.
    secure: Option<(PathBuf, String, String)>,
}

impl Alertmanager {
    /// Starts it with one receiver that drops everything, and waits until it answers.
    pub fn start() -> Alertmanager {
        Self::start_with(None)
    }

    /// Starts it with this configuration file's text, and waits until it answers.
    pub fn start_config(config: &str) -> Alertmanager {
        let server = Server::start(
            "prometheus-alertmanager",
            "prometheus-alertmanager",
            "alertmanager.yml",
            config,
            |config, dir, port| {
                vec![
                    format!("--config.file={}", config.display()),
                    format!("--storage.path={}", dir.join("data").display()),
                    format!("--web.listen-address=127.0.0.1:{port}"),
                    "--cluster.listen-address=".into(),
                ]
            },
        );
        let am = Alertmanager {
            server,
            secure: None,
        };
        assert!(
            poll(Duration::from_secs(30), || am.alerts()).is_some(),
            "Alertmanager did not answer within 30 s"
        );
        am
    }

    /// Its alert groups (`/api/v2/alerts/groups`), as its route grouped them.
    pub fn groups(&self) -> Vec<Value> {
        http::get_json(&format!("{}/api/v2/alerts/groups", self.url()))
            .ok()
            .and_then(|v| v.as_array().cloned())
            .unwrap_or_default()
    }

    /// Starts it serving TLS with `cert` and asking basic auth of `user` with `password` (its
    /// `--web.config.file`, the exporter-toolkit format), and waits until it answers.
    pub fn start_secure(
        cert: &crate::tls::Certificate,
        user: &str,
        password: &str,
    ) -> Alertmanager {
        let hash = bcrypt::hash(password, 10).expect("bcrypt");
        let web = format!(
            "tls_server_config:\n  cert_file: {}\n  key_file: {}\nbasic_auth_users:\n  {user}: '{hash}'\n",
            cert.pem().display(),
            cert.key_pem().display()
        );
        let file = cert.dir.write("alertmanager-web.yml", &web);
        Self::start_with(Some((
            file,
            (cert.pem(), user.to_owned(), password.to_owned()),
        )))
    }

    fn start_with(secure: Option<(PathBuf, (PathBuf, String, String))>) -> Alertmanager {
        let config = "route:\n  receiver: none\n  group_wait: 1s\nreceivers:\n  - name: none\n";
        let web = secure
            .as_ref()
            .map(|(file, _)| format!("--web.config.file={}", file.display()));
        let server = Server::start(
            "prometheus-alertmanager",
            "prometheus-alertmanager",
            "alertmanager.yml",
            config,
            |config, dir, port| {
                let mut args = vec![
                    format!("--config.file={}", config.display()),
                    format!("--storage.path={}", dir.join("data").display()),
                    format!("--web.listen-address=127.0.0.1:{port}"),
                    "--cluster.listen-address=".into(),
                ];
                args.extend(web.clone());
                args
            },
        );
        let am = Alertmanager {
            server,
            secure: secure.map(|(_, s)| s),
        };
        assert!(
            poll(Duration::from_secs(30), || am.alerts()).is_some(),
            "Alertmanager did not answer within 30 s"
        );
        am
    }

    /// Its base URL.
    pub fn url(&self) -> String {
        let scheme = if self.secure.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://127.0.0.1:{}", self.server.port)
    }

    /// The alerts its API lists (active ones), or None while it does not answer.
    pub fn alerts(&self) -> Option<Vec<Value>> {
        let url = format!("{}/api/v2/alerts", self.url());
        let listed = match &self.secure {
            Some((ca, user, password)) => http::get_json_tls(&url, ca, user, password),
            None => http::get_json(&url),
        };
        listed.ok()?.as_array().cloned()
    }

    /// Waits (up to 15 s) until `pred` holds for the listed alerts; returns the last listing.
    pub fn wait_until(&self, pred: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let mut last = Vec::new();
        poll(Duration::from_secs(15), || {
            last = self.alerts().unwrap_or_default();
            pred(&last).then_some(())
        });
        last
    }
}

/// A webhook receiver on loopback: answers 200 to every POST and keeps the JSON bodies.
pub struct Webhook {
    /// Its port.
    pub port: u16,
    bodies: Arc<Mutex<Vec<Value>>>,
}

impl Webhook {
    /// Starts listening.
    pub fn start() -> Webhook {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let keep = bodies.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().map_while(Result::ok) {
                let keep = keep.clone();
                std::thread::spawn(move || serve_http(stream, &keep));
            }
        });
        Webhook { port, bodies }
    }

    /// The bodies received so far.
    pub fn received(&self) -> Vec<Value> {
        self.bodies.lock().unwrap().clone()
    }

    /// Waits (up to `limit`) for a body for which `pred` holds.
    pub fn wait_for(&self, limit: Duration, pred: impl Fn(&Value) -> bool) -> Option<Value> {
        poll(limit, || self.received().into_iter().find(|v| pred(v)))
    }
}

/// HTTP/1.1 requests on one connection (keep-alive), each body parsed as JSON.
fn serve_http(stream: std::net::TcpStream, bodies: &Mutex<Vec<Value>>) {
    use std::io::{BufReader, Write as _};
    let mut writer = stream.try_clone().unwrap();
    let mut reader = BufReader::new(stream);
    while let Some(request) = crate::tls::read_request(&mut reader) {
        let body = &request.body;
        let value = serde_json::from_slice(body).unwrap_or_else(|e| {
            panic!(
                "webhook body is not JSON ({e}): {}",
                String::from_utf8_lossy(body)
            )
        });
        bodies.lock().unwrap().push(value);
        if writer
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
            .is_err()
        {
            return;
        }
    }
}
