//! Causal verdicts end to end: every scenario runs beside a light neighbour that is unchanged
//! from start to end, which must never be named. One test runs the matrix and prints it (the
//! expected cause and parties against what the victim's first alert said), and fails on any
//! false blame or wrong cause.
use std::{
    fs,
    process::{Child, Command},
    time::{Duration, Instant},
};

use integration_tests::{
    alerting::{daemon_with_hook, learn, looping},
    device_file, env,
    guards::{Cgroup, TempDir},
    servers::Webhook,
    Env,
};
use serde_json::Value;

/// Tiers and times shortened; every verdict decided in the first alert (pending).
const CONFIG: &str = "[detect]\nfiring_after_s = 15\nresolve_after_s = 20\n";

/// What a scenario expects of the victim's first alert: its cause and who is named (pids).
struct Expect {
    cause: &'static str,
    named: Vec<u64>,
}

/// One row of the matrix.
struct Row {
    scenario: &'static str,
    expected: String,
    got: String,
    /// Alerts (of anyone) naming the unchanged neighbour.
    false_blame: usize,
    ok: bool,
}

/// CPU hogs pinned to one core, in a cgroup of their own.
struct Hogs {
    children: Vec<Child>,
    cgroup: Cgroup,
}

impl Hogs {
    fn start(n: usize, cpu: &str) -> Hogs {
        let cgroup = Cgroup::new("hogs");
        let children: Vec<Child> = (0..n)
            .map(|_| {
                Command::new("taskset")
                    .args(["-c", cpu, "sh", "-c", "while :; do :; done"])
                    .spawn()
                    .expect("taskset")
            })
            .collect();
        for c in &children {
            fs::write(cgroup.path().join("cgroup.procs"), c.id().to_string())
                .expect("move a hog into its cgroup");
        }
        Hogs { children, cgroup }
    }
}

impl Drop for Hogs {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn pin(pid: u64, cpu: &str) {
    let ok = Command::new("taskset")
        .args(["-a", "-p", "-c", cpu, &pid.to_string()])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(ok, "taskset -p {pid}");
}

/// Runs one scenario: a victim (1 ms kernels, a wait after each) and an unchanged light
/// neighbour (20 µs kernels, a wait after each) on one simulated GPU; once the victim's
/// baseline is learned, `change` makes the change and says what is expected.
fn scenario(
    env: &Env,
    name: &'static str,
    (victim_vars, victim_cgroup, early): (&[(&str, &str)], Option<&Cgroup>, Option<&str>),
    change: impl FnOnce(
        &Env,
        &[(&str, &str)],
        u64,
        Option<u64>,
    ) -> (Expect, Vec<Box<dyn std::any::Any>>),
) -> Row {
    let dir = TempDir::new(&format!("causes-{name}"));
    let hook = Webhook::start();
    let (daemon, _listen) = daemon_with_hook(env, &dir, CONFIG, &hook, None);
    let dev = device_file(&format!("causes-{name}"));
    let vars = [
        ("CUDA_STANDIN_DEVICE", dev.as_str()),
        ("CUDA_STANDIN_NS_PER_BLOCK", "1000"),
        ("CUDA_VISIBLE_DEVICES", "0"),
    ];
    let mut vv: Vec<(&str, &str)> = vars.to_vec();
    vv.extend_from_slice(victim_vars);
    let mut victim = looping(env, 200.0, 1000, 1).comm("model-server").vars(&vv);
    if let Some(cg) = victim_cgroup {
        victim = victim.cgroup(cg.path());
    }
    let victim = victim.spawn();
    let light = looping(env, 200.0, 20, 1).comm("light").vars(&vars).spawn();
    // A third process from the start, whose grid grows when `early` (WORKLOAD_GRID_AFTER) says.
    let grower = early.map(|after| {
        let mut v = vars.to_vec();
        v.push(("WORKLOAD_GRID_AFTER", after));
        looping(env, 200.0, 100, 1).comm("grower").vars(&v).spawn()
    });
    let (victim_pid, light_pid) = (victim.pid(), light.pid());
    learn(&daemon, victim_pid);
    let quiet_before = hook.received().len();
    let started = Instant::now();
    let (expect, _keep) = change(env, &vars, victim_pid, grower.as_ref().map(|g| g.pid()));
    let first = hook.wait_for(Duration::from_secs(75), |v: &Value| {
        v["victim"]["pid"].as_u64() == Some(victim_pid) && v["state"] == "pending"
    });
    // Let the other alerts of the window arrive too.
    std::thread::sleep(Duration::from_secs(6));
    let all = hook.received();
    let false_blame = all
        .iter()
        .filter(|r| {
            r["aggressors"]
                .as_array()
                .is_some_and(|a| a.iter().any(|p| p["pid"].as_u64() == Some(light_pid)))
        })
        .count();
    let expected = format!("{} {:?}", expect.cause, expect.named);
    let (got, ok) = match &first {
        Some(r) => {
            let named: Vec<u64> = r["aggressors"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a["pid"].as_u64().unwrap())
                .collect();
            let cause = r["cause"].as_str().unwrap_or("?").to_owned();
            let ok = cause == expect.cause && named == expect.named;
            (format!("{cause} {named:?}"), ok)
        }
        None => ("no alert".to_owned(), expect.cause == "none"),
    };
    eprintln!(
        "causes: {name}: expected {expected}, got {got} after {:.1} s, {} alerts naming the unchanged neighbour; first record: {}",
        started.elapsed().as_secs_f64(),
        false_blame,
        first.map_or("none".into(), |r| r.to_string())
    );
    Row {
        scenario: name,
        expected,
        got,
        false_blame,
        ok: ok && false_blame == 0 && quiet_before == 0,
    }
}

#[test]
fn the_matrix_names_who_changed_and_nobody_else() {
    let Some(env) = env() else { return };
    let mut rows = Vec::new();
    // A heavy job arrives on the GPU.
    rows.push(scenario(
        &env,
        "aggressor_arrives",
        (&[], None, None),
        |env, vars, _, _| {
            let heavy = looping(env, 60.0, 4000, 2)
                .comm("trainer")
                .vars(vars)
                .spawn();
            let pid = heavy.pid();
            let keep: Vec<Box<dyn std::any::Any>> = vec![Box::new(heavy)];
            (
                Expect {
                    cause: "compute_contention",
                    named: vec![pid],
                },
                keep,
            )
        },
    ));
    // An existing neighbour grows only its grid (same launches, 20x the blocks).
    rows.push(scenario(
        &env,
        "neighbour_grows_its_grid",
        (&[], None, Some("45:2000")),
        |_, _, _, grower| {
            // It ran from the start with 100 blocks; the same launches with 2,000 from 45 s on.
            let pid = grower.expect("the grower");
            (
                Expect {
                    cause: "compute_contention",
                    named: vec![pid],
                },
                vec![],
            )
        },
    ));
    // The victim's own kernels grow 5x (its requests changed), 45 s after it started.
    rows.push(scenario(
        &env,
        "victims_own_work_grows",
        (&[("WORKLOAD_GRID_AFTER", "45:5000")], None, None),
        |_, _, _, _| {
            (
                Expect {
                    cause: "workload_change",
                    named: vec![],
                },
                vec![],
            )
        },
    ));
    // CPU hogs take the victim's core; device time is unaffected.
    let victim_cg = Cgroup::new("victim");
    rows.push(scenario(
        &env,
        "cpu_hogs_on_its_core",
        (&[], Some(&victim_cg), None),
        |_, _, victim, _| {
            pin(victim, "0");
            let hogs = Hogs::start(3, "0");
            let first = hogs.children[0].id();
            let _ = &hogs.cgroup;
            // The named preemptor is the hogs' cgroup, by its first process.
            let keep: Vec<Box<dyn std::any::Any>> = vec![Box::new(hogs)];
            (
                Expect {
                    cause: "cpu_contention",
                    named: vec![u64::from(first)],
                },
                keep,
            )
        },
    ));
    eprintln!("causes: the confusion matrix (victim's first alert):");
    eprintln!(
        "causes: {:<28} {:<42} {:<42} {}",
        "scenario", "expected", "got", "false blame"
    );
    for r in &rows {
        eprintln!(
            "causes: {:<28} {:<42} {:<42} {}",
            r.scenario, r.expected, r.got, r.false_blame
        );
    }
    let right = rows.iter().filter(|r| r.ok).count();
    eprintln!("causes: {right} of {} right", rows.len());
    assert!(
        rows.iter().all(|r| r.ok),
        "a wrong verdict or a false blame: see the matrix above"
    );
}
