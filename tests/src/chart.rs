//! The Helm chart in deploy/helm/cudatrace, rendered by `helm template` as a cluster would get
//! it: the tests read capabilities and the config file from this, never from a copy.
use std::{path::PathBuf, process::Command};

use yaml_rust2::{Yaml, YamlLoader};

/// The Prometheus Operator's API group and version (its objects are not validated here).
pub const OPERATOR_API: &str = "monitoring.coreos.com/v1";

/// The chart's folder.
pub fn chart_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/helm/cudatrace")
}

/// The objects `helm template` renders with `sets` (`key=value`, as `--set` takes them), in
/// namespace `cudatrace`, with the text they were parsed from.
pub fn render(sets: &[&str]) -> (String, Vec<Yaml>) {
    let mut cmd = Command::new("helm");
    cmd.args(["template", "cudatrace"])
        .arg(chart_dir())
        .args(["--namespace", "cudatrace"]);
    for s in sets {
        cmd.args(["--set", s]);
    }
    let out = cmd
        .output()
        .expect("helm is needed (scripts/setup.sh installs it)");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "helm template failed: {err}");
    let text = String::from_utf8(out.stdout).expect("helm writes UTF-8");
    let docs = YamlLoader::load_from_str(&text)
        .unwrap_or_else(|e| panic!("helm template wrote bad YAML: {e}"));
    (text, docs.into_iter().filter(|d| !d.is_null()).collect())
}

/// The objects `helm template` renders with a values file holding `values` (YAML).
pub fn render_values(values: &str) -> Vec<Yaml> {
    let dir = crate::guards::TempDir::new("chart-values");
    let file = dir.write("values.yaml", values);
    let out = Command::new("helm")
        .args(["template", "cudatrace"])
        .arg(chart_dir())
        .args(["--namespace", "cudatrace", "-f"])
        .arg(&file)
        .output()
        .expect("helm is needed (scripts/setup.sh installs it)");
    assert!(
        out.status.success(),
        "helm template failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("helm writes UTF-8");
    YamlLoader::load_from_str(&text)
        .unwrap_or_else(|e| panic!("helm template wrote bad YAML: {e}"))
        .into_iter()
        .filter(|d| !d.is_null())
        .collect()
}

/// The rendered object of kind `kind` (exactly one).
pub fn object<'a>(docs: &'a [Yaml], kind: &str) -> &'a Yaml {
    let found: Vec<&Yaml> = docs
        .iter()
        .filter(|d| d["kind"].as_str() == Some(kind))
        .collect();
    assert_eq!(found.len(), 1, "{kind}s rendered: {}", found.len());
    found[0]
}

/// The DaemonSet's cudatrace container.
pub fn container(docs: &[Yaml]) -> &Yaml {
    &object(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
}

/// The capabilities the default DaemonSet adds (`BPF`, ...), checking that it drops all first,
/// and is neither privileged nor allowed to escalate.
pub fn daemonset_capabilities() -> Vec<String> {
    let (_, docs) = render(&[]);
    let security = &container(&docs)["securityContext"];
    assert_eq!(
        security["capabilities"]["drop"][0].as_str(),
        Some("ALL"),
        "the DaemonSet drops every capability first"
    );
    assert_eq!(security["privileged"].as_bool(), Some(false));
    assert_eq!(security["allowPrivilegeEscalation"].as_bool(), Some(false));
    security["capabilities"]["add"]
        .as_vec()
        .expect("capabilities.add")
        .iter()
        .map(|c| c.as_str().unwrap().to_owned())
        .collect()
}

/// The init container that prepares the state directory: its args and its capabilities
/// (it drops every other one, runs as uid 0 without privilege escalation).
pub fn init_container() -> (Vec<String>, Vec<String>) {
    let (_, docs) = render(&[]);
    let ds = object(&docs, "DaemonSet");
    let init = &ds["spec"]["template"]["spec"]["initContainers"][0];
    assert_eq!(init["name"].as_str(), Some("prepare-state"));
    let security = &init["securityContext"];
    assert_eq!(security["capabilities"]["drop"][0].as_str(), Some("ALL"));
    assert_eq!(security["allowPrivilegeEscalation"].as_bool(), Some(false));
    let strings = |y: &Yaml| -> Vec<String> {
        y.as_vec()
            .expect("a list")
            .iter()
            .map(|c| c.as_str().unwrap().to_owned())
            .collect()
    };
    (
        strings(&init["args"]),
        strings(&security["capabilities"]["add"]),
    )
}

/// The default config file, as the ConfigMap carries it.
pub fn config_toml() -> String {
    config_toml_with(&[])
}

/// The config file with `sets` (`--set` values).
pub fn config_toml_with(sets: &[&str]) -> String {
    let (_, docs) = render(sets);
    object(&docs, "ConfigMap")["data"]["config.toml"]
        .as_str()
        .expect("config.toml in the ConfigMap")
        .to_owned()
}

/// `setpriv` arguments for uid 0 under no-new-privs with exactly `caps` (bounding, so permitted
/// and effective at exec), and nothing inheritable: how the DaemonSet's container starts.
pub fn as_root_with(caps: &[String]) -> Vec<String> {
    let list: String = caps
        .iter()
        .map(|c| format!(",+{}", c.to_lowercase()))
        .collect();
    vec![
        "--no-new-privs".into(),
        format!("--bounding-set=-all{list}"),
        "--inh-caps=-all".into(),
    ]
}

/// Runs the init container's command as the chart runs it (uid 0, no-new-privs, its
/// capabilities), `bin` for its image's cudatrace and `config` for the ConfigMap's file:
/// its args, its capabilities and what it did.
pub fn run_init_container(
    bin: &std::path::Path,
    config: &std::path::Path,
) -> (Vec<String>, Vec<String>, std::process::Output) {
    let (args, caps) = init_container();
    let out = std::process::Command::new("setpriv")
        .args(as_root_with(&caps))
        .arg(bin)
        .args(args.iter().map(|a| {
            if a == "/etc/cudatrace/config.toml" {
                config.display().to_string()
            } else {
                a.clone()
            }
        }))
        .output()
        .expect("setpriv (util-linux) is needed");
    (args, caps, out)
}

/// The kinds of the rendered objects, sorted.
pub fn kinds(docs: &[Yaml]) -> Vec<&str> {
    let mut k: Vec<&str> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
    k.sort_unstable();
    k
}

/// kubernetes-validate, strict, on the rendered objects of Kubernetes' own APIs; returns how many.
pub fn validate(text: &str, name: &str) -> usize {
    let docs = YamlLoader::load_from_str(text).unwrap();
    let mut own = String::new();
    let mut n = 0;
    for doc in docs
        .iter()
        .filter(|d| !d.is_null() && d["apiVersion"].as_str() != Some(OPERATOR_API))
    {
        let mut out = String::new();
        yaml_rust2::YamlEmitter::new(&mut out).dump(doc).unwrap();
        own.push_str(&out);
        own.push('\n');
        n += 1;
    }
    let dir = crate::guards::TempDir::new("chart");
    let file = dir.write(&format!("{name}.yaml"), &own);
    let out = Command::new("python3")
        .args(["-m", "kubernetes_validate", "--strict"])
        .arg(&file)
        .output()
        .expect("python3 with kubernetes-validate is needed (scripts/setup.sh)");
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{name}: {said}");
    assert_eq!(
        said.matches(" passed for resource ").count(),
        n,
        "{name}: every object checked: {said}"
    );
    n
}

/// The container's arguments.
pub fn args_of(c: &Yaml) -> Vec<&str> {
    c["args"]
        .as_vec()
        .expect("args")
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect()
}
