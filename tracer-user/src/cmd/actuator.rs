//! `cudatrace actuator`: the separate process that writes cgroups for `[mitigate]` (run it as
//! root, or with write access to the cgroup hierarchy; it needs nothing else). It undoes what a
//! killed run left, then serves the socket until SIGTERM or Ctrl-C, and undoes what it holds.
use anyhow::{Context as _, Result};
use tokio::signal::unix::{signal, SignalKind};

use crate::{
    actuator::{
        cgroup::Roots,
        server::{serve, Options},
    },
    cli::ActuatorArgs,
};

/// Runs `cudatrace actuator`.
pub async fn run(args: ActuatorArgs) -> Result<()> {
    for p in [&args.socket, &args.journal] {
        if let Some(dir) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| {
                format!(
                    "cannot create {}: give --socket and --journal writable paths",
                    dir.display()
                )
            })?;
        }
    }
    let roots = Roots::detect();
    if !roots.v2_cpu && roots.v1_cpu.is_none() {
        log::warn!(
            "actuator: no cgroup hierarchy here has the cpu controller: every cap will be refused"
        );
    }
    let allow_uid = if args.allow_uid.is_empty() {
        vec![crate::probe::run_as::DEFAULT_RUN_AS]
    } else {
        args.allow_uid
    };
    let mut term = signal(SignalKind::terminate())?;
    let stop = async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    };
    serve(
        Options {
            socket: args.socket,
            journal: args.journal,
            allow_uid,
            allow_exe: args.allow_exe,
            roots,
        },
        stop,
    )
    .await
}
