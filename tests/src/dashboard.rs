//! Readers of the shipped Grafana dashboard (deploy/grafana/cudatrace.json) for the dashboard
//! tests: its panels and every query it makes.
use std::path::PathBuf;

use serde_json::Value;

/// A file of the repository's `deploy/` folder.
pub fn deploy(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy")
        .join(path)
}

/// The shipped Grafana dashboard.
pub fn dashboard() -> Value {
    serde_json::from_str(&std::fs::read_to_string(deploy("grafana/cudatrace.json")).unwrap())
        .expect("the dashboard is JSON")
}

/// Every panel, rows' nested panels included.
pub fn panels(d: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for p in d["panels"].as_array().unwrap() {
        out.push(p);
        out.extend(p["panels"].as_array().into_iter().flatten());
    }
    out
}

/// Every query of the dashboard: (where, expr), panels' targets and annotations.
pub fn queries(d: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for p in panels(d).into_iter().filter(|p| p["type"] != "row") {
        for t in p["targets"].as_array().unwrap() {
            out.push((
                format!(
                    "panel {} {:?} {}",
                    p["id"],
                    p["title"].as_str().unwrap(),
                    t["refId"].as_str().unwrap()
                ),
                t["expr"].as_str().unwrap().to_owned(),
            ));
        }
    }
    for a in d["annotations"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["expr"].is_string())
    {
        out.push((
            format!("annotation {:?}", a["name"].as_str().unwrap()),
            a["expr"].as_str().unwrap().to_owned(),
        ));
    }
    out
}
