//! End-to-end: a process's name cannot forge an aggressor or ping a chat channel (finding 6 of
//! the third tenant review: `aggressors` was `pid:comm` joined by commas, so a comm
//! `x,4242:llm-srv` added an entry Alertmanager groups by, and `<!channel>` in a summary pinged
//! a Slack channel). Two heavy neighbours named so slow a victim: the label and annotation
//! list exactly their two pids, and no `<`, `>` or `@` reaches the summary or the chain.
use std::time::Duration;

use integration_tests::{
    alerting::looping,
    device_file, env,
    servers::{Alertmanager, Webhook},
    Cudatrace,
};
use serde_json::Value;

/// The entries of a `pid:comm,pid:comm` list, split at unescaped commas; each entry's pid.
fn pids(list: &str) -> Vec<String> {
    let mut entries = vec![String::new()];
    let mut escaped = false;
    for c in list.chars() {
        match (escaped, c) {
            (false, '\\') => escaped = true,
            (false, ',') => entries.push(String::new()),
            _ => {
                escaped = false;
                entries.last_mut().unwrap().push(c);
            }
        }
    }
    entries
        .into_iter()
        .filter(|e| !e.is_empty())
        .map(|e| e.split(':').next().unwrap_or("").to_owned())
        .collect()
}

#[test]
fn forged_comms_add_no_aggressor_and_ping_nobody() {
    let Some(env) = env() else { return };
    let am = Alertmanager::start();
    let hook = Webhook::start();
    let hook_url = format!("http://127.0.0.1:{}/hook", hook.port);
    let (daemon, _listen) = Cudatrace::start_daemon_on_loopback(
        &env,
        &["--alertmanager", &am.url(), "--webhook", &hook_url],
        &[],
    );
    let dev = device_file("forged");
    let vars = [
        ("CUDA_STANDIN_DEVICE", dev.as_str()),
        ("CUDA_STANDIN_NS_PER_BLOCK", "1000"),
        ("CUDA_VISIBLE_DEVICES", "0"),
    ];
    let victim = looping(&env, 300.0, 1000, 1)
        .comm("model-server")
        .vars(&vars)
        .spawn();
    let victim_pid = victim.pid();
    let learned = daemon.wait_event(Duration::from_secs(60), "baseline", |r| {
        r["pid"].as_u64() == Some(victim_pid) && r["signal"] == "wait_per_launch"
    });
    assert!(learned.is_some(), "{:?}", daemon.stderr_now());
    let forger = looping(&env, 60.0, 4000, 2)
        .comm("x,4242:llm-srv")
        .vars(&vars)
        .spawn();
    let pinger = looping(&env, 60.0, 4000, 2)
        .comm("<!channel>@here")
        .vars(&vars)
        .spawn();
    let (forger_pid, pinger_pid) = (forger.pid(), pinger.pid());
    let firing = hook.wait_for(Duration::from_secs(60), |v: &Value| {
        v["state"] == "firing" && v["victim"]["pid"].as_u64() == Some(victim_pid)
    });
    let firing = firing.unwrap_or_else(|| panic!("no alert: {:?}", hook.received()));
    let ours = |alerts: &[Value]| -> Option<Value> {
        alerts
            .iter()
            .find(|a| a["labels"]["pid"] == victim_pid.to_string().as_str())
            .cloned()
    };
    let listed = am.wait_until(|a| ours(a).is_some());
    let listed = ours(&listed).unwrap_or_else(|| panic!("not listed: {listed:?}"));
    let (label, annotation) = (
        listed["labels"]["aggressors"].as_str().unwrap_or(""),
        listed["annotations"]["aggressors"].as_str().unwrap_or(""),
    );
    let (summary, chain) = (
        listed["annotations"]["summary"].as_str().unwrap_or(""),
        listed["annotations"]["chain"].as_str().unwrap_or(""),
    );
    let named: Vec<u64> = firing["aggressors"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a["pid"].as_u64())
        .collect();
    eprintln!(
        "e2e forged_comms_add_no_aggressor_and_ping_nobody: {} named {named:?} (forger {forger_pid}, pinger \
         {pinger_pid}); label {label:?}; annotation {annotation:?}; summary {summary:?}",
        firing["alert"]
    );
    drop((forger.finish(), pinger.finish()));
    let _ = victim.kill();
    let _ = daemon.stop();
    let _ = std::fs::remove_file(&dev);
    let ours = [forger_pid.to_string(), pinger_pid.to_string()];
    let label_pids = pids(label);
    let annotation_pids = pids(annotation);
    assert!(
        !label_pids.is_empty() && label_pids.iter().all(|p| ours.contains(p)),
        "{label}"
    );
    let mut sorted = annotation_pids.clone();
    sorted.sort();
    let mut both = ours.to_vec();
    both.sort();
    assert_eq!(sorted, both, "exactly the two neighbours: {annotation}");
    assert!(!label_pids.contains(&"4242".to_owned()) && !annotation.contains(",4242:"));
    assert!(
        named.iter().all(|p| *p == forger_pid || *p == pinger_pid),
        "{named:?}"
    );
    for text in [summary, chain, label, annotation] {
        assert!(!text.contains(['<', '>', '@']), "{text}");
    }
    assert!(summary.contains("‹!channel›＠here"), "{summary}");
}
