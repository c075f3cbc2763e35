//! End-to-end: the chart's default metrics door is locked (finding 10 of the third tenant
//! review: metrics were plain HTTP without auth, so any pod read every tenant's pod names,
//! comms and kernel names). Rendered with defaults, the chart makes a certificate for the
//! service's name and a password, and the monitors scrape with them: cudatrace run with the
//! rendered web config refuses a scrape without the password (401 over TLS; plain HTTP is not
//! answered), and a real Prometheus configured as the ServiceMonitor is (CA, server name, user
//! and password from the scrape Secret) counts every launch. And the door as rendered.
use std::process::Command;

use base64::Engine as _;
use integration_tests::{
    chart::{self, args_of, kinds, validate},
    device_file, env,
    guards::TempDir,
    http,
    servers::Prometheus,
    Cudatrace, Scenario, Workload,
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

/// The metrics door: served on the pod's IP, TLS and auth by default (the chart's own Secret,
/// or one named), a readiness probe that holds with both on (TCP), the monitors scraping with
/// the chart's CA and password, and a NetworkPolicy admitting only the listed peers to the
/// metrics port by default. Rendered and validated strictly.
#[test]
fn the_metrics_door_is_narrow() {
    let (text, docs) = chart::render(&[]);
    validate(&text, "door-defaults");
    let c = chart::container(&docs);
    let args = args_of(c);
    let name = chart::object(&docs, "DaemonSet")["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        args,
        [
            "run",
            "--config",
            "/etc/cudatrace/config.toml",
            "--listen",
            "$(POD_IP):9464",
            "--web-config-file",
            "/etc/cudatrace/web/web.yml"
        ]
    );
    let (_, monitors) = chart::render(&["serviceMonitor.enabled=true", "podMonitor.enabled=true"]);
    let scrape = format!("{name}-scrape");
    for (kind, list) in [
        ("ServiceMonitor", "endpoints"),
        ("PodMonitor", "podMetricsEndpoints"),
    ] {
        let e = &chart::object(&monitors, kind)["spec"][list][0];
        assert_eq!(e["scheme"].as_str(), Some("https"), "{kind}");
        assert_eq!(
            e["tlsConfig"]["ca"]["secret"]["name"].as_str(),
            Some(scrape.as_str())
        );
        assert!(e["tlsConfig"]["serverName"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{name}.")));
        assert_eq!(
            e["basicAuth"]["password"]["name"].as_str(),
            Some(scrape.as_str())
        );
        assert_eq!(e["basicAuth"]["password"]["key"].as_str(), Some("password"));
    }
    let policy = chart::object(&docs, "NetworkPolicy");
    assert_eq!(
        policy["spec"]["ingress"][0]["ports"][0]["port"].as_str(),
        Some("metrics")
    );
    // Both off: plain HTTP, no policy, as before.
    let (_, open) = chart::render(&["webConfig.generate=false", "networkPolicy.enabled=false"]);
    assert_eq!(
        args_of(chart::container(&open)),
        [
            "run",
            "--config",
            "/etc/cudatrace/config.toml",
            "--listen",
            "$(POD_IP):9464"
        ]
    );
    assert!(!kinds(&open).contains(&"NetworkPolicy"));
    assert!(!kinds(&open).contains(&"Secret"));
    let env = |c: &yaml_rust2::Yaml, name: &str| {
        c["env"]
            .as_vec()
            .unwrap()
            .iter()
            .find(|e| e["name"].as_str() == Some(name))
            .cloned()
    };
    assert_eq!(
        env(c, "POD_IP").expect("POD_IP")["valueFrom"]["fieldRef"]["fieldPath"].as_str(),
        Some("status.podIP")
    );
    assert_eq!(
        c["readinessProbe"]["tcpSocket"]["port"].as_str(),
        Some("metrics")
    );
    assert!(c["readinessProbe"]["httpGet"].is_badvalue());

    let sets = [
        "networkPolicy.enabled=true",
        "webConfig.secretName=cudatrace-web",
        "listenOnPodIP=false",
    ];
    let (text, docs) = chart::render(&sets);
    let checked = validate(&text, "door-on");
    let c = chart::container(&docs);
    let args = args_of(c);
    assert_eq!(
        args,
        [
            "run",
            "--config",
            "/etc/cudatrace/config.toml",
            "--web-config-file",
            "/etc/cudatrace/web/web.yml"
        ]
    );
    let pod = &chart::object(&docs, "DaemonSet")["spec"]["template"]["spec"];
    let secret = pod["volumes"]
        .as_vec()
        .unwrap()
        .iter()
        .find(|v| v["name"].as_str() == Some("web-config"))
        .expect("the web-config volume");
    assert_eq!(
        secret["secret"]["secretName"].as_str(),
        Some("cudatrace-web")
    );
    let policy = chart::object(&docs, "NetworkPolicy");
    let rule = &policy["spec"]["ingress"][0];
    assert_eq!(rule["ports"][0]["port"].as_str(), Some("metrics"));
    assert_eq!(
        rule["from"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"].as_str(),
        Some("monitoring")
    );
    assert_eq!(policy["spec"]["policyTypes"][0].as_str(), Some("Ingress"));
    eprintln!("chart: the metrics door: defaults and everything on validated ({checked} objects)");
}
