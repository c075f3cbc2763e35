//! End-to-end: the chart's default metrics door is locked (finding 10 of the third tenant
//! review: metrics were plain HTTP without auth, so any pod read every tenant's pod names,
//! comms and kernel names). Rendered with defaults, the chart makes a certificate for the
//! service's name and a password, and the monitors scrape with them: cudatrace run with the
//! rendered web config refuses a scrape without the password (401 over TLS; plain HTTP is not
//! answered), and a real Prometheus configured as the ServiceMonitor is (CA, server name, user
//! and password from the scrape Secret) counts every launch.
use std::process::Command;

use base64::Engine as _;
use integration_tests::{
    chart, device_file, env, guards::TempDir, http, servers::Prometheus, Cudatrace, Scenario,
    Workload,
};
use yaml_rust2::Yaml;

/// The Secret named `name`'s `key`, decoded.
fn secret(docs: &[Yaml], name: &str, key: &str) -> String {
    let s = docs
        .iter()
        .find(|d| {
            d["kind"].as_str() == Some("Secret") && d["metadata"]["name"].as_str() == Some(name)
        })
        .unwrap_or_else(|| panic!("no Secret {name}"));
    let b = base64::engine::general_purpose::STANDARD
        .decode(s["data"][key].as_str().unwrap())
        .unwrap();
    String::from_utf8(b).unwrap()
}

#[test]
fn the_charts_default_metrics_refuse_an_unauthenticated_scrape() {
    let Some(env) = env() else { return };
    let (_, docs) = chart::render(&[]);
    let name = chart::object(&docs, "DaemonSet")["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    let ns = chart::object(&docs, "DaemonSet")["metadata"]["namespace"]
        .as_str()
        .unwrap_or("default")
        .to_owned();
    let (web, scrape) = (format!("{name}-web"), format!("{name}-scrape"));
    let dir = TempDir::new("chart-auth");
    dir.write("tls.crt", &secret(&docs, &web, "tls.crt"));
    dir.write("tls.key", &secret(&docs, &web, "tls.key"));
    let ca = dir.write("ca.crt", &secret(&docs, &scrape, "ca.crt"));
    // The web config names the files where the pod mounts them; here they sit beside it.
    let config = secret(&docs, &web, "web.yml").replace("/etc/cudatrace/web/", "");
    let config = dir.write("web.yml", &config);
    let (user, password) = (
        secret(&docs, &scrape, "username"),
        secret(&docs, &scrape, "password"),
    );
    let (daemon, listen) = Cudatrace::start_daemon_on_loopback(
        &env,
        &["--web-config-file", config.to_str().unwrap()],
        &[],
    );
    let anonymous = Command::new("curl")
        .args(["-sk", "-o", "/dev/null", "-w", "%{http_code}"])
        .arg(format!("https://{listen}/metrics"))
        .output()
        .expect("curl");
    let anonymous = String::from_utf8_lossy(&anonymous.stdout).into_owned();
    let plain = http::try_get(&format!("http://{listen}/metrics"), None);
    // Prometheus as the chart's ServiceMonitor configures it.
    let server_name = format!("{name}.{ns}.svc");
    let job = |job: &str, auth: &str| {
        format!(
            "  - job_name: {job}\n    scheme: https\n    tls_config:\n      ca_file: {}\n      server_name: {server_name}\n{auth}    static_configs:\n      - targets: ['{listen}']\n",
            ca.display()
        )
    };
    let auth = format!("    basic_auth:\n      username: {user}\n      password: {password}\n");
    let prometheus = Prometheus::start_scraping(&(job("chart", &auth) + &job("anonymous", "")));
    let dev = device_file("chart-auth");
    let launches = Scenario::Basic {
        launches: 1000,
        copies: 0,
    };
    let pid = Workload::new(&env, launches).device(&dev).run()["pid"]
        .as_u64()
        .unwrap();
    let counted = prometheus.wait_for(
        &format!(
            "sum(cudatrace_calls_total{{job=\"chart\",pid=\"{pid}\",api=\"cuLaunchKernel\"}})"
        ),
        1000.0,
    );
    let up_anonymous = prometheus.wait_for("up{job=\"anonymous\"}", 0.0);
    let traced = daemon.stop();
    let _ = std::fs::remove_file(&dev);
    eprintln!(
        "e2e the_charts_default_metrics_refuse_an_unauthenticated_scrape: anonymous TLS GET {anonymous}, plain \
         HTTP answered {}; Prometheus as the ServiceMonitor: launches in=1000 counted={counted}; without the \
         password up={up_anonymous}",
        plain.is_ok()
    );
    assert_eq!(anonymous, "401");
    assert!(plain.is_err(), "plain HTTP was answered");
    assert_eq!(counted, 1000.0);
    assert_eq!(up_anonymous, 0.0);
    assert_eq!(traced.code, Some(0), "{:?}", traced.stderr);
}
