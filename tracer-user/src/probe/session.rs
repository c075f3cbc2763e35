//! Uprobe sessions (Linux 6.13+): where the kernel has them, each launch family is probed by one
//! session program whose entry counts every launch and asks for the return only for the ones it
//! samples (see the eBPF side's `probes/session.rs`); elsewhere by the classic uprobe and
//! uretprobe pair. Which one, and why, is said once here.

use super::{
    loader::{Attach, Probes},
    multi::MultiPrograms,
};

/// How launches are probed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LaunchProbes {
    /// uprobe sessions: a return probe only for the sampled launches.
    Session,
    /// uprobe_multi entry and return links on every launch.
    Pair,
    /// Classic perf-event uprobes and uretprobes on every launch.
    Classic,
}

impl LaunchProbes {
    /// Its name, as the summary line prints it (`launch_probes=`).
    pub fn name(self) -> &'static str {
        match self {
            LaunchProbes::Session => "uprobe_session",
            LaunchProbes::Pair => "uprobe_multi_pair",
            LaunchProbes::Classic => "classic_pair",
        }
    }
}

/// Says in one line why launches pay the return probe on every call, when they do; hands the
/// programs on.
pub fn say(programs: MultiPrograms) -> MultiPrograms {
    if let Some(why) = programs.pair_because() {
        say_pair(why);
    }
    programs
}

/// The line that says launches pay the pair, and `why`.
pub fn say_pair(why: &str) {
    log::info!(
        "cudatrace: every launch is timed by a uprobe and uretprobe pair, since uprobe sessions \
         are not available ({why}; they need Linux 6.13 or later)"
    );
}

impl Probes {
    /// How launches are probed.
    pub fn launch_probes(&self) -> LaunchProbes {
        match &self.attach {
            Attach::Multi { programs, .. } if programs.pair_because().is_none() => {
                LaunchProbes::Session
            }
            Attach::Multi { .. } => LaunchProbes::Pair,
            Attach::Classic => LaunchProbes::Classic,
        }
    }
}
