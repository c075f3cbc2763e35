//! `cudatrace explain`: per incident, one screen: what rose and by how much, the causal chain
//! the verdict used, who changed (before → now), and what to do. From the live daemon's
//! `/alerts` (pending and firing), and from the incident archive (resolved), within `--since`.
//! Plain text for a terminal, `--json` (one object a line) for scripts.
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context as _, Result};
use serde_json::{json, Value};

use crate::{cli::ExplainArgs, sinks::archive, text::printable};

/// Largest `/alerts` answer read (a daemon holds at most a few thousand alerts).
const MAX_BODY: u64 = 16 << 20;

fn text(v: &Value, k: &str) -> String {
    printable(v[k].as_str().unwrap_or("-")).into_owned()
}

fn who(p: &Value) -> String {
    format!(
        "{} (pid {})",
        printable(p["comm"].as_str().unwrap_or("?")),
        p["pid"].as_u64().unwrap_or(0)
    )
}

/// A party's change in words: `threads_per_s 1.000e6 → 5.000e6`.
fn change(p: &Value) -> String {
    let c = &p["change"];
    let Some(m) = c["measure"].as_str() else {
        return String::new();
    };
    let (b, n) = (
        c["before"].as_f64().unwrap_or(0.0),
        c["now"].as_f64().unwrap_or(0.0),
    );
    if c["arrived"].as_bool() == Some(true) {
        format!("{} 0 → {n:.3e} (arrived)", printable(m))
    } else {
        format!("{} {b:.3e} → {n:.3e}", printable(m))
    }
}

/// A `[before, now]` pair of an archive or an `/alerts` answer, each made printable; `None`
/// when it is not an array of at least two (a damaged archive line must not stop explain).
fn pair(v: &Value) -> Option<(String, String)> {
    match v.as_array()?.as_slice() {
        [a, b, ..] => Some((
            printable(&a.to_string()).into_owned(),
            printable(&b.to_string()).into_owned(),
        )),
        _ => None,
    }
}

/// The advice of a cause by its JSON name.
fn advice(cause: &str) -> &'static str {
    crate::alert::Cause::from_name(cause).map_or("", |c| c.advice())
}

/// One incident as a screen of text.
pub fn screen(v: &Value) -> String {
    let e = &v["evidence"];
    let mut out = Vec::new();
    let state = v["state"].as_str().unwrap_or("resolved");
    let when = match state {
        "resolved" => format!("{} to {}", text(v, "started_at"), text(v, "ended_at")),
        s => format!("{} since {}", printable(s), text(v, "started_at")),
    };
    out.push(format!(
        "{}  {}  {when}  GPU {}",
        text(v, "alert"),
        text(v, "severity"),
        text(v, "gpu")
    ));
    out.push(format!(
        "  what rose: {}'s {} {:.3e} {} against its baseline p99 {:.3e} ({:.1}x)",
        who(&v["victim"]),
        text(e, "signal"),
        e["now"].as_f64().unwrap_or(0.0),
        text(e, "unit"),
        e["baseline_p99"].as_f64().unwrap_or(0.0),
        e["ratio"].as_f64().unwrap_or(0.0)
    ));
    out.push(format!("  cause: {}", text(v, "cause")));
    let chain: Vec<String> = e["chain"]
        .as_array()
        .map(|c| {
            c.iter()
                .filter_map(|l| l.as_str())
                .map(|l| printable(l).into_owned())
                .collect()
        })
        .unwrap_or_default();
    let work = &e["victim_work"];
    let mut facts = chain;
    if let Some((a, b)) = pair(&work["threads_per_launch"]) {
        facts.push(format!("the victim's threads per launch {a} → {b}"));
    }
    if let (Some(k), Some((a, b))) = (work["kernel"].as_str(), pair(&work["grid"])) {
        facts.push(format!("its kernel {}: grid {a} → {b}", printable(k)));
    }
    if let Some((a, b)) = pair(&e["run_delay_s_per_s"]) {
        facts.push(format!("its run-queue delay {a} → {b} s/s"));
    }
    for (i, f) in facts.iter().enumerate() {
        out.push(format!("    {}. {f}", i + 1));
    }
    let parties = v["aggressors"].as_array().cloned().unwrap_or_default();
    if parties.is_empty() {
        out.push("  who: nobody else changed".into());
    } else {
        for p in &parties {
            let cg = p["cgroup"]
                .as_str()
                .map_or(String::new(), |c| format!(" cgroup {}", printable(c)));
            out.push(format!(
                "  who: {}{cg} {:.0}%: {}",
                who(p),
                p["share"].as_f64().unwrap_or(0.0) * 100.0,
                change(p)
            ));
        }
    }
    out.push(format!(
        "  what to do: {}",
        advice(v["cause"].as_str().unwrap_or(""))
    ));
    out.join("\n")
}

/// The live daemon's pending and firing alerts, over TLS with `--ca-file` and with basic auth
/// when `--user` and `--password-file` are given.
fn live(base: &str, args: &ExplainArgs) -> Result<Vec<Value>> {
    use ureq::tls::{RootCerts, TlsConfig};
    let mut config = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(10)))
        .http_status_as_error(false);
    if let Some(ca) = &args.ca_file {
        let certs = crate::bounded::pem_certificates(ca).map_err(anyhow::Error::msg)?;
        config = config.tls_config(
            TlsConfig::builder()
                .root_certs(RootCerts::new_with_certs(&certs))
                .build(),
        );
    }
    let agent: ureq::Agent = config.build().into();
    let url = format!("{}/alerts", base.trim_end_matches('/'));
    let mut request = agent.get(&url);
    if let (Some(user), Some(file)) = (&args.user, &args.password_file) {
        use base64::Engine as _;
        let password = std::fs::read_to_string(file).with_context(|| {
            format!(
                "cannot read the password file {}",
                printable(&file.display().to_string())
            )
        })?;
        let pair = format!("{user}:{}", password.trim_end_matches(['\n', '\r']));
        let encoded = base64::engine::general_purpose::STANDARD.encode(pair);
        request = request.header("Authorization", format!("Basic {encoded}"));
    }
    let mut answer = request
        .call()
        .with_context(|| format!("cannot read {url}: is `cudatrace run` listening there (https with a web config: give --ca-file)?"))?;
    match answer.status().as_u16() {
        401 => bail!(
            "{url} answered 401: give --user and --password-file for the daemon's basic_auth_users"
        ),
        s if !(200..300).contains(&s) => bail!("{url} answered {s}"),
        _ => {}
    }
    let body = crate::bounded::body(&mut answer, MAX_BODY, &url, "the alerts")
        .map_err(anyhow::Error::msg)?;
    let v: Vec<Value> = serde_json::from_slice(&body)
        .with_context(|| format!("{url} did not answer a list of alerts"))?;
    Ok(v)
}

/// Runs `cudatrace explain`.
pub fn run(args: ExplainArgs) -> Result<()> {
    let archive_path = super::incidents::archive_of(&args.from)?;
    let daemon = args.daemon.clone().or_else(|| {
        archive_path
            .is_none()
            .then(|| "http://127.0.0.1:9464".to_owned())
    });
    if archive_path.is_none() && daemon.is_none() {
        bail!("nothing to explain from: give --daemon URL, --archive PATH or --config FILE");
    }
    let since = args.from.since.map(|d| SystemTime::now() - d);
    let mut incidents: Vec<Value> = Vec::new();
    if let Some(base) = &daemon {
        incidents.extend(live(base, &args)?);
    }
    if let Some(path) = &archive_path {
        let shown = printable(&path.display().to_string()).into_owned();
        let read = archive::read(path, since)
            .with_context(|| format!("cannot read the incident archive {shown}"))?;
        incidents.extend(read.newest_first());
    }
    if args.from.json {
        for v in &incidents {
            let out = json!({
                "alert": v["alert"], "state": v["state"].as_str().unwrap_or("resolved"),
                "cause": v["cause"], "severity": v["severity"], "gpu": v["gpu"],
                "victim": v["victim"], "aggressors": v["aggressors"],
                "evidence": v["evidence"], "started_at": v["started_at"],
                "advice": advice(v["cause"].as_str().unwrap_or("")),
            });
            println!("{out}");
        }
        return Ok(());
    }
    for v in &incidents {
        println!("{}\n", screen(v));
    }
    if incidents.is_empty() {
        log::info!("no incidents to explain");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_screen_says_what_rose_the_chain_who_and_what_to_do() {
        let v = json!({
            "alert": "CudatraceComputeContention", "state": "firing", "severity": "page",
            "cause": "compute_contention", "gpu": "0", "started_at": "2026-12-05T14:02:00Z",
            "victim": {"pid": 10, "comm": "model-server"},
            "aggressors": [{"pid": 20, "comm": "trainer\u{1b}[2J", "share": 1.0,
                "change": {"measure": "threads_per_s", "before": 0.0, "now": 1.3e8, "arrived": true}}],
            "evidence": {"signal": "wait_per_launch", "unit": "seconds", "now": 0.00094,
                "baseline_p99": 0.00011, "ratio": 8.5,
                "chain": ["NVML: GPU 0 SM utilization 97%", "changed: trainer (pid 20): threads_per_s 0 → 1.300e8 (arrived)"],
                "victim_work": {"threads_per_launch": [128000.0, 128000.0]}}
        });
        let s = screen(&v);
        let lines: Vec<&str> = s.lines().collect();
        assert_eq!(
            lines[0],
            "CudatraceComputeContention  page  firing since 2026-12-05T14:02:00Z  GPU 0"
        );
        assert_eq!(lines[1], "  what rose: model-server (pid 10)'s wait_per_launch 9.400e-4 seconds against its baseline p99 1.100e-4 (8.5x)");
        assert_eq!(lines[2], "  cause: compute_contention");
        assert_eq!(lines[3], "    1. NVML: GPU 0 SM utilization 97%");
        assert_eq!(
            lines[5],
            "    3. the victim's threads per launch 128000.0 → 128000.0"
        );
        // The tenant's escape is shown escaped.
        assert_eq!(
            lines[6],
            "  who: trainer\\u{1b}[2J (pid 20) 100%: threads_per_s 0 → 1.300e8 (arrived)"
        );
        assert!(lines[7].starts_with("  what to do: move the named job to another GPU"));
        // A workload change names nobody and says to look at the requests.
        let w = json!({"alert": "CudatraceWorkloadChange", "cause": "workload_change",
            "victim": {"pid": 1, "comm": "s"}, "evidence": {"victim_work":
            {"threads_per_launch": [8192.0, 40960.0], "kernel": "gemm", "grid": [[64, 1, 1], [320, 1, 1]]}}});
        let s = screen(&w);
        assert!(
            s.contains("its kernel gemm: grid [64,1,1] → [320,1,1]"),
            "{s}"
        );
        assert!(s.contains("who: nobody else changed"), "{s}");
        assert!(s.contains("look at the request sizes"), "{s}");
    }

    #[test]
    fn a_damaged_incident_is_shown_without_its_broken_pairs() {
        // Arrays shorter than a pair (an archive line edited by hand, or cut short) once
        // panicked explain; a bidi override in a kernel name is escaped.
        let v = json!({"alert": "CudatraceWorkloadChange", "cause": "workload_change",
            "victim": {"pid": 1, "comm": "s"}, "evidence": {"run_delay_s_per_s": [0.5],
            "victim_work": {"threads_per_launch": [], "kernel": "g\u{202E}mm", "grid": [[64, 1, 1]]}}});
        let s = screen(&v);
        assert!(!s.contains("threads per launch"), "{s}");
        assert!(!s.contains("grid"), "{s}");
        assert!(!s.contains("run-queue delay"), "{s}");
        let v = json!({"victim": {"pid": 1, "comm": "s"}, "evidence": {"victim_work":
            {"kernel": "g\u{202E}mm", "grid": [["\u{202E}x"], [2]]}}});
        assert!(
            screen(&v).contains("its kernel g\\u{202e}mm: grid [\"\\u{202e}x\"] → [2]"),
            "{}",
            screen(&v)
        );
    }
}
