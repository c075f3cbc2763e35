//! Processes whose leader exited while other threads ran on: `pthread_exit` in `main`, or the
//! moment an `exit_group` takes to end the other threads.
use std::time::Duration;

use super::Session;
use crate::identity;

/// A process gone within this of its leader's exit record exited with the leader's status.
const HEADLESS_STATUS_WITHIN: Duration = Duration::from_secs(2);

impl Session {
    /// Moves the processes whose leader exited and whose last thread has now gone too to the
    /// ones leaving.
    pub(super) fn settle_headless(&mut self) {
        if self.headless.is_empty() {
            return;
        }
        let (gone, running): (Vec<_>, Vec<_>) = std::mem::take(&mut self.headless)
            .into_iter()
            .partition(|h| !identity::process_alive(h.0));
        self.headless = running;
        for (pid, status, at) in gone {
            // Gone soon after its leader: the leader's status was the group's exit. A process
            // that lived on (pthread_exit in main) ended later with a status not read.
            if at.elapsed() <= HEADLESS_STATUS_WITHIN {
                if let Some(p) = self.registry.live_mut(pid) {
                    p.exit_status = status;
                }
            }
            self.counts.exits += 1;
            self.leaving.push(pid);
        }
    }
}
