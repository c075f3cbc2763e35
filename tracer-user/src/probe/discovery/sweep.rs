//! A full pass paid for in steps: every process's maps read, as many at a time as the discovery
//! thread's [`Budget`] allows, so that a full pass a flood asked for costs no more CPU a second
//! than the reads it stands in for. What it found and what every process maps are sent when the
//! last process was read.
use std::{collections::HashSet, fs, time::Instant};

use super::{
    queue::{thread_cpu, Budget},
    FileKey, Pass, Prepared, Scanner, Settled,
};

/// A full pass under way.
pub struct Sweep {
    pids: Vec<u32>,
    at: usize,
    tried: HashSet<FileKey>,
    mapped: HashSet<FileKey>,
    found: Vec<Prepared>,
}

impl Sweep {
    /// The processes alive now, to read in turn (`None`: /proc cannot be listed).
    pub fn start(scanner: &mut Scanner) -> Option<Sweep> {
        let pids = fs::read_dir("/proc")
            .ok()?
            .flatten()
            .filter_map(|p| p.file_name().to_str().and_then(|s| s.parse::<u32>().ok()))
            .collect();
        scanner.begin_pass();
        Some(Sweep {
            pids,
            at: 0,
            tried: HashSet::new(),
            mapped: HashSet::new(),
            found: Vec::new(),
        })
    }

    /// Reads processes while the budget holds more than `keep`; the finished pass once the last
    /// was read.
    pub fn step(
        &mut self,
        scanner: &mut Scanner,
        settled: &Settled,
        budget: &mut Budget,
        keep: std::time::Duration,
    ) -> Option<Pass> {
        while self.at < self.pids.len() {
            let now = Instant::now();
            if !budget.left_over(now, keep) {
                return None;
            }
            let cpu = thread_cpu();
            let pid = self.pids[self.at];
            scanner.scan(
                pid,
                settled,
                now,
                &mut self.tried,
                &mut self.mapped,
                &mut self.found,
            );
            budget.spend(thread_cpu().saturating_sub(cpu));
            self.at += 1;
        }
        scanner.end_pass();
        Some(Pass {
            found: std::mem::take(&mut self.found),
            mapped: Some(std::mem::take(&mut self.mapped)),
        })
    }
}
