//! The Grafana dashboard's JSON (deploy/grafana/cudatrace.json) is well formed: Grafana 10's
//! model, its variables in order, unique panel ids, a grid inside 24 columns without overlaps, a
//! data source, a query and a description on every panel, and only known variables in queries.
//! (Its queries against a real Prometheus: `dashboard.rs`.)
use std::collections::HashSet;

use integration_tests::dashboard::{dashboard, panels, queries};

#[test]
fn the_dashboard_is_well_formed() {
    let d = dashboard();
    assert!(
        d["schemaVersion"].as_i64().unwrap() >= 38,
        "Grafana 10's JSON model"
    );
    let names: Vec<&str> = d["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "datasource",
            "instance",
            "gpu",
            "namespace",
            "pod",
            "process",
            "api"
        ]
    );
    let ds = &d["templating"]["list"][0];
    assert_eq!(
        (ds["type"].as_str(), ds["query"].as_str()),
        (Some("datasource"), Some("prometheus"))
    );
    let all = panels(&d);
    let mut ids = HashSet::new();
    for p in &all {
        assert!(
            ids.insert(p["id"].as_i64().unwrap()),
            "panel id {} twice",
            p["id"]
        );
    }
    // Grid: inside 24 columns, no two panels overlapping.
    let rects: Vec<(i64, i64, i64, i64, &str)> = all
        .iter()
        .map(|p| {
            let g = &p["gridPos"];
            (
                g["x"].as_i64().unwrap(),
                g["y"].as_i64().unwrap(),
                g["w"].as_i64().unwrap(),
                g["h"].as_i64().unwrap(),
                p["title"].as_str().unwrap(),
            )
        })
        .collect();
    for (i, a) in rects.iter().enumerate() {
        assert!(a.0 >= 0 && a.0 + a.2 <= 24 && a.2 > 0 && a.3 > 0, "{a:?}");
        for b in &rects[i + 1..] {
            let apart =
                a.0 + a.2 <= b.0 || b.0 + b.2 <= a.0 || a.1 + a.3 <= b.1 || b.1 + b.3 <= a.1;
            assert!(apart, "{a:?} overlaps {b:?}");
        }
    }
    // A datasource and a query on every panel; every variable used exists.
    let known: HashSet<&str> = names.iter().copied().chain(["__rate_interval"]).collect();
    for p in all.iter().filter(|p| p["type"] != "row") {
        assert_eq!(
            p["datasource"]["uid"], "${datasource}",
            "panel {}",
            p["title"]
        );
        let targets = p["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "panel {} has no query", p["title"]);
        for t in targets {
            assert_eq!(t["datasource"]["uid"], "${datasource}");
            let expr = t["expr"].as_str().unwrap();
            assert!(!expr.trim().is_empty());
            for var in expr.split('$').skip(1) {
                let name: String = var
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                assert!(
                    known.contains(name.as_str()),
                    "panel {}: ${name} is not a variable",
                    p["title"]
                );
            }
        }
        assert!(
            p["description"].as_str().is_some_and(|s| !s.is_empty()),
            "panel {} says what it shows",
            p["title"]
        );
    }
    eprintln!(
        "dashboard: {} panels, {} queries, ids unique, grid without overlaps",
        all.len(),
        queries(&d).len()
    );
}
