//! The `cudatrace` binary: parses the command line and dispatches to the command's module
//! (see the library's documentation for the flow).
use std::process::ExitCode;

use clap::Parser as _;
use tracer_user::{cli, cmd, logging};

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    logging::init(cli.log_format);
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            log::error!("cudatrace: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            cli::Command::Trace(args) => cmd::trace::run(args).await,
            cli::Command::Run(args) => cmd::run::run(args).await,
            cli::Command::Record(args) => cmd::record::run(args).await,
            cli::Command::Top(args) => cmd::top::run(args).await,
            cli::Command::Census(args) => cmd::census::run(args).await,
            // Reading the archive needs no privilege and no probe.
            cli::Command::Incidents(args) => cmd::incidents::run(args),
            cli::Command::Review(args) => cmd::review::run(args),
            cli::Command::Sites(args) => cmd::sites::run(args),
            cli::Command::Breaker(args) => cmd::breaker::run(args),
            cli::Command::Actuator(args) => cmd::actuator::run(args).await,
            cli::Command::PrepareState(args) => cmd::prepare_state::run(args),
            cli::Command::Explain(args) => tokio::task::spawn_blocking(|| cmd::explain::run(args))
                .await
                .unwrap_or_else(|e| Err(anyhow::anyhow!("explain stopped: {e}"))),
            // Blocking HTTP and a replay: off the runtime's thread.
            cli::Command::Backtest(args) => {
                tokio::task::spawn_blocking(|| cmd::backtest::run(args))
                    .await
                    .unwrap_or_else(|e| Err(anyhow::anyhow!("the replay stopped: {e}")))
            }
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line: the outermost context and its causes.
            log::error!("cudatrace: {e:#}");
            ExitCode::FAILURE
        }
    }
}
