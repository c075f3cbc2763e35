//! Saving and loading the per-workload memory: round trip, and every file that cannot be used.
use std::{os::unix::fs::PermissionsExt as _, sync::Arc, time::SystemTime};

use super::*;
use crate::{config::DetectConfig, detect::Detector};

/// A fresh directory under the temporary one.
fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cudatrace-state-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A memory whose workload `w` learned 20 windows of 1000 ns (ready) at one a minute.
fn learned(cfg: &DetectConfig, names: &[&str]) -> Memory {
    let mut m = Detector::memory_for(cfg, 256);
    let season = *m.season();
    for w in names {
        let w: Arc<str> = Arc::from(*w);
        for k in 0..20 {
            m.series(&w, 0, 1_800_000_000.0 + 60.0 * k as f64).learn(
                1000.0,
                1_800_000_000.0 + 60.0 * k as f64,
                &season,
                168,
            );
        }
    }
    m
}

#[test]
fn a_saved_memory_is_resumed_whole() {
    let cfg = DetectConfig::default();
    let d = dir("roundtrip");
    let path = d.join(FILE);
    let m = learned(&cfg, &["serving/llm/server", "EXE:trainer"]);
    let bytes = save(&path, &m, SystemTime::now()).unwrap();
    assert!(bytes > 100, "{bytes}");
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    assert!(!d.join(format!(".{FILE}.tmp")).exists());
    let mut back = Detector::memory_for(&cfg, 256);
    assert_eq!(load(&path, &mut back, &cfg), Loaded::Read(2, 0));
    let season = *back.season();
    let w: Arc<str> = Arc::from("serving/llm/server");
    let s = back.series(&w, 0, 1_800_001_300.0);
    assert_eq!(
        s.p99(1_800_001_300.0, &season),
        m_p99(&m, "serving/llm/server")
    );
    assert!(s.p99(1_800_001_300.0, &season).is_some());
    let _ = std::fs::remove_dir_all(&d);
}

fn m_p99(m: &Memory, w: &str) -> Option<f64> {
    let (_, r) = m.iter().find(|(k, _)| &***k == w)?;
    r.series[0].baseline.p99()
}

#[test]
fn a_file_that_cannot_be_used_is_set_aside_and_starts_fresh() {
    let cfg = DetectConfig::default();
    let d = dir("bad");
    let path = d.join(FILE);
    let good = {
        save(&path, &learned(&cfg, &["a"]), SystemTime::now()).unwrap();
        std::fs::read(&path).unwrap()
    };
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("truncated", good[..good.len() / 2].to_vec(), "not a whole cudatrace-baselines file"),
        ("empty", Vec::new(), "it is empty"),
        ("garbage", b"\x00\xffnot json".to_vec(), "not a whole cudatrace-baselines file"),
        (
            "foreign",
            br#"{"format":"other","version":1,"saved_at":0,"season_s":86400,"season_bucket_s":900,"workloads":[]}"#.to_vec(),
            "it is not a cudatrace-baselines file",
        ),
        (
            "future",
            br#"{"format":"cudatrace-baselines","version":9,"saved_at":0,"season_s":86400,"season_bucket_s":900,"workloads":[]}"#.to_vec(),
            "it is version 9",
        ),
    ];
    for (name, bytes, why) in cases {
        std::fs::write(&path, &bytes).unwrap();
        let mut m = Detector::memory_for(&cfg, 256);
        match load(&path, &mut m, &cfg) {
            Loaded::SetAside(w) => assert!(w.contains(why), "{name}: {w}"),
            other => panic!("{name}: {other:?}"),
        }
        assert!(m.is_empty(), "{name}");
        assert!(!path.exists(), "{name}");
        assert_eq!(
            std::fs::read(path.with_extension("json.bad")).unwrap(),
            bytes,
            "{name}"
        );
    }
    // Too large: refused unread.
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(MAX_FILE + 1).unwrap();
    let mut m = Detector::memory_for(&cfg, 256);
    assert!(
        matches!(load(&path, &mut m, &cfg), Loaded::SetAside(w) if w.contains("over the 64 MiB"))
    );
    // A symlink is not followed.
    std::os::unix::fs::symlink("/etc/passwd", &path).unwrap();
    assert_eq!(
        load(&path, &mut m, &cfg),
        Loaded::SetAside("it is a symlink".into())
    );
    assert_eq!(load(&path, &mut m, &cfg), Loaded::Missing);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn hostile_contents_are_refused_workload_by_workload() {
    let cfg = DetectConfig::default();
    let d = dir("hostile");
    let path = d.join(FILE);
    save(
        &path,
        &learned(&cfg, &["ok", "neg", "long-history"]),
        SystemTime::now(),
    )
    .unwrap();
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    for w in v["workloads"].as_array_mut().unwrap() {
        match w[0].as_str().unwrap() {
            "neg" => w[1]["series"][0]["baseline"]["level"] = (-5.0).into(),
            "long-history" => {
                let hour = serde_json::json!({"hour": 1, "n": 1, "sum": 1.0, "sum_d": 1.0});
                w[1]["series"][1]["history"]["hours"] = vec![hour; 10_000].into();
            }
            _ => {}
        }
    }
    let long = "x".repeat(300);
    let first = v["workloads"][0][1].clone();
    v["workloads"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!([long, first]));
    std::fs::write(&path, serde_json::to_vec(&v).unwrap()).unwrap();
    let mut m = Detector::memory_for(&cfg, 256);
    assert_eq!(load(&path, &mut m, &cfg), Loaded::Read(1, 3));
    assert_eq!(
        m.iter().map(|(k, _)| k.to_string()).collect::<Vec<_>>(),
        ["ok"]
    );
    // Past max_workloads the rest are refused.
    save(
        &path,
        &learned(&cfg, &["a", "b", "c", "d"]),
        SystemTime::now(),
    )
    .unwrap();
    let mut small = Detector::memory_for(&cfg, 3);
    assert_eq!(load(&path, &mut small, &cfg), Loaded::Read(3, 1));
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn the_directory_is_made_private() {
    let d = dir("prepare");
    // SAFETY: getuid and getgid have no preconditions.
    let me = unsafe { (libc::getuid(), libc::getgid()) };
    let sub = prepare::prepare(&d, me).unwrap();
    let meta = std::fs::symlink_metadata(&sub).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o700);
    // A symlink in its place is refused.
    std::fs::remove_dir(&sub).unwrap();
    std::os::unix::fs::symlink("/tmp", &sub).unwrap();
    let e = prepare::prepare(&d, me).unwrap_err().to_string();
    assert!(e.contains("is not a directory"), "{e}");
    let _ = std::fs::remove_dir_all(&d);
}
