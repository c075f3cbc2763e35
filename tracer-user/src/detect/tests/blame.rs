//! Blame: who an alert names when victims share a neighbour, and when a victim starts anew
//! next to its aggressor.
use super::*;

#[test]
fn two_victims_of_one_neighbour_share_an_incident() {
    let mut d = Det::new(DetectConfig::default(), 100, 0.0);
    let id = Arc::new(Identity {
        cuda_visible_devices: Some("0".into()),
        ..Default::default()
    });
    let mut all = Vec::new();
    for k in 0..16u32 {
        let wait = if k >= 10 { 4_000_000 } else { 1_000_000 };
        window(&mut d, 1, &id, 1000, wait);
        window(&mut d, 3, &id, 1000, wait);
        if k >= 10 {
            window(&mut d, 2, &id, 500, 1_000_000);
        }
        let end = f64::from(k + 1) * 5.0;
        d.evaluate(end, wall(end), &[]);
        all.extend(d.take_changes());
    }
    let mut pending: Vec<&Record> = all
        .iter()
        .filter(|r| r.state == State::Pending && r.evidence.signal == "wait_per_launch")
        .collect();
    pending.sort_by_key(|r| r.victim.pid);
    assert_eq!(
        pending.iter().map(|r| r.victim.pid).collect::<Vec<_>>(),
        vec![1, 3]
    );
    // Each victim waits longer, but the other victim's submitted work did not change: only the
    // arrived neighbour is named, and both alerts are one incident.
    for p in &pending {
        assert_eq!(
            p.aggressors.iter().map(|a| a.pid).collect::<Vec<_>>(),
            vec![2]
        );
        let c = p.aggressors[0].change.expect("its change");
        assert_eq!((c.before, c.now, c.arrived), (0.0, 100.0, true));
    }
    assert_eq!(pending[0].incident, pending[1].incident);
    assert_eq!(
        (
            pending[0].incident.aggressors.as_str(),
            pending[0].incident.gpu.as_str()
        ),
        ("2:job2", "0")
    );
}

/// A model server learns its waits and exits; a trainer starts; a new process of the same
/// workload starts next to it and breaches at once: the trainer, which started after the
/// workload's last normal window, arrived, and is named.
#[test]
fn a_process_started_anew_next_to_its_aggressor_names_it() {
    let mut d = Det::new(DetectConfig::default(), 100, 0.0);
    let server = Arc::new(Identity {
        exe: Some("/usr/bin/server".into()),
        cuda_visible_devices: Some("0".into()),
        ..Default::default()
    });
    let trainer = Arc::new(Identity {
        exe: Some("/usr/bin/trainer".into()),
        cuda_visible_devices: Some("0".into()),
        ..Default::default()
    });
    let mut all = Vec::new();
    for k in 0..20u32 {
        let end = f64::from(k + 1) * 5.0;
        match k {
            0..10 => window(&mut d, 1, &server, 1000, 1_000_000),
            10 => {
                d.forget(1, wall(end));
                // The same executable and name: the same workload as pid 1.
                d.r.insert(3, Comm::from("job1"), (*server).clone());
            }
            _ => window(&mut d, 3, &server, 1000, 4_000_000),
        }
        if k >= 10 {
            window(&mut d, 2, &trainer, 500, 1_000_000);
        }
        d.evaluate(end, wall(end), &[]);
        all.extend(d.take_changes());
    }
    let pending = all
        .iter()
        .find(|r| r.victim.pid == 3 && r.state == State::Pending)
        .unwrap_or_else(|| panic!("no alert of pid 3: {all:?}"));
    assert_eq!(pending.alert, "CudatraceComputeContention", "{pending:?}");
    assert_eq!(
        pending.aggressors.iter().map(|a| a.pid).collect::<Vec<_>>(),
        vec![2]
    );
    assert!(pending.aggressors[0].change.expect("its change").arrived);
}
