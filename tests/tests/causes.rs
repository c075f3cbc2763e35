//! Causal verdicts end to end: every scenario runs beside a light neighbour that is unchanged
//! from start to end, which must never be named. One test runs the matrix and prints it (the
//! expected cause and parties against what the victim's first alert said), and fails on any
//! false blame or wrong cause.
use std::{
    fs,
    path::{Path, PathBuf},
    process::{Child, Command},
    time::{Duration, Instant},
};

use integration_tests::{
    alerting::{learn, looping},
    device_file, env,
    guards::{Cgroup, TempDir},
    servers::Webhook,
    Cudatrace, Env, Running,
};
use serde_json::Value;

/// Two-second windows (the baseline in about 12 s) and the tiers' times shortened.
const CONFIG: &str = "[detect]\nwindow_s = 2\nfiring_after_s = 15\nresolve_after_s = 20\n";

/// NVML's GPU 0 as the untraced scenario starts: 40% busy, 8 of 80 GiB used.
const GPU0: &str = "gpu 0 uuid=GPU-00000000-1111-2222-3333-444444444444 sm=40 mem=10 total=85899345920 used=8589934592 temp=60 power_mw=200000 sm_clock=1980 reasons=0x0 pcie_tx_kbs=0 pcie_rx_kbs=0\n";

/// What a scenario needs besides the victim and the light neighbour.
#[derive(Default)]
struct Setup<'a> {
    /// More variables of the victim.
    victim_vars: &'a [(&'a str, &'a str)],
    /// The victim's cgroup.
    victim_cgroup: Option<&'a Cgroup>,
    /// A third process from the start: (comm, blocks, WORKLOAD_GRID_AFTER, or None: unchanged).
    early: Option<(&'static str, u32, Option<&'static str>)>,
    /// NVML's stand-in, listing the processes once they run.
    nvml: bool,
    /// The victim and the light neighbour are clients of an MPS server (implies `nvml`): NVML
    /// lists them by its MPS query only, and the server (an untraced process) in its
    /// compute-process list.
    mps: bool,
    /// MIG (implies `nvml`): the victim and the light neighbour on GPU instance 1 of GPU 0.
    mig: bool,
    /// Seconds to wait for the victim's first alert after the change.
    wait_s: u64,
}

/// What a change closure sees.
struct Ctx<'a> {
    env: &'a Env,
    vars: &'a [(&'a str, &'a str)],
    dir: &'a TempDir,
    victim: u64,
    light: u64,
    early: Option<u64>,
    /// NVML's scenario file, when the stand-in is on.
    nvml: Option<PathBuf>,
    /// The MPS server's pid, with `Setup::mps`.
    server: Option<u64>,
    /// When the victim was started.
    victim_started: Instant,
}

/// What a scenario expects of the victim's first alert: its cause and who is named (pids, or
/// `cgroup:PATH` for a CPU preemptor).
struct Expect {
    cause: &'static str,
    named: Vec<String>,
    /// Processes that never changed: none may be named, in any alert.
    unchanged: Vec<u64>,
}

/// One row of the matrix.
struct Row {
    scenario: &'static str,
    expected: String,
    got: String,
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

/// Writes NVML's scenario anew (through a rename, so the stand-in never reads half of it).
fn nvml_write(path: &Path, text: &str) {
    let tmp = path.with_extension("new");
    fs::write(&tmp, text).unwrap();
    fs::rename(&tmp, path).unwrap();
}

/// A cgroup path as cudatrace names it (below the v2 root).
fn cgroup_name(cg: &Cgroup) -> String {
    let p = cg.path().to_string_lossy().into_owned();
    let rel = p
        .strip_prefix("/sys/fs/cgroup/unified")
        .or_else(|| p.strip_prefix("/sys/fs/cgroup"))
        .unwrap_or(&p);
    format!("cgroup:{rel}")
}

/// Runs one scenario: a victim (1 ms kernels, a wait after each) and an unchanged light
/// neighbour (20 µs kernels, a wait after each) on one simulated GPU; once the victim's
/// baseline is learned, `change` makes the change and says what is expected.
fn scenario(
    env: &Env,
    name: &'static str,
    setup: Setup<'_>,
    change: impl FnOnce(&Ctx<'_>) -> (Expect, Vec<Box<dyn std::any::Any>>),
) -> Row {
    let dir = TempDir::new(&format!("causes-{name}"));
    let hook = Webhook::start();
    let config = dir.write("cudatrace.toml", CONFIG);
    let hook_url = format!("http://127.0.0.1:{}/hook", hook.port);
    let nvml_file = (setup.nvml || setup.mps || setup.mig).then(|| dir.write("nvml.txt", GPU0));
    // The MPS server: untraced, it holds the GPU for its clients.
    let mut server = setup.mps.then(|| {
        Command::new("sleep")
            .arg("600")
            .spawn()
            .expect("sleep as the MPS server")
    });
    let server_pid = server.as_ref().map(|c| u64::from(c.id()));
    let nvml_lib = env.libnvml();
    let mut args = vec!["--webhook", &hook_url, "--config", config.to_str().unwrap()];
    let mut daemon_vars = Vec::new();
    if let Some(f) = &nvml_file {
        args.extend(["--nvml-lib", nvml_lib.to_str().unwrap()]);
        daemon_vars.push(("NVML_STANDIN_SCENARIO", f.to_str().unwrap()));
    }
    let (daemon, listen) = Cudatrace::start_daemon_on_loopback(env, &args, &daemon_vars);
    let dev = device_file(&format!("causes-{name}"));
    let vars = [
        ("CUDA_STANDIN_DEVICE", dev.as_str()),
        ("CUDA_STANDIN_NS_PER_BLOCK", "1000"),
        ("CUDA_VISIBLE_DEVICES", "0"),
    ];
    let mut vv: Vec<(&str, &str)> = vars.to_vec();
    vv.extend_from_slice(setup.victim_vars);
    let mut victim = looping(env, 200.0, 1000, 1).comm("model-server").vars(&vv);
    if let Some(cg) = setup.victim_cgroup {
        victim = victim.cgroup(cg.path());
    }
    let victim = victim.spawn();
    let victim_started = Instant::now();
    let light = looping(env, 200.0, 20, 1).comm("light").vars(&vars).spawn();
    let early: Option<Running> = setup.early.map(|(comm, grid, after)| {
        let mut v = vars.to_vec();
        if let Some(after) = after {
            v.push(("WORKLOAD_GRID_AFTER", after));
        }
        looping(env, 200.0, grid, 1).comm(comm).vars(&v).spawn()
    });
    let (victim_pid, light_pid) = (victim.pid(), light.pid());
    if let Some(f) = &nvml_file {
        let (mut mps, serving) = match server_pid {
            Some(pid) => (
                " mps=1",
                format!("proc 0 pid={pid} used=536870912 sm=33 memutil=6\n"),
            ),
            None => ("", String::new()),
        };
        if setup.mig {
            mps = " gi=1";
        }
        nvml_write(
            f,
            &format!("{GPU0}{serving}proc 0 pid={victim_pid} used=4294967296 sm=30 memutil=5{mps}\nproc 0 pid={light_pid} used=1073741824 sm=3 memutil=1{mps}\n"),
        );
    }
    learn(&daemon, victim_pid);
    let quiet_before = hook.received().len();
    let started = Instant::now();
    let ctx = Ctx {
        env,
        vars: &vars,
        dir: &dir,
        victim: victim_pid,
        light: light_pid,
        early: early.as_ref().map(Running::pid),
        nvml: nvml_file.clone(),
        server: server_pid,
        victim_started,
    };
    let (mut expect, _keep) = change(&ctx);
    expect.unchanged.push(light_pid);
    expect.unchanged.extend(server_pid);
    let wait = Duration::from_secs(setup.wait_s.max(10));
    let first = hook.wait_for(wait, |v: &Value| {
        v["victim"]["pid"].as_u64() == Some(victim_pid) && v["state"] == "pending"
    });
    // What `cudatrace explain` says of the live daemon's alerts now.
    let explained = Command::new(&env.bin)
        .args(["explain", "--daemon", &format!("http://{listen}")])
        .output()
        .expect("cudatrace explain");
    let explained = String::from_utf8_lossy(&explained.stdout).into_owned();
    // Let the other alerts of those windows arrive too.
    std::thread::sleep(Duration::from_secs(4));
    let all = hook.received();
    let false_blame = all
        .iter()
        .filter(|r| {
            r["aggressors"].as_array().is_some_and(|a| {
                a.iter()
                    .any(|p| expect.unchanged.contains(&p["pid"].as_u64().unwrap_or(0)))
            })
        })
        .count();
    let expected = format!("{} {:?}", expect.cause, expect.named);
    let (got, ok) = match &first {
        Some(r) => {
            let named: Vec<String> = r["aggressors"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| match a["cgroup"].as_str() {
                    Some(cg) => format!("cgroup:{cg}"),
                    None => a["pid"].as_u64().unwrap().to_string(),
                })
                .collect();
            let cause = r["cause"].as_str().unwrap_or("?").to_owned();
            // explain shows the victim's incident: its cause, who changed (or nobody), advice.
            let who_ok = match r["aggressors"][0]["pid"].as_u64() {
                Some(pid) => explained.contains(&format!("(pid {pid})")),
                None => explained.contains("who: nobody else changed"),
            };
            let shown = explained.contains(&format!("cause: {cause}"))
                && explained.contains(&format!("model-server (pid {victim_pid})"))
                && explained.contains("what to do: ")
                && who_ok;
            if !shown {
                eprintln!("causes: {name}: explain said:\n{explained}");
            }
            let ok = cause == expect.cause && named == expect.named && shown;
            (format!("{cause} {named:?}"), ok)
        }
        None => ("none []".to_owned(), expect.cause == "none"),
    };
    eprintln!(
        "causes: {name}: expected {expected}, got {got} after {:.1} s, {false_blame} alerts naming an unchanged process, {quiet_before} before the change; first record: {}",
        started.elapsed().as_secs_f64(),
        first.map_or("none".into(), |r| r.to_string())
    );
    drop((victim, light, early));
    if let Some(s) = server.as_mut() {
        let _ = s.kill();
        let _ = s.wait();
    }
    let _ = daemon.stop();
    Row {
        scenario: name,
        expected,
        got,
        false_blame,
        ok: ok && false_blame == 0 && quiet_before == 0,
    }
}

fn expect(cause: &'static str, named: &[u64]) -> Expect {
    Expect {
        cause,
        named: named.iter().map(u64::to_string).collect(),
        unchanged: Vec::new(),
    }
}

#[test]
fn the_matrix_names_who_changed_and_nobody_else() {
    let Some(env) = env() else { return };
    let mut rows = Vec::new();
    let wait_s = 45;
    // Nothing changes: no alert.
    rows.push(scenario(
        &env,
        "nothing_changes",
        Setup {
            wait_s: 20,
            ..Setup::default()
        },
        |_| (expect("none", &[]), vec![]),
    ));
    // A heavy job arrives on the GPU.
    rows.push(scenario(
        &env,
        "aggressor_arrives",
        Setup {
            wait_s,
            ..Setup::default()
        },
        |c| {
            let heavy = looping(c.env, 60.0, 4000, 2)
                .comm("trainer")
                .vars(c.vars)
                .spawn();
            (
                expect("compute_contention", &[heavy.pid()]),
                vec![Box::new(heavy)],
            )
        },
    ));
    // An existing neighbour grows only its grid: 100 blocks, the same launches with 2,000 from
    // 25 s on.
    let grows = Setup {
        early: Some(("grower", 100, Some("25:2000"))),
        wait_s,
        ..Setup::default()
    };
    rows.push(scenario(&env, "neighbour_grows_its_grid", grows, |c| {
        (expect("compute_contention", &[c.early.unwrap()]), vec![])
    }));
    // The victim's own kernels grow 5x from 25 s on (its requests changed), beside the light
    // neighbour, then beside a heavy unchanged one that keeps the GPU over half busy.
    let own = [("WORKLOAD_GRID_AFTER", "25:5000")];
    let light_only = Setup {
        victim_vars: &own,
        wait_s,
        ..Setup::default()
    };
    rows.push(scenario(&env, "victims_own_work_grows", light_only, |_| {
        (expect("workload_change", &[]), vec![])
    }));
    let heavy = Setup {
        victim_vars: &own,
        early: Some(("heavy", 2000, None)),
        wait_s,
        ..Setup::default()
    };
    rows.push(scenario(
        &env,
        "victims_own_work_grows_beside_heavy",
        heavy,
        |c| {
            let mut e = expect("workload_change", &[]);
            e.unchanged.push(c.early.unwrap());
            (e, vec![])
        },
    ));
    // CPU hogs take the core of a victim that needs the CPU (0.3 ms of it per call); the
    // device time of its kernels is unaffected.
    let victim_cg = Cgroup::new("victim");
    let cpu = Setup {
        victim_vars: &[("CUDA_STANDIN_CALL_NS", "300000")],
        victim_cgroup: Some(&victim_cg),
        wait_s,
        ..Setup::default()
    };
    rows.push(scenario(&env, "cpu_hogs_on_its_core", cpu, |c| {
        pin(c.victim, "0");
        let hogs = Hogs::start(3, "0");
        let mut e = expect("cpu_contention", &[]);
        e.named = vec![cgroup_name(&hogs.cgroup)];
        let _ = c.light;
        (e, vec![Box::new(hogs)])
    }));
    // A process calling a copy of the driver library that is not traced saturates the GPU;
    // NVML lists it at 60%.
    let untraced = Setup {
        nvml: true,
        wait_s,
        ..Setup::default()
    };
    rows.push(scenario(&env, "untraced_hog", untraced, |c| {
        let copy = c.dir.join("untraced/libcuda.so.1");
        fs::create_dir_all(copy.parent().unwrap()).unwrap();
        fs::copy(c.env.libcuda(), &copy).unwrap();
        let hog = looping(c.env, 60.0, 4000, 2)
            .comm("untraced-hog")
            .vars(c.vars)
            .lib(&copy)
            .spawn();
        let (v, l, h) = (c.victim, c.light, hog.pid());
        nvml_write(
            c.nvml.as_ref().unwrap(),
            &format!("{}proc 0 pid={v} used=4294967296 sm=30 memutil=5\nproc 0 pid={l} used=1073741824 sm=3 memutil=1\nproc 0 pid={h} used=2147483648 sm=60 memutil=10\n", GPU0.replace("sm=40", "sm=98")),
        );
        (expect("untraced_contention", &[h]), vec![Box::new(hog)])
    }));
    // MPS: the victim and the light neighbour are MPS clients; a heavy client arrives. NVML
    // lists clients by its MPS query only (the server's SM utilization rises with them).
    let mps = Setup {
        mps: true,
        wait_s,
        ..Setup::default()
    };
    rows.push(scenario(&env, "mps_client_arrives", mps, |c| {
        let heavy = looping(c.env, 60.0, 4000, 2)
            .comm("trainer")
            .vars(c.vars)
            .spawn();
        let (v, l, h, srv) = (c.victim, c.light, heavy.pid(), c.server.unwrap());
        nvml_write(
            c.nvml.as_ref().unwrap(),
            &format!("{}proc 0 pid={srv} used=536870912 sm=95 memutil=20\nproc 0 pid={v} used=4294967296 sm=30 memutil=5 mps=1\nproc 0 pid={l} used=1073741824 sm=3 memutil=1 mps=1\nproc 0 pid={h} used=2147483648 sm=60 memutil=10 mps=1\n", GPU0.replace("sm=40", "sm=98")),
        );
        (
            expect("compute_contention", &[h]),
            vec![Box::new(heavy)],
        )
    }));
    // MIG: the victim (on GPU instance 1 of GPU 0) grows its own kernels 5x 25 s after its
    // start; a heavy peer arrives on instance 2 of the same GPU at that moment (on a simulated
    // device of its own: an instance is isolated). Instances share nothing: the victim's own
    // change, and the peer is never named (weighed as a neighbour, it would be, as an arrival).
    let peer_dev = device_file("causes-mig-peer");
    let mig = Setup {
        victim_vars: &own,
        mig: true,
        wait_s,
        ..Setup::default()
    };
    rows.push(scenario(&env, "mig_peer_arrives_with_victims_growth", mig, |c| {
        let at = c.victim_started + Duration::from_millis(25_500);
        std::thread::sleep(at.saturating_duration_since(Instant::now()));
        let mut vars = c.vars.to_vec();
        vars.push(("CUDA_STANDIN_DEVICE", peer_dev.as_str()));
        let peer = looping(c.env, 60.0, 4000, 2)
            .comm("mig-peer")
            .vars(&vars)
            .spawn();
        let (v, l, p) = (c.victim, c.light, peer.pid());
        nvml_write(
            c.nvml.as_ref().unwrap(),
            &format!("{GPU0}proc 0 pid={v} used=4294967296 sm=30 memutil=5 gi=1\nproc 0 pid={l} used=1073741824 sm=3 memutil=1 gi=1\nproc 0 pid={p} used=2147483648 sm=60 memutil=10 gi=2\n"),
        );
        let mut e = expect("workload_change", &[]);
        e.unchanged.push(p);
        (e, vec![Box::new(peer)])
    }));
    eprintln!("causes: the confusion matrix (each victim's first alert):");
    eprintln!(
        "causes: {:<36} {:<34} {:<34} false blame",
        "scenario", "expected", "got"
    );
    for r in &rows {
        eprintln!(
            "causes: {:<36} {:<34} {:<34} {}",
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
