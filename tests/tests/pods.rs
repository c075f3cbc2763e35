//! End-to-end: namespace, pod and container names on the metrics, from a loopback HTTPS server
//! that answers as the API server does (`GET /api/v1/pods?fieldSelector=spec.nodeName=...`
//! with the service account's bearer token), found the in-cluster way (KUBERNETES_SERVICE_HOST,
//! NODE_NAME). Without access the UID stays, one line says why, and names come once it answers.
use std::{
    process::{Command, Stdio},
    time::Duration,
};

use integration_tests::{
    device_file, env, exposition, free_port,
    guards::{Cgroup, TempDir},
    http, kube, poll, report, Cudatrace,
};

const UID: &str = "7d1e6c2a-90b4-4f3e-8a51-2c6b0d9e4f17";
const CID: &str = "9a8b7c6d5e4f30211a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f7081";
const LAUNCHES: u64 = 1000;

/// The labels of the launch series of `pid` now (namespace, pod, container, workload), and
/// their count.
fn launch_labels(listen: &str, pid: &str) -> Option<(String, String, String, String, f64)> {
    let samples = exposition::parse(&http::scrape(listen));
    let rows = exposition::select(
        &samples,
        "cudatrace_calls_total",
        &[("pid", pid), ("api", "cuLaunchKernel")],
    );
    let first = rows.first()?;
    let n = rows.iter().map(|s| s.value).sum();
    Some((
        first.label("namespace").to_owned(),
        first.label("pod").to_owned(),
        first.label("container").to_owned(),
        first.label("workload").to_owned(),
        n,
    ))
}

#[test]
fn pod_names_from_the_api_server_and_uids_until_it_answers() {
    let Some(env) = env() else { return };
    let api = kube::KubeApi::start("s3cr3t-token", "{}");
    api.answer(403, r#"{"kind":"Status","code":403}"#);
    let (ca, token) = api.files();
    let dir = TempDir::new("pods-config");
    // Every recorded call a span, to see what a span of a process in a pod says.
    let receiver = integration_tests::otlp::Receiver::start();
    let config = dir.write(
        "config.toml",
        &format!("[kubernetes]\npod_names = true\ntoken_file = {token:?}\nca_file = {ca:?}\nrefresh_s = 5\n[otlp]\nendpoint = {:?}\nmin_duration_us = 0\n", receiver.url()),
    );
    let listen = format!("127.0.0.1:{}", free_port());
    let port = api.port.to_string();
    let lib = env.libcuda();
    let vars = [
        ("KUBERNETES_SERVICE_HOST", "127.0.0.1"),
        ("KUBERNETES_SERVICE_PORT", port.as_str()),
        ("NODE_NAME", "gpu-node-7"),
    ];
    let daemon = Cudatrace::start_daemon(
        &env,
        &[
            "--config",
            config.to_str().unwrap(),
            "--lib",
            lib.to_str().unwrap(),
            "--listen",
            &listen,
        ],
        &vars,
    );
    let denied = daemon.wait_stderr(Duration::from_secs(10), |l| l.contains("answered 403"));
    assert!(denied.is_some(), "{:?}", daemon.stderr_now());
    // A process in a pod's container (the cgroup path containerd gives it).
    let cgroup = Cgroup::new(&format!("kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{CID}.scope", UID.replace('-', "_")));
    let dev = device_file("pods");
    let script = format!(
        "echo $$ > {procs} && exec {workload} --lib {lib} --settle 500 basic {LAUNCHES} 0",
        procs = cgroup.path().join("cgroup.procs").display(),
        workload = env.workload().display(),
        lib = lib.display(),
    );
    let child = Command::new("sh")
        .args(["-c", &script])
        .env("CUDA_STANDIN_DEVICE", &dev)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = report(child)["pid"].as_u64().unwrap().to_string();
    drop(cgroup);
    let counted =
        exposition::wait_for_launches(&listen, &pid, LAUNCHES as f64, Duration::from_secs(10));
    assert_eq!(counted, Some(LAUNCHES as f64), "{:?}", daemon.stderr_now());
    let before = launch_labels(&listen, &pid).unwrap();
    // Its spans (the calls written as records), until the API server answers: UID and id.
    let mine =
        |r: &integration_tests::otlp::Received| r.attributes.get("process.pid") == Some(&pid);
    assert!(receiver.wait_until(Duration::from_secs(10), |spans, _| spans.iter().any(mine)));
    let spans: Vec<_> = receiver.spans().into_iter().filter(mine).collect();
    let said: std::collections::BTreeSet<_> = spans
        .iter()
        .map(|s| {
            (
                s.attributes.get("k8s.pod.uid").cloned(),
                s.attributes.get("container.id").cloned(),
                s.attributes["host.name"].clone(),
                s.resource["service.name"].clone(),
            )
        })
        .collect();
    eprintln!("e2e pod_names_from_the_api_server_and_uids_until_it_answers: {} spans of pid {pid} say {said:?}", spans.len());
    assert_eq!(
        said.into_iter().collect::<Vec<_>>(),
        [(
            Some(UID.to_owned()),
            Some(CID.to_owned()),
            "gpu-node-7".to_owned(),
            format!("pod:{UID}/cuda-workload")
        )]
    );
    assert_eq!(
        before,
        (
            String::new(),
            UID.to_owned(),
            CID.to_owned(),
            format!("pod:{UID}/cuda-workload"),
            LAUNCHES as f64
        ),
        "without access: UID and id"
    );
    // A pod list too large to read: refused, said once, nothing lost.
    api.answer(
        200,
        &format!(r#"{{"items":[],"pad":"{}"}}"#, "x".repeat(17 << 20)),
    );
    let too_big = daemon.wait_stderr(Duration::from_secs(15), |l| l.contains("at most 16 MiB"));
    assert!(too_big.is_some(), "{:?}", daemon.stderr_now());
    // Access granted: the names arrive.
    api.answer(200, &kube::pod_list("serving", "llm-0", UID, "server", CID));
    let named = poll(Duration::from_secs(20), || {
        launch_labels(&listen, &pid).filter(|l| l.1 == "llm-0")
    });
    // A 16 MiB list of empty items (5.6 million): counted while parsed, never held (the whole
    // list was parsed into memory before: 841 MB peak).
    let asked = api.requests().len();
    let empty = vec!["{}"; ((16 << 20) - 64) / 3].join(",");
    api.answer(200, &format!(r#"{{"items":[{empty}]}}"#));
    drop(empty);
    let fetched = poll(Duration::from_secs(30), || {
        (api.requests().len() >= asked + 2).then_some(())
    });
    let hwm_kib = integration_tests::vm_hwm_kib(daemon.pid());
    eprintln!(
        "e2e pod_names_from_the_api_server_and_uids_until_it_answers: a 16 MiB list of empty items fetched {:?}; daemon peak RSS {} MiB",
        fetched.is_some(),
        hwm_kib / 1024
    );
    assert!(fetched.is_some(), "{:?}", api.requests());
    assert!(hwm_kib < 160 * 1024, "peak RSS {hwm_kib} KiB");
    let traced = daemon.stop();
    let _ = std::fs::remove_file(&dev);
    let requests = api.requests();
    eprintln!(
        "e2e pod_names_from_the_api_server_and_uids_until_it_answers: launches in={LAUNCHES}; before access {before:?}; after {named:?}; \
         {} requests; stderr {:?}",
        requests.len(),
        traced.stderr.iter().filter(|l| l.contains("pod names")).collect::<Vec<_>>()
    );
    assert_eq!(
        named,
        Some((
            "serving".into(),
            "llm-0".into(),
            "server".into(),
            // The pod's owner, the StatefulSet `llm`, and its container.
            "serving/llm/server".into(),
            LAUNCHES as f64
        ))
    );
    assert!(requests.len() >= 3, "{requests:?}");
    for (target, authorized) in &requests {
        assert!(authorized, "{target}");
        assert_eq!(
            target,
            "/api/v1/pods?fieldSelector=spec.nodeName%3Dgpu-node-7"
        );
    }
    let lines = |s: &str| traced.stderr.iter().filter(|l| l.contains(s)).count();
    assert_eq!(
        lines("answered 403 Forbidden: the service account needs `list` on pods"),
        1,
        "{:?}",
        traced.stderr
    );
    assert_eq!(lines("at most 16 MiB"), 1, "{:?}", traced.stderr);
    assert_eq!(
        lines(&format!(
            "pod names: 1 pods from https://127.0.0.1:{port}/api/v1/pods"
        )),
        1,
        "{:?}",
        traced.stderr
    );
    assert_eq!(traced.code, Some(0));
}
