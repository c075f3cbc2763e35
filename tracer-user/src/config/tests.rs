//! The config loader's tests: defaults, every refusal by its key, the documented examples.
use super::*;

/// `text` is refused as an [`ConfigError::Invalid`] value of `key`, saying `message`.
#[track_caller]
fn assert_invalid(text: &str, key: &str, message: &str) {
    match Config::parse(text) {
        Err(ConfigError::Invalid { key: k, message: m }) => {
            assert_eq!((k.as_str(), m.as_str()), (key, message));
        }
        other => panic!("{text:?}: expected an invalid {key}, got {other:?}"),
    }
}

/// Every ```toml block of docs/configuration.md, through the real loader.
#[test]
fn the_documented_examples_load() {
    let doc = include_str!("../../../docs/configuration.md");
    let blocks: Vec<&str> = doc
        .split("```toml\n")
        .skip(1)
        .map(|b| b.split("```").next().expect("a closed block"))
        .collect();
    assert_eq!(blocks.len(), 3, "the reference and two examples");
    for block in &blocks {
        if let Err(e) = Config::parse(block) {
            panic!("docs/configuration.md: {e}\n{block}");
        }
    }
    // The reference block gives every default: loading it changes nothing but the values it
    // sets away from them (the examples' paths, URLs and lists).
    let reference = Config::parse(blocks[0]).expect("checked");
    let defaults = Config::default();
    assert_eq!(reference.detect.window_s, defaults.detect.window_s);
    assert_eq!(reference.launches, defaults.launches);
    assert_eq!(
        (
            reference.max_processes,
            reference.max_libraries,
            reference.ringbuf_mib
        ),
        (
            defaults.max_processes,
            defaults.max_libraries,
            defaults.ringbuf_mib
        )
    );
}

#[test]
fn defaults_and_overrides() {
    assert_eq!(Config::parse("").unwrap(), Config::default());
    let c = Config::parse("listen = \"0.0.0.0:9000\"\ntop_kernels = 5\n").unwrap();
    assert_eq!((c.listen.port(), c.top_kernels), (9000, 5));
}

#[test]
fn bad_values_say_what_is_wrong() {
    assert!(
        matches!(Config::parse("colour = 1"), Err(ConfigError::Syntax(m)) if m.contains("unknown field `colour`"))
    );
    assert!(matches!(
        Config::parse("listen = \"nowhere\""),
        Err(ConfigError::Syntax(_))
    ));
    assert_invalid(
        "top_kernels = 0",
        "top_kernels",
        "top_kernels = 0: give 1 to max_kernels (500)",
    );
    assert_invalid(
        "ringbuf_mib = 3",
        "ringbuf_mib",
        "ringbuf_mib = 3: a power of two up to 1024",
    );
    assert_invalid("[detect]\nwarning = 0.4\n", "detect.warning", "detect thresholds warning = 0.4, critical = 0.3, page = 0.5: give fractions over the baseline p99 with 0 < warning < critical < page");
    assert!(
        matches!(Config::parse("[detect]\nwindow = 5\n"), Err(ConfigError::Syntax(m)) if m.contains("unknown field `window`"))
    );
    assert_invalid("[kubernetes]\npods_url = \"http://10.0.0.1:10255/pods\"\n", "kubernetes.pods_url", "kubernetes.pods_url = \"http://10.0.0.1:10255/pods\": give an https URL (the token is never sent in the clear)");
    assert_invalid(
        "[kubernetes]\nrefresh_s = 1\n",
        "kubernetes.refresh_s",
        "kubernetes.refresh_s = 1: give at least 5 seconds",
    );
    assert_invalid(
        "[alerts]\nwebhook_group_s = 86400\n",
        "alerts.webhook_group_s",
        "alerts.webhook_group_s = 86400: give 0 (each change as it is) to 3600 seconds",
    );
    let k = Config::parse("[kubernetes]\npod_names = false\n")
        .unwrap()
        .kubernetes;
    assert_eq!((k.pod_names, k.refresh_s), (Some(false), 30));
    assert_invalid(
        "[detect]\nresolve_after_s = 2\n",
        "detect.resolve_after_s",
        "detect.resolve_after_s = 2: give at least one window (5 s)",
    );
    assert_invalid("[alerts]\nwebhook_url = \"ftp://x/y\"\n", "alerts.webhook_url", "alerts.webhook_url = \"ftp://x/y\": not an http or https URL: give http[s]://HOST[:PORT][/PATH]");
    assert_invalid(
        "[alerts.webhook_auth]\nusername = \"u\"\n",
        "alerts.webhook_auth",
        "alerts.webhook_auth: give both username and password_file",
    );
    assert_invalid("[alerts.alertmanager_auth]\nusername = \"u\"\npassword_file = \"p\"\nbearer_token_file = \"t\"\n", "alerts.alertmanager_auth", "alerts.alertmanager_auth: give username and password_file, or bearer_token_file, not both");
    assert!(
        matches!(Config::parse("[detect]\nlevel_smoothing = 0\n"), Err(ConfigError::Invalid { key, message }) if key == "detect.level_smoothing" && message.starts_with("detect.level_smoothing = 0:"))
    );
}

#[test]
fn detect_and_alert_tables() {
    let c = Config::parse("[detect]\nwindow_s = 10\npage = 0.8\n[alerts]\nalertmanager_url = \"http://127.0.0.1:9093\"\n").unwrap();
    assert_eq!(
        (c.detect.window_s, c.detect.page, c.detect.warning),
        (10, 0.8, 0.10)
    );
    assert_eq!(
        c.alerts.alertmanager_url.as_deref(),
        Some("http://127.0.0.1:9093")
    );
}

#[test]
fn credentials_go_only_over_https() {
    let am = |url: &str, extra: &str| {
        format!(
            "[alerts]\nalertmanager_url = {url:?}\n{extra}[alerts.alertmanager_auth]\nusername = \"u\"\npassword_file = \"/p\"\n"
        )
    };
    assert_invalid(
        &am("http://am:9093", ""),
        "alerts.alertmanager_auth",
        "alerts.alertmanager_auth: credentials for \"http://am:9093\" would be sent in the clear: give an https URL, or set alerts.insecure_http_credentials = true",
    );
    assert!(Config::parse(&am("https://am:9093", "")).is_ok());
    assert!(Config::parse(&am("http://am:9093", "insecure_http_credentials = true\n")).is_ok());
    // Without credentials plain http is fine.
    assert!(Config::parse("[alerts]\nwebhook_url = \"http://hooks/x\"\n").is_ok());
}

#[test]
fn state_season_and_drift_keys() {
    let c = Config::parse("[state]\ndir = \"/var/lib/cudatrace\"\n").unwrap();
    assert_eq!(
        c.state.dir.as_deref(),
        Some(std::path::Path::new("/var/lib/cudatrace"))
    );
    assert_eq!((c.state.save_every_s, c.state.max_workloads), (60, 256));
    assert_invalid(
        "[state]\ndir = \"state\"\n",
        "state.dir",
        "state.dir = \"state\": give an absolute path",
    );
    assert_invalid(
        "[state]\nsave_every_s = 0\n",
        "state.save_every_s",
        "state.save_every_s = 0: give 1 to 60 seconds",
    );
    assert_invalid(
        "[state]\nmax_workloads = 5000\n",
        "state.max_workloads",
        "state.max_workloads = 5000: give 1 to 4096",
    );
    assert_invalid("[detect]\nseason_s = 1000\n", "detect.season_s", "detect.season_s = 1000: give a whole number of season_bucket_s (900), at most 2016 of them and at most a week (604800)");
    assert_invalid(
        "[detect]\nseason_bucket_s = 1\n",
        "detect.season_bucket_s",
        "detect.season_bucket_s = 1: give one window (5 s) to 86400",
    );
    assert_invalid(
        "[detect]\nseason_history = 0\n",
        "detect.season_history",
        "detect.season_history = 0: give 1 to 31 seasons",
    );
    assert_invalid(
        "[detect]\nhistory_days = 0\n",
        "detect.history_days",
        "detect.history_days = 0: give 1 to 90",
    );
    assert_invalid(
        "[detect]\ndrift_window_days = 8\n",
        "detect.drift_window_days",
        "detect.drift_window_days = 8: give 1 to history_days (7)",
    );
    assert_invalid(
        "[detect]\ndrift_pct_per_week = -1\n",
        "detect.drift_pct_per_week",
        "detect.drift_pct_per_week = -1: give a percentage above 0 (3: the seeds' figure)",
    );
    assert!(Config::parse("[detect]\nseason_s = 604800\nseason_bucket_s = 3600\nhistory_days = 28\ndrift_window_days = 14\n").is_ok());
}
