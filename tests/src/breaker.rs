//! The probe-harm breaker's test helpers: a config with a state dir, the `breaker` command, and
//! a restart its open breaker refuses.
use std::process::Command;

use crate::{guards::TempDir, Cudatrace, Env, Traced};

/// Writes `cudatrace.toml` in `dir` with `[state] dir` set to `dir/state` (made); its path.
pub fn state_config(dir: &TempDir) -> String {
    let state = dir.join("state");
    std::fs::create_dir(&state).unwrap();
    let config = dir.join("cudatrace.toml");
    std::fs::write(
        &config,
        format!("[state]\ndir = {:?}\n", state.display().to_string()),
    )
    .unwrap();
    config.to_str().unwrap().to_owned()
}

/// `cudatrace breaker --config CFG ARGS`'s stdout (it must succeed).
pub fn breaker(env: &Env, cfg: &str, args: &[&str]) -> String {
    let o = Command::new(&env.bin)
        .args(["breaker", "--config", cfg])
        .args(args)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

/// `cudatrace run` on `library` alone with config `cfg`, which its open breaker must refuse:
/// what it printed, its exit code not 0 and one line naming the breaker.
pub fn refused_restart(env: &Env, cfg: &str, library: &str) -> Traced {
    let refused = Cudatrace::try_start_command(
        env,
        "run",
        &["--config", cfg, "--lib", library, "--listen", "127.0.0.1:0"],
        &[],
    );
    let refused = match refused {
        Ok(c) => panic!("attached with the breaker open: {:?}", c.stop().stderr),
        Err(t) => t,
    };
    assert_ne!(refused.code, Some(0));
    assert!(
        refused
            .stderr
            .iter()
            .any(|l| l.contains("probe-harm breaker is open")
                && l.contains("cudatrace breaker --clear")),
        "{:?}",
        refused.stderr
    );
    refused
}
