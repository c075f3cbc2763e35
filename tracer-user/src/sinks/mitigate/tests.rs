use super::*;
use crate::alert::{change::Change, change::Measure, tests::record};

fn cfg() -> MitigateConfig {
    MitigateConfig {
        enabled: true,
        preemptible: vec!["batch/*".into(), "cgroup:/hogs*".into()],
        ..MitigateConfig::default()
    }
}

/// A page by two aggressors that changed: batch/trainer (preemptible) and serving/etl (not),
/// and an unchanged batch/idle neighbour.
fn page(state: AlertState) -> AlertChange {
    let mut r = record(state);
    let changed = Some(Change {
        measure: Measure::ThreadsPerS,
        before: 0.0,
        now: 1e8,
        arrived: true,
    });
    let mut trainer = r.aggressors[0].clone();
    trainer.workload = Some("batch/trainer".into());
    trainer.change = changed;
    let mut etl = trainer.clone();
    (etl.pid, etl.workload) = (21, Some("serving/etl".into()));
    let mut idle = trainer.clone();
    (idle.pid, idle.workload, idle.change) = (22, Some("batch/idle".into()), None);
    r.aggressors = vec![trainer, etl, idle];
    r
}

fn workloads(a: &[Action]) -> Vec<(&str, u32, bool)> {
    a.iter()
        .map(|a| (a.workload.as_str(), a.pid, a.dry_run))
        .collect()
}

#[test]
fn a_page_caps_only_the_preemptible_aggressors_that_changed_and_its_end_undoes_them() {
    let mut p = Plans::default();
    let (event, acts) = p.on(&page(AlertState::Firing), &cfg(), 0.0).unwrap();
    assert_eq!(
        (event, workloads(&acts)),
        ("act", vec![("batch/trainer", 20, true)])
    );
    assert_eq!(
        (acts[0].cpu_max.as_str(), acts[0].max_hold_s),
        ("20000 100000", 600)
    );
    // Told once: the same firing page again plans nothing.
    assert_eq!(p.on(&page(AlertState::Firing), &cfg(), 5.0), None);
    let (event, undone) = p.on(&page(AlertState::Resolved), &cfg(), 60.0).unwrap();
    assert_eq!(
        (event, workloads(&undone)),
        ("undo", vec![("batch/trainer", 20, true)])
    );
    assert_eq!(p.on(&page(AlertState::Resolved), &cfg(), 61.0), None);
}

#[test]
fn below_page_without_a_cause_or_within_the_interval_nothing_is_capped() {
    let mut p = Plans::default();
    let mut critical = page(AlertState::Firing);
    critical.severity = Severity::Critical;
    assert_eq!(p.on(&critical, &cfg(), 0.0), None);
    let mut own = page(AlertState::Firing);
    own.cause = Cause::WorkloadChange;
    assert_eq!(
        p.on(&own, &cfg(), 0.0).map(|(e, a)| (e, a.len())),
        Some(("act", 0))
    );
    p.on(&page(AlertState::Resolved), &cfg(), 1.0);
    // The trainer capped at 10 s; again at 200 s (within 300 s): told, not capped; at 320 s: capped.
    let mut again = |at: f64| {
        let a = p.on(&page(AlertState::Firing), &cfg(), at).unwrap().1;
        p.on(&page(AlertState::Resolved), &cfg(), at + 1.0);
        workloads(&a).len()
    };
    assert_eq!((again(10.0), again(200.0), again(320.0)), (1, 0, 1));
}

#[test]
fn a_cpu_preemptor_is_matched_by_its_cgroup_and_the_body_carries_the_verdict() {
    let mut p = Plans::default();
    let mut cpu = page(AlertState::Firing);
    cpu.cause = Cause::CpuContention;
    let mut hog = cpu.aggressors[0].clone();
    (hog.pid, hog.workload, hog.cgroup) = (30, None, Some("/hogs/a".into()));
    cpu.aggressors = vec![hog];
    let (event, acts) = p.on(&cpu, &cfg(), 0.0).unwrap();
    assert_eq!(workloads(&acts), vec![("cgroup:/hogs/a", 30, true)]);
    let b = body(event, &cpu, &acts, true);
    assert_eq!(
        (
            &b["kind"],
            &b["event"],
            &b["cause"],
            &b["victim"]["pid"],
            &b["verdict"]["alert"]
        ),
        (
            &json!("mitigation"),
            &json!("act"),
            &json!("cpu_contention"),
            &json!(10),
            &json!(cpu.alert)
        )
    );
    assert_eq!(b["actions"][0]["cgroup"], "/hogs/a");
}

#[test]
fn the_config_is_checked_and_acting_for_real_needs_the_actuator() {
    let bad = |f: fn(&mut MitigateConfig)| {
        let mut c = cfg();
        f(&mut c);
        c.validate().unwrap_err().to_string()
    };
    assert!(cfg().validate().is_ok());
    assert!(bad(|c| c.cpu_max = "max".into())
        .contains("mitigate.cpu_max = \"max\": give \"QUOTA PERIOD\""));
    assert!(bad(|c| c.webhook = Some("ftp://x".into())).contains("mitigate.webhook"));
    assert!(bad(|c| c.preemptible = vec!["[".into()]).contains("is not a glob"));
    assert!(bad(|c| c.max_hold_s = 0).contains("mitigate.max_hold_s = 0"));
    assert!(bad(|c| c.dry_run = false).contains("needs mitigate.actuator"));
    assert!(bad(|c| c.actuator = Some("run/a.sock".into())).contains("absolute path"));
    let mut real = cfg();
    (real.dry_run, real.actuator) = (false, Some("/run/cudatrace/actuator.sock".into()));
    assert!(real.validate().is_ok());
}
