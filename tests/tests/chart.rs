//! The Helm chart: `helm template` renders it with defaults and with every option on, every
//! built-in object validates against the Kubernetes schemas (kubernetes-validate, strict), the
//! Prometheus Operator objects point at what the chart serves, and the PrometheusRule is
//! deploy/prometheus/rules.yml, accepted by promtool. (The e2e tests in privilege.rs run
//! cudatrace with the rendered capabilities and config file.)
use std::process::Command;

use integration_tests::{
    chart::{self, kinds, validate},
    guards::TempDir,
};
use yaml_rust2::{Yaml, YamlLoader};

#[test]
fn renders_and_validates_with_defaults_and_everything_on() {
    let (text, docs) = chart::render(&[]);
    assert_eq!(
        kinds(&docs),
        [
            "ClusterRole",
            "ClusterRoleBinding",
            "ConfigMap",
            "DaemonSet",
            "NetworkPolicy",
            "Secret",
            "Secret",
            "Service",
            "ServiceAccount"
        ]
    );
    let checked = validate(&text, "defaults");
    let on = [
        "serviceMonitor.enabled=true",
        "podMonitor.enabled=true",
        "prometheusRule.enabled=true",
        "grafanaDashboard.enabled=true",
    ];
    let (all_text, all) = chart::render(&on);
    assert_eq!(
        kinds(&all),
        [
            "ClusterRole",
            "ClusterRoleBinding",
            "ConfigMap",
            "ConfigMap",
            "DaemonSet",
            "NetworkPolicy",
            "PodMonitor",
            "PrometheusRule",
            "Secret",
            "Secret",
            "Service",
            "ServiceAccount",
            "ServiceMonitor"
        ]
    );
    let all_checked = validate(&all_text, "everything-on");
    // Pod names off: no RBAC, no token in the pod.
    let (off_text, off) = chart::render(&[
        "podNames.enabled=false",
        "networkPolicy.enabled=false",
        "webConfig.generate=false",
    ]);
    assert_eq!(
        kinds(&off),
        ["ConfigMap", "DaemonSet", "Service", "ServiceAccount"]
    );
    let pod = &chart::object(&off, "DaemonSet")["spec"]["template"]["spec"];
    assert_eq!(pod["automountServiceAccountToken"].as_bool(), Some(false));
    assert!(chart::object(&off, "ConfigMap")["data"]["config.toml"]
        .as_str()
        .unwrap()
        .contains("pod_names = false"));
    let off_checked = validate(&off_text, "pod-names-off");
    eprintln!("chart: objects validated (strict): defaults {checked}, everything on {all_checked} (+3 Prometheus Operator), pod names off {off_checked}");
}

#[test]
fn daemonset_is_least_privilege_on_gpu_nodes() {
    let (_, docs) = chart::render(&[]);
    let pod = &chart::object(&docs, "DaemonSet")["spec"]["template"]["spec"];
    assert_eq!(pod["hostPID"].as_bool(), Some(true));
    assert_eq!(
        pod["automountServiceAccountToken"].as_bool(),
        Some(true),
        "the token lists the node's pods"
    );
    let term = &pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"][0]["matchExpressions"][0];
    assert_eq!(term["key"].as_str(), Some("nvidia.com/gpu.present"));
    // GPU nodes of either architecture: the one term is the GPU's, no node selector pins an
    // architecture, and the image is the manifest list `cargo xtask image` builds (amd64 and
    // arm64 under one name).
    let terms = &pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"];
    assert_eq!(terms.as_vec().map(Vec::len), Some(1), "{terms:?}");
    assert_eq!(
        terms[0]["matchExpressions"].as_vec().map(Vec::len),
        Some(1),
        "{terms:?}"
    );
    assert!(
        pod["nodeSelector"].as_hash().is_none_or(|m| m.is_empty()),
        "{:?}",
        pod["nodeSelector"]
    );
    assert_eq!(
        chart::container(&docs)["image"].as_str(),
        Some(integration_tests::container::IMAGE)
    );
    assert_eq!(
        pod["tolerations"][0]["key"].as_str(),
        Some("nvidia.com/gpu")
    );
    let c = chart::container(&docs);
    // The node's state directory, writable, for the incident archive the config names.
    let state = pod["volumes"]
        .as_vec()
        .unwrap()
        .iter()
        .find(|v| v["name"].as_str() == Some("state"))
        .expect("a state volume");
    assert_eq!(
        (
            state["hostPath"]["path"].as_str(),
            state["hostPath"]["type"].as_str()
        ),
        (Some("/var/lib/cudatrace"), Some("DirectoryOrCreate"))
    );
    let mount = c["volumeMounts"]
        .as_vec()
        .unwrap()
        .iter()
        .find(|m| m["name"].as_str() == Some("state"))
        .expect("the state volume mounted");
    assert_eq!(mount["mountPath"].as_str(), Some("/var/lib/cudatrace"));
    assert!(mount["readOnly"].is_badvalue(), "{mount:?}");
    assert!(
        chart::config_toml().contains("[alerts]\narchive = \"/var/lib/cudatrace/incidents.jsonl\"")
    );
    let s = &c["securityContext"];
    assert_eq!(s["privileged"].as_bool(), Some(false));
    assert_eq!(s["allowPrivilegeEscalation"].as_bool(), Some(false));
    assert_eq!(s["readOnlyRootFilesystem"].as_bool(), Some(true));
    assert_eq!(s["seccompProfile"]["type"].as_str(), Some("RuntimeDefault"));
    assert_eq!(
        chart::daemonset_capabilities(),
        [
            "BPF",
            "PERFMON",
            "SYS_PTRACE",
            "DAC_READ_SEARCH",
            "SETUID",
            "SETGID"
        ]
    );
    let node = c["env"]
        .as_vec()
        .unwrap()
        .iter()
        .find(|e| e["name"].as_str() == Some("NODE_NAME"))
        .expect("NODE_NAME");
    assert_eq!(
        node["valueFrom"]["fieldRef"]["fieldPath"].as_str(),
        Some("spec.nodeName")
    );
    let log_format = c["env"]
        .as_vec()
        .unwrap()
        .iter()
        .find(|e| e["name"].as_str() == Some("CUDATRACE_LOG_FORMAT"))
        .expect("CUDATRACE_LOG_FORMAT");
    assert_eq!(log_format["value"].as_str(), Some("json"));
    for kind in ["requests", "limits"] {
        for r in ["cpu", "memory"] {
            assert!(
                c["resources"][kind][r].as_str().is_some(),
                "resources.{kind}.{r}"
            );
        }
    }
    assert_eq!(c["ports"][0]["name"].as_str(), Some("metrics"));
    assert_eq!(c["ports"][0]["containerPort"].as_i64(), Some(9464));
    // RBAC: list pods, nothing else.
    let rules = &chart::object(&docs, "ClusterRole")["rules"];
    assert_eq!(rules.as_vec().unwrap().len(), 1);
    assert_eq!(rules[0]["resources"][0].as_str(), Some("pods"));
    assert_eq!(
        rules[0]["verbs"]
            .as_vec()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect::<Vec<_>>(),
        ["list"]
    );
    let binding = chart::object(&docs, "ClusterRoleBinding");
    assert_eq!(
        binding["subjects"][0]["name"],
        chart::object(&docs, "ServiceAccount")["metadata"]["name"]
    );
    assert_eq!(
        pod["serviceAccountName"],
        chart::object(&docs, "ServiceAccount")["metadata"]["name"]
    );
}

#[test]
fn monitors_select_the_metrics_port_and_the_rule_is_rules_yml() {
    let on = [
        "serviceMonitor.enabled=true",
        "podMonitor.enabled=true",
        "prometheusRule.enabled=true",
    ];
    let (_, docs) = chart::render(&on);
    let service = chart::object(&docs, "Service");
    let pod_labels = &chart::object(&docs, "DaemonSet")["spec"]["template"]["metadata"]["labels"];
    let subset = |sel: &Yaml, of: &Yaml| {
        sel.as_hash()
            .unwrap()
            .iter()
            .all(|(k, v)| &of[k.as_str().unwrap()] == v)
    };
    assert!(
        subset(&service["spec"]["selector"], pod_labels),
        "the Service selects the DaemonSet's pods"
    );
    let sm = chart::object(&docs, "ServiceMonitor");
    assert!(
        subset(
            &sm["spec"]["selector"]["matchLabels"],
            &service["metadata"]["labels"]
        ),
        "the ServiceMonitor selects the Service"
    );
    assert_eq!(
        sm["spec"]["endpoints"][0]["port"],
        service["spec"]["ports"][0]["name"]
    );
    let pm = chart::object(&docs, "PodMonitor");
    assert!(
        subset(&pm["spec"]["selector"]["matchLabels"], pod_labels),
        "the PodMonitor selects the pods"
    );
    assert_eq!(
        pm["spec"]["podMetricsEndpoints"][0]["port"].as_str(),
        Some("metrics")
    );
    // The rule's groups are rules.yml's, and promtool takes them.
    let rule = chart::object(&docs, "PrometheusRule");
    let rules_yml = chart::chart_dir().join("../../prometheus/rules.yml");
    let shipped = YamlLoader::load_from_str(&std::fs::read_to_string(&rules_yml).unwrap())
        .unwrap()
        .remove(0);
    assert_eq!(rule["spec"]["groups"], shipped["groups"]);
    let mut spec = String::new();
    yaml_rust2::YamlEmitter::new(&mut spec)
        .dump(&rule["spec"])
        .unwrap();
    let dir = TempDir::new("rule");
    let file = dir.write("rule.yml", &spec);
    let out = Command::new("promtool")
        .args(["check", "rules"])
        .arg(&file)
        .output()
        .expect("promtool is needed");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let groups = shipped["groups"].as_vec().unwrap();
    let n: usize = groups
        .iter()
        .map(|g| g["rules"].as_vec().unwrap().len())
        .sum();
    assert!(
        said.contains(&format!("SUCCESS: {n} rules found")),
        "{said}"
    );
    eprintln!("chart: PrometheusRule = rules.yml ({n} rules, promtool check passed)");
}

#[test]
fn the_dashboard_configmap_is_for_grafanas_sidecar() {
    let (_, docs) = chart::render(&[
        "grafanaDashboard.enabled=true",
        "grafanaDashboard.namespace=monitoring",
        "grafanaDashboard.annotations.grafana_folder=GPU",
    ]);
    let maps: Vec<&Yaml> = docs
        .iter()
        .filter(|d| {
            d["kind"].as_str() == Some("ConfigMap") && !d["data"]["cudatrace.json"].is_badvalue()
        })
        .collect();
    assert_eq!(maps.len(), 1);
    let map = maps[0];
    assert_eq!(
        map["metadata"]["labels"]["grafana_dashboard"].as_str(),
        Some("1")
    );
    assert_eq!(map["metadata"]["namespace"].as_str(), Some("monitoring"));
    assert_eq!(
        map["metadata"]["annotations"]["grafana_folder"].as_str(),
        Some("GPU")
    );
    // The dashboard as shipped in deploy/grafana, to the byte once parsed.
    let shipped: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(chart::chart_dir().join("../../grafana/cudatrace.json")).unwrap(),
    )
    .unwrap();
    let carried: serde_json::Value =
        serde_json::from_str(map["data"]["cudatrace.json"].as_str().unwrap()).unwrap();
    assert_eq!(carried, shipped);
    assert_eq!(carried["uid"], "cudatrace");
}

/// Policies in the chart's values (arrays of tables, sub-tables) render as the TOML cudatrace
/// takes: `cudatrace incidents --config` loads the rendered file, validating every key.
#[test]
fn policies_in_values_render_as_a_config_cudatrace_takes() {
    let dir = TempDir::new("chart-policies");
    let archive = dir.write("incidents.jsonl", "");
    let values = format!(
        "config:\n  detect:\n    window_s: 5\n    schedule:\n      - name: night\n        hours: \"22:00-07:00\"\n        warning: 0.3\n        critical: 0.6\n        page: 1.0\n      \
         - name: sale\n        dates: \"2026-11-27..2026-11-30\"\n        warning: 0.05\n        critical: 0.1\n        page: 0.2\n  \
         alerts:\n    archive: {}\n    webhook_group_s: 30\n    alertmanager_auth:\n      username: cudatrace\n      password_file: /etc/cudatrace/am-password\n    \
         quiet:\n      - name: nightly-batch\n        comm: \"train*\"\n        hours: \"01:00-05:00\"\n",
        archive.display()
    );
    let docs = chart::render_values(&values);
    let toml = chart::object(&docs, "ConfigMap")["data"]["config.toml"]
        .as_str()
        .unwrap()
        .to_owned();
    for table in [
        "[[detect.schedule]]",
        "[[alerts.quiet]]",
        "[alerts.alertmanager_auth]",
        "name = \"sale\"",
    ] {
        assert!(toml.contains(table), "{table} not in:\n{toml}");
    }
    let file = dir.write("config.toml", &toml);
    let bin = std::env::var("CUDATRACE_BIN").unwrap_or_else(|_| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/../target/release/cudatrace").to_owned()
    });
    let out = Command::new(&bin)
        .args(["incidents", "--config"])
        .arg(&file)
        .output()
        .unwrap_or_else(|e| panic!("{bin}: {e} (cargo xtask build)"));
    let said = String::from_utf8_lossy(&out.stderr);
    eprintln!(
        "chart: policies rendered; cudatrace incidents --config: exit {:?} {said}",
        out.status.code()
    );
    assert!(out.status.success(), "{said}\n{toml}");
    assert!(said.contains("no incidents in"), "{said}");
}
