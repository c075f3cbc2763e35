//! End-to-end: automatic degradation in its dry run (`[mitigate]`). Two neighbours arrive on the
//! model server's GPU and page: the mitigation webhook is told with the verdict, a CPU cap is
//! planned on the preemptible one (`*:trainer`) only, exactly once, and undone when the verdict
//! resolves; the other (`etl`) is left alone, and nothing is written anywhere.
use std::time::Duration;

use integration_tests::{
    alerting::{gpu0, learned_victim, looping, FAST},
    device_file, env,
    guards::TempDir,
    servers::Webhook,
    Cudatrace,
};
use serde_json::Value;

#[test]
fn a_page_tells_the_platform_and_plans_a_cap_on_the_preemptible_aggressor_only() {
    let Some(env) = env() else { return };
    let hook = Webhook::start();
    let dir = TempDir::new("mitigate");
    let config = dir.write(
        "cudatrace.toml",
        &format!(
            "{FAST}[mitigate]\nenabled = true\nwebhook = \"http://127.0.0.1:{}/mitigate\"\npreemptible = [\"*:trainer\"]\n",
            hook.port
        ),
    );
    let (daemon, _) =
        Cudatrace::start_daemon_on_loopback(&env, &["--config", config.to_str().unwrap()], &[]);
    let dev = device_file("mitigate");
    let vars = gpu0(&dev);
    let victim = learned_victim(&env, &daemon, &vars, 200.0);
    let vpid = victim.pid();
    // Two neighbours: 4 ms kernels, two queued before each wait, for 40 s.
    let trainer = looping(&env, 40.0, 4000, 2)
        .comm("trainer")
        .vars(&vars)
        .spawn();
    let etl = looping(&env, 40.0, 4000, 2).comm("etl").vars(&vars).spawn();
    let (tpid, epid) = (trainer.pid(), etl.pid());
    let of_victim = |event: &'static str| {
        move |b: &Value| b["event"] == event && b["victim"]["pid"].as_u64() == Some(vpid)
    };
    let act = hook.wait_for(Duration::from_secs(90), of_victim("act"));
    trainer.finish();
    etl.finish();
    let undo = hook.wait_for(Duration::from_secs(120), of_victim("undo"));
    drop(victim);
    let traced = daemon.stop();
    let _ = std::fs::remove_file(&dev);
    let bodies: Vec<Value> = hook.received();
    let acts: Vec<&Value> = bodies.iter().filter(|b| of_victim("act")(b)).collect();
    let undos: Vec<&Value> = bodies.iter().filter(|b| of_victim("undo")(b)).collect();
    // Every action planned, by (event, pid, workload suffix, dry run, cpu.max, hold).
    let actions = |of: &[&Value], event: &str| -> Vec<(String, u64, bool, String, u64)> {
        of.iter()
            .flat_map(|b| b["actions"].as_array().unwrap().iter())
            .map(|a| {
                let w = a["workload"].as_str().unwrap();
                (
                    format!("{event} {}", w.rsplit(':').next().unwrap()),
                    a["pid"].as_u64().unwrap(),
                    a["dry_run"].as_bool().unwrap(),
                    a["cpu_max"].as_str().unwrap().to_owned(),
                    a["max_hold_s"].as_u64().unwrap(),
                )
            })
            .collect()
    };
    let said: Vec<&str> = traced
        .stderr
        .iter()
        .filter(|l| l.contains("mitigate: dry run: would cap"))
        .map(String::as_str)
        .collect();
    eprintln!(
        "e2e a_page_tells_the_platform_and_plans_a_cap_on_the_preemptible_aggressor_only: {} act and {} undo bodies; actions {:?}; undone {:?}",
        acts.len(),
        undos.len(),
        actions(&acts, "act"),
        actions(&undos, "undo")
    );
    let act = act.unwrap_or_else(|| panic!("no mitigation within 90 s: {bodies:?}"));
    assert!(
        undo.is_some(),
        "no undo within 120 s of the end: {bodies:?}"
    );
    assert_eq!(act["kind"], "mitigation");
    assert_eq!(
        (&act["severity"], act["dry_run"].as_bool()),
        (&Value::from("page"), Some(true))
    );
    let named: Vec<u64> = act["verdict"]["aggressors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["pid"].as_u64().unwrap())
        .collect();
    assert!(named.contains(&tpid) && named.contains(&epid), "{act}");
    let one = |event: &str| {
        vec![(
            format!("{event} trainer"),
            tpid,
            true,
            "20000 100000".to_owned(),
            600,
        )]
    };
    assert_eq!(
        actions(&acts, "act"),
        one("act"),
        "the preemptible aggressor, once"
    );
    assert_eq!(actions(&undos, "undo"), one("undo"));
    assert_eq!(undos.len(), acts.len(), "every page's end told");
    assert_eq!(said.len(), 1, "{:?}", traced.stderr);
    assert!(
        said[0].contains(&format!(":trainer (pid {tpid})")),
        "{}",
        said[0]
    );
}
