//! End-to-end (issue 56, item 6): `explain` reads a daemon whose metrics server wants TLS and a
//! user's password (the chart's web config): with `--ca-file`, `--user` and `--password-file`
//! it reads the live alerts; a wrong password, or no CA, is one line that says what to give,
//! and exit 1.
use std::process::Command;

use integration_tests::{env, Cudatrace};

#[test]
fn explain_reads_a_daemon_behind_tls_and_basic_auth() {
    let Some(env) = env() else { return };
    let cert = integration_tests::tls::Certificate::new();
    let hash = bcrypt::hash("explain-s3cret", 10).unwrap();
    let web = cert.dir.write(
        "web.yml",
        &format!("tls_server_config:\n  cert_file: cert.pem\n  key_file: key.pem\nbasic_auth_users:\n  oncall: '{hash}'\n"),
    );
    let good = cert.dir.write("password", "explain-s3cret\n");
    let wrong = cert.dir.write("wrong", "not-it\n");
    let (daemon, listen) = Cudatrace::start_daemon_on_loopback(
        &env,
        &["--web-config-file", web.to_str().unwrap()],
        &[],
    );
    let url = format!("https://{listen}");
    let ca = cert.pem();
    let explain = |extra: &[&str]| {
        let o = Command::new(&env.bin)
            .args(["explain", "--daemon", &url])
            .args(extra)
            .output()
            .unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let ca_s = ca.to_str().unwrap();
    let ok = explain(&[
        "--ca-file",
        ca_s,
        "--user",
        "oncall",
        "--password-file",
        good.to_str().unwrap(),
    ]);
    let refused = explain(&[
        "--ca-file",
        ca_s,
        "--user",
        "oncall",
        "--password-file",
        wrong.to_str().unwrap(),
    ]);
    let untrusted = explain(&[
        "--user",
        "oncall",
        "--password-file",
        good.to_str().unwrap(),
    ]);
    drop(daemon.stop());
    eprintln!("e2e explain_auth: right password {ok:?}; wrong {refused:?}; no CA {untrusted:?}");
    assert_eq!(ok.0, Some(0), "{ok:?}");
    assert!(ok.2.contains("no incidents to explain"), "{ok:?}");
    assert_eq!(refused.0, Some(1), "{refused:?}");
    assert!(
        refused.2.contains("answered 401") && refused.2.contains("--password-file"),
        "{refused:?}"
    );
    assert_eq!(refused.2.trim().lines().count(), 1, "{refused:?}");
    assert_eq!(untrusted.0, Some(1), "{untrusted:?}");
    assert!(untrusted.2.contains("--ca-file"), "{untrusted:?}");
}
