//! The Grafana dashboard (deploy/grafana/cudatrace.json) and the Alertmanager route
//! (deploy/alertmanager/alertmanager.yml), against a real Prometheus scraping a real
//! `cudatrace run` through the contention scenario: every panel's query, its variables filled
//! with the run's values, returns series; the heatmap's buckets hold the simulated waits; the
//! incident timeline shows the victims firing; two victims of one trainer make one Alertmanager
//! group and one notification. (The JSON's own shape: `dashboard_json.rs`.)
use std::{
    collections::{BTreeMap, HashSet},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use integration_tests::{
    dashboard::{dashboard, deploy, panels, queries},
    device_file, env,
    guards::TempDir,
    poll,
    servers::{Alertmanager, Prometheus, Webhook},
    Cudatrace, Scenario, Workload, FAST_DETECTION,
};
use serde_json::Value;

/// Two GPUs, neither throttled; NVML lists no process (placement from CUDA_VISIBLE_DEVICES).
const NVML: &str = "gpu 0 uuid=GPU-00000000-1111-2222-3333-444444444444 sm=80 mem=30 total=85899345920 used=4294967296 temp=65 power_mw=300000 sm_clock=1980 reasons=0x0 pcie_tx_kbs=1000 pcie_rx_kbs=2000\n\
                    gpu 1 uuid=GPU-55555555-6666-7777-8888-999999999999 sm=20 mem=10 total=85899345920 used=1073741824 temp=45 power_mw=120000 sm_clock=1980 reasons=0x0 pcie_tx_kbs=50000 pcie_rx_kbs=0\n";

/// A model server's wait latencies a day and a week ago, around now, as Prometheus would have
/// scraped them (OpenMetrics with timestamps, for `promtool tsdb create-blocks-from`).
fn history(instance: &str, comm: &str, now: f64) -> String {
    let mut text = String::from("# TYPE cudatrace_call_duration_seconds histogram\n");
    let labels = format!("job=\"cudatrace\",instance=\"{instance}\",comm=\"{comm}\",pid=\"1\",api=\"cuStreamSynchronize\",kind=\"sync\"");
    // Per 15 s: 1,000 waits, 900 of them under 1 ms, all under 2 ms.
    let buckets = [("0.001", 900.0), ("0.002", 1000.0), ("+Inf", 1000.0)];
    for ago in [86_400.0, 7.0 * 86_400.0] {
        let start = now - ago - 1200.0;
        for (le, per) in buckets {
            for k in 0..=160 {
                text.push_str(&format!(
                    "cudatrace_call_duration_seconds_bucket{{{labels},le=\"{le}\"}} {} {:.3}\n",
                    per * f64::from(k),
                    start + 15.0 * f64::from(k)
                ));
            }
        }
        for k in 0..=160 {
            text.push_str(&format!(
                "cudatrace_call_duration_seconds_count{{{labels}}} {} {:.3}\n",
                1000.0 * f64::from(k),
                start + 15.0 * f64::from(k)
            ));
        }
    }
    text.push_str("# EOF\n");
    text
}

/// The dashboard's variables as a user would set them for this run.
fn fill(expr: &str, vars: &BTreeMap<&str, String>) -> String {
    let mut out = expr.replace("$__rate_interval", "15s");
    // Longest names first, so that `$pod` does not eat into a longer name.
    let mut names: Vec<&&str> = vars.keys().collect();
    names.sort_by_key(|n| std::cmp::Reverse(n.len()));
    for name in names {
        out = out.replace(&format!("${name}"), &vars[*name]);
    }
    out
}

fn label(v: &Value, name: &str) -> String {
    v[name].as_str().unwrap_or_default().to_owned()
}

#[test]
fn every_panel_returns_series_and_one_trainer_makes_one_incident() {
    let Some(env) = env() else { return };
    let hook = Webhook::start();
    let hook_url = format!("http://127.0.0.1:{}/notify", hook.port);
    // The shipped route, its receivers pointed at the test's webhook.
    let shipped = std::fs::read_to_string(deploy("alertmanager/alertmanager.yml")).unwrap();
    let am = Alertmanager::start_config(
        &shipped
            .replace(
                "http://alert-receiver.monitoring.svc:8080/cudatrace-tickets",
                &hook_url,
            )
            .replace(
                "http://alert-receiver.monitoring.svc:8080/cudatrace-page",
                &hook_url,
            )
            .replace(
                "http://alert-receiver.monitoring.svc:8080/cudatrace",
                &hook_url,
            ),
    );
    let dir = TempDir::new("dashboard");
    let scenario = dir.write("nvml.txt", NVML);
    // cudatrace's own webhook, grouping each incident's changes of 10 s into one body.
    let grouped = Webhook::start();
    let config = dir.write(
        "cudatrace.toml",
        &format!("{FAST_DETECTION}[alerts]\nresend_s = 5\nwebhook_url = \"http://127.0.0.1:{}/grouped\"\nwebhook_group_s = 10\n", grouped.port),
    );
    let nvml = env.libnvml();
    let (daemon, listen) = Cudatrace::start_daemon_on_loopback(
        &env,
        &[
            "--nvml-lib",
            nvml.to_str().unwrap(),
            "--config",
            config.to_str().unwrap(),
            "--alertmanager",
            &am.url(),
        ],
        &[("NVML_STANDIN_SCENARIO", scenario.to_str().unwrap())],
    );
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let scrape =
        format!("  - job_name: cudatrace\n    static_configs:\n      - targets: ['{listen}']\n");
    let prom = Prometheus::start_with(
        &scrape,
        Some(&deploy("prometheus/rules.yml")),
        Some(&history(&listen, "model-server-a", now)),
    );
    // Scraping before the jobs start, so that their first waits are in its counters' increase.
    assert_eq!(
        prom.wait_for("up{job=\"cudatrace\"}", 1.0),
        1.0,
        "Prometheus does not scrape cudatrace"
    );

    let (dev0, dev1) = (device_file("dashboard-gpu0"), device_file("dashboard-gpu1"));
    let gpu0 = [
        ("CUDA_STANDIN_DEVICE", dev0.as_str()),
        ("CUDA_STANDIN_NS_PER_BLOCK", "1000"),
        ("CUDA_VISIBLE_DEVICES", "0"),
    ];
    let gpu1 = [
        ("CUDA_STANDIN_DEVICE", dev1.as_str()),
        ("CUDA_VISIBLE_DEVICES", "1"),
    ];
    let looping = |seconds, grid, sync_every| {
        Workload::new(
            &env,
            Scenario::Loop {
                seconds,
                grid,
                sync_every,
            },
        )
    };
    let a = looping(120.0, 1000, 1)
        .comm("model-server-a")
        .vars(&gpu0)
        .spawn();
    let b = looping(120.0, 1000, 1)
        .comm("model-server-b")
        .vars(&gpu0)
        .spawn();
    let loader = Workload::new(
        &env,
        Scenario::Copies {
            seconds: 120.0,
            bytes: 4_194_304,
            gap_us: 1000,
        },
    )
    .comm("data-loader")
    .vars(&gpu1)
    .spawn();
    let (a_pid, b_pid) = (a.pid(), b.pid());
    for pid in [a_pid, b_pid] {
        let learned = daemon.wait_event(Duration::from_secs(60), "baseline", |r| {
            r["pid"].as_u64() == Some(pid) && r["signal"] == "wait_per_launch"
        });
        assert!(
            learned.is_some(),
            "no baseline for pid {pid} within 60 s: {:?}",
            daemon.stderr_now()
        );
    }
    let trainer_start = Instant::now();
    let trainer = looping(70.0, 4000, 2).comm("trainer").vars(&gpu0).spawn();
    let t_pid = trainer.pid();

    // Both victims firing, as Prometheus sees them, and the rule's ALERTS.
    let firing = format!("cudatrace_alert_active{{state=\"firing\",signal=\"wait_per_launch\",pid=~\"{a_pid}|{b_pid}\"}}");
    let both = poll(Duration::from_secs(60), || {
        (prom.query(&firing).len() == 2).then_some(())
    });
    let fired_after = trainer_start.elapsed();
    assert!(
        both.is_some(),
        "both victims not firing in Prometheus within 60 s: {:?}",
        prom.query("cudatrace_alert_active")
    );
    assert!(poll(Duration::from_secs(20), || (!prom
        .query("ALERTS{alertname=\"CudatraceDetectorAlert\"}")
        .is_empty())
    .then_some(()))
    .is_some());

    // Every query of the dashboard, the variables filled as a user would for this run.
    let vars: BTreeMap<&str, String> = [
        ("instance", listen.clone()),
        ("gpu", "0|1".into()),
        ("namespace", String::new()),
        ("pod", String::new()),
        (
            "process",
            "model-server-a|model-server-b|trainer|data-loader".into(),
        ),
        (
            "api",
            "cuLaunchKernel|cuStreamSynchronize|cuMemcpyHtoD_v2".into(),
        ),
    ]
    .into_iter()
    .collect();
    let d = dashboard();
    let mut empty = Vec::new();
    let mut counted = 0;
    for (place, expr) in queries(&d) {
        let q = fill(&expr, &vars);
        let got = poll(Duration::from_secs(20), || {
            Some(prom.query(&q)).filter(|r| !r.is_empty())
        })
        .unwrap_or_default();
        counted += 1;
        if got.is_empty() {
            empty.push(format!("{place}: {q}"));
        }
    }
    // Variables: Grafana's label_values, through Prometheus's series API.
    for v in d["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v["type"] == "query")
    {
        let def = fill(v["definition"].as_str().unwrap(), &vars);
        let (selector, name) = def
            .trim_start_matches("label_values(")
            .trim_end_matches(')')
            .rsplit_once(", ")
            .unwrap();
        let series = prom.series(selector);
        let values: HashSet<String> = series.iter().map(|s| label(s, name)).collect();
        let want = match v["name"].as_str().unwrap() {
            "instance" => listen.clone(),
            "gpu" => "0".into(),
            "process" => "model-server-a".into(),
            "api" => "cuStreamSynchronize".into(),
            _ => String::new(),
        };
        assert!(
            values.contains(&want),
            "variable {}: {values:?} lacks {want:?}",
            v["name"]
        );
    }

    // The heatmap of model-server-a's waits: every wait in a finite bucket, and the buckets
    // resolve the simulated 2 ms (two 1 ms jobs on one GPU) from the contended several ms.
    let heat = fill(
        "sum by (le) (increase(cudatrace_call_duration_seconds_bucket{instance=~\"$instance\", comm=\"model-server-a\", api=\"cuStreamSynchronize\"}[60s]))",
        &vars,
    );
    let mut buckets: Vec<(f64, f64)> = prom
        .query(&heat)
        .iter()
        .map(|(m, v)| (label(m, "le").parse::<f64>().unwrap(), *v))
        .collect();
    buckets.sort_by(|x, y| x.0.total_cmp(&y.0));
    let total = buckets.last().map(|b| b.1).unwrap_or(0.0);
    let finite = buckets
        .iter()
        .rev()
        .find(|b| b.0.is_finite())
        .copied()
        .unwrap_or_default();
    let first_full = buckets
        .iter()
        .find(|b| b.1 >= total)
        .map(|b| b.0)
        .unwrap_or(f64::NAN);
    let first_any = buckets
        .iter()
        .find(|b| b.1 > 0.0)
        .map(|b| b.0)
        .unwrap_or(f64::NAN);

    // The incident timeline: both victims at 2 (firing), with the trainer as the aggressor set.
    let timeline = panels(&d)
        .into_iter()
        .find(|p| p["title"] == "Incident timeline")
        .unwrap()["targets"][0]["expr"]
        .as_str()
        .unwrap()
        .to_owned();
    let rows = prom.query(&fill(&timeline, &vars));

    // Alertmanager: one group for the trainer's incident on GPU 0, holding both victims; the
    // receiver's first notification lists both.
    let want_group = format!("{t_pid}:trainer");
    let groups = poll(Duration::from_secs(20), || {
        let g = am.groups();
        g.iter()
            .any(|g| g["alerts"].as_array().is_some_and(|a| a.len() >= 2))
            .then_some(g)
    })
    .unwrap_or_else(|| am.groups());
    let notified = hook.wait_for(Duration::from_secs(45), |n| n["alerts"].is_array());
    let notify_after = trainer_start.elapsed();
    // cudatrace's grouped webhook holds an incident for its window (`webhook_group_s = 10`) and
    // may answer after Alertmanager did: wait for its first body (the first body received).
    let first_group = grouped.wait_for(Duration::from_secs(30), |_| true);
    drop((a, b, loader, trainer));
    let traced = daemon.stop();
    let _ = (std::fs::remove_file(&dev0), std::fs::remove_file(&dev1));
    eprintln!(
        "e2e every_panel_returns_series_and_one_trainer_makes_one_incident: {counted} queries evaluated, {} empty; both victims firing {:.1} s after the trainer started; \
         heatmap of model-server-a's waits over 60 s: {total} in all, first bucket with any le={first_any}, all by le={first_full}, largest finite le={} holds {}; \
         timeline rows {:?}; Alertmanager groups {:?}; first notification {:.1} s after the trainer started",
        empty.len(),
        fired_after.as_secs_f64(),
        finite.0,
        finite.1,
        rows.iter().map(|(m, v)| (label(m, "pid"), label(m, "incident_aggressors"), *v)).collect::<Vec<_>>(),
        groups.iter().map(|g| (g["labels"].clone(), g["alerts"].as_array().map_or(0, Vec::len))).collect::<Vec<_>>(),
        notify_after.as_secs_f64()
    );
    assert!(
        empty.is_empty(),
        "queries without series:\n{}",
        empty.join("\n")
    );
    assert!(
        total > 100.0 && finite.1 == total,
        "waits beyond the largest finite bucket: {buckets:?}"
    );
    assert!((0.0005..=0.0025).contains(&first_any), "{buckets:?}");
    assert!(first_full > 0.0025 && first_full <= 0.1, "{buckets:?}");
    let mut timeline_rows: Vec<(String, String, f64)> = rows
        .iter()
        .filter(|(m, _)| label(m, "signal") == "wait_per_launch")
        .map(|(m, v)| (label(m, "pid"), label(m, "incident_aggressors"), *v))
        .collect();
    timeline_rows.sort_by(|x, y| x.0.cmp(&y.0));
    let mut want_rows = vec![
        (a_pid.to_string(), want_group.clone(), 2.0),
        (b_pid.to_string(), want_group.clone(), 2.0),
    ];
    want_rows.sort_by(|x, y| x.0.cmp(&y.0));
    assert_eq!(timeline_rows, want_rows);
    let ours: Vec<&Value> = groups
        .iter()
        .filter(|g| g["labels"]["cause"] == "compute_contention")
        .collect();
    assert_eq!(ours.len(), 1, "one group: {groups:?}");
    assert_eq!(
        (
            ours[0]["labels"]["aggressors"].as_str(),
            ours[0]["labels"]["gpu"].as_str()
        ),
        (Some(want_group.as_str()), Some("0"))
    );
    let mut victims: Vec<String> = ours[0]["alerts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| label(&a["labels"], "pid"))
        .collect();
    victims.sort();
    victims.dedup();
    let mut want_victims = vec![a_pid.to_string(), b_pid.to_string()];
    want_victims.sort();
    assert_eq!(victims, want_victims);
    let notified =
        notified.unwrap_or_else(|| panic!("no notification within 45 s: {:?}", hook.received()));
    let mut paged: Vec<String> = notified["alerts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| label(&a["labels"], "pid"))
        .collect();
    paged.sort();
    paged.dedup();
    assert_eq!(
        paged, want_victims,
        "the first page names both victims: {notified}"
    );
    assert_eq!(
        notified["groupLabels"]["aggressors"].as_str(),
        Some(want_group.as_str())
    );
    // cudatrace's grouped webhook: its first body is the incident, both victims in it.
    let first_group =
        first_group.unwrap_or_else(|| panic!("the grouped webhook got nothing within 30 s"));
    eprintln!("e2e every_panel_returns_series_and_one_trainer_makes_one_incident: first grouped webhook body: {}", first_group["summary"]);
    assert_eq!(
        (
            first_group["incident"]["aggressors"].as_str(),
            first_group["incident"]["gpu"].as_str()
        ),
        (Some(want_group.as_str()), Some("0"))
    );
    let mut in_body: Vec<String> = first_group["victims"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["victim"]["pid"].as_u64().unwrap().to_string())
        .collect();
    in_body.sort();
    in_body.dedup();
    assert_eq!(in_body, want_victims, "{first_group}");
    assert_eq!(first_group["state"], "firing");
    assert_eq!(traced.summary()["dropped"], 0);
}
