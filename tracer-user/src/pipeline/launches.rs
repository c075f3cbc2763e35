//! Reads the launches the kernel counted (`LAUNCHES`): each read yields what every cell gained
//! since the last one, so that a launch is counted once however often the map is read; the
//! cells of exited processes are deleted after their last read. The [`Session`] reads them here
//! and hands the gains to its consumer.
mod untimed;

use std::time::Instant;

use foldhash::HashMap;
use tracer_common::{
    launches::{
        latency_bucket, LaunchCell, LaunchKey, OVERFLOW_BUCKET, OVERFLOW_FUNCTION, UNTIMED_BUCKET,
    },
    Api,
};

use super::{Consumer, Session};
use crate::event::LaunchDelta;

/// The last counts read per cell.
#[derive(Default)]
pub struct Harvest {
    last: HashMap<LaunchKey, LaunchCell>,
    /// The kernel's count of launches added to cells when they were last read: while it
    /// stands still, the map is not walked (a walk visits every bucket, counted or not).
    counted: Option<u64>,
    /// The kernel's count of cells made when the map was last walked: while it stands still,
    /// the keys in `last` are every cell, and they are read one by one.
    made: Option<u64>,
}

/// Up to this many known cells are read one by one (a system call each, under a microsecond)
/// rather than by walking the map's 131,072 buckets (about 4 ms here).
const READ_ONE_BY_ONE: usize = 2048;

impl Harvest {
    /// An empty harvest.
    pub fn new() -> Harvest {
        Harvest::default()
    }

    /// Makes the next read walk the cells whatever the kernel's counts say (the last read).
    pub fn reread(&mut self) {
        self.counted = None;
        self.made = None;
    }

    /// Every cell now: the known ones one by one while no cell was made since the last walk
    /// (read before the walk: a cell made during it makes the next read walk again), else a
    /// walk of the map. Always every cell: a detection window must see a new aggressor's
    /// first launches (a walk deferred by 2 s, tried first, left a trainer unseen by the
    /// window that fired, and the verdict unexplained).
    fn cells(&mut self, maps: &crate::probe::bpf_maps::Maps) -> Vec<(LaunchKey, LaunchCell)> {
        let made = maps.cells_made();
        if self.made == Some(made) && self.last.len() <= READ_ONE_BY_ONE {
            return self
                .last
                .keys()
                .filter_map(|k| Some((*k, maps.launch_cell(k)?)))
                .collect();
        }
        self.made = Some(made);
        maps.launch_cells()
    }

    /// What `cells` (every cell now) gained since the last read, with its pid. A cell read
    /// twice in one pass (the kernel's iteration restarts when a key goes) gains nothing the
    /// second time. Untimed launches (uprobe sessions) are spread over the sampled ones'
    /// buckets (`super::untimed`).
    pub fn gains(&mut self, cells: Vec<(LaunchKey, LaunchCell)>) -> Vec<(u32, LaunchDelta)> {
        let mut out = Vec::new();
        let mut untimed = Vec::new();
        for (key, cell) in cells {
            let Some(api) = Api::from_id(u32::from(key.api)) else {
                continue;
            };
            let last = self.last.entry(key).or_default();
            let count = cell.count.saturating_sub(last.count);
            if count == 0 {
                continue;
            }
            let sum_ns = cell.sum_ns.saturating_sub(last.sum_ns);
            if key.bucket == UNTIMED_BUCKET {
                untimed.push(untimed::Untimed {
                    pid: key.pid,
                    api,
                    function: key.function,
                    count,
                    threads: cell.threads.wrapping_sub(last.threads),
                });
                *last = cell;
                continue;
            }
            // An overflow cell (its process past its quota of cells) keeps no bucket: its
            // launches are placed at their mean.
            let (function, bucket) = match key.bucket {
                OVERFLOW_BUCKET => (OVERFLOW_FUNCTION, latency_bucket(sum_ns / count)),
                b => (key.function, u32::from(b)),
            };
            out.push((
                key.pid,
                LaunchDelta {
                    api,
                    function,
                    bucket,
                    count,
                    errors: cell.errors.saturating_sub(last.errors),
                    sum_ns,
                    // The kernel's sum wraps (hostile grids are capped per launch, not per sum).
                    threads: cell.threads.wrapping_sub(last.threads),
                    untimed: 0,
                    estimated_errors: 0,
                },
            ));
            *last = cell;
        }
        let spread = untimed::spread(&untimed, &out, &self.last);
        out.extend(spread);
        out
    }

    /// Forgets the cells of `pids` (exited, read for the last time); returns their keys, for
    /// the caller to delete from the map.
    pub fn release(&mut self, pids: &[u32]) -> Vec<LaunchKey> {
        if pids.is_empty() {
            return Vec::new();
        }
        let gone: Vec<LaunchKey> = self
            .last
            .keys()
            .filter(|k| pids.contains(&k.pid))
            .copied()
            .collect();
        for k in &gone {
            self.last.remove(k);
        }
        gone
    }

    /// Cells remembered.
    pub fn len(&self) -> usize {
        self.last.len()
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.last.is_empty()
    }
}

impl Session {
    /// Hands the launches counted in-kernel since the last read to `consumer`, after the
    /// records already in the ring buffer: a kernel's name, looked up before its launches, is
    /// known before their series is made (a scrape's harvest could otherwise come between the
    /// kernel's wake-up and the drain, and label the series by handle).
    pub fn harvest(&mut self, consumer: &mut impl Consumer) {
        // An error is the consumer's output closing, which the next drain reports.
        let _ = self.read_ring(consumer);
        self.harvested_at = Instant::now();
        // Read before the cells (the programs add to a cell, then to this count): a launch
        // counted after it makes the next harvest read again. A process leaving, or the end,
        // reads the cells whatever it says.
        let counted = self.probes.maps.launches_counted();
        if self.harvest.counted == Some(counted) && self.leaving.is_empty() {
            return;
        }
        self.harvest.counted = Some(counted);
        let cells = self.harvest.cells(&self.probes.maps);
        if cells.is_empty() {
            return;
        }
        for (pid, delta) in self.harvest.gains(cells) {
            self.counts.launches_counted += delta.count;
            let cmdline = self.cmdline;
            let process = match self.registry.live_mut(pid) {
                Some(p) => p,
                // Every launch the kernel counted: a process whose records were all lost (the
                // ring buffer full) is still a process.
                None => Self::admit(
                    &mut self.probes,
                    &mut self.registry,
                    &mut self.gone,
                    pid,
                    None,
                    cmdline,
                ),
            };
            if delta.function == OVERFLOW_FUNCTION {
                process.launches_overflowed += delta.count;
            }
            consumer.launches(&delta, process);
        }
    }

    /// Releases the processes that left during this drain, and their launch cells.
    pub(super) fn release_leaving(&mut self, consumer: &mut impl Consumer) {
        if self.leaving.is_empty() {
            return;
        }
        let leaving = std::mem::take(&mut self.leaving);
        for &pid in &leaving {
            self.exit(pid, consumer);
        }
        let keys = self.harvest.release(&leaving);
        self.probes.maps.delete_launch_cells(&keys, &leaving);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(count: u64, errors: u64, sum_ns: u64) -> LaunchCell {
        LaunchCell {
            count,
            errors,
            sum_ns,
            threads: (count - errors) * 256,
        }
    }

    #[test]
    fn each_launch_is_counted_once() {
        let k = LaunchKey {
            pid: 7,
            api: Api::LaunchKernel as u16,
            bucket: 105,
            function: 0xf,
        };
        let mut h = Harvest::new();
        let first = h.gains(vec![(k, cell(10, 1, 15_000))]);
        assert_eq!(
            first,
            vec![(
                7,
                LaunchDelta {
                    api: Api::LaunchKernel,
                    function: 0xf,
                    bucket: 105,
                    count: 10,
                    errors: 1,
                    sum_ns: 15_000,
                    threads: 9 * 256,
                    untimed: 0,
                    estimated_errors: 0,
                }
            )]
        );
        // The same cell again in one pass, then grown: only the growth counts.
        let second = h.gains(vec![(k, cell(10, 1, 15_000)), (k, cell(25, 1, 37_000))]);
        assert_eq!(
            second
                .iter()
                .map(|(_, d)| (d.count, d.errors, d.sum_ns, d.threads))
                .collect::<Vec<_>>(),
            vec![(15, 0, 22_000, 15 * 256)]
        );
        // A bad api id from the map is skipped, not a panic.
        assert!(h
            .gains(vec![(LaunchKey { api: 999, ..k }, cell(1, 0, 1))])
            .is_empty());
        assert_eq!(h.len(), 1);
        assert_eq!(h.release(&[8]).len(), 0);
        assert_eq!(h.release(&[7]), vec![k]);
        assert_eq!(h.len(), 0);
    }

    #[test]
    fn an_overflow_cell_is_placed_at_its_mean() {
        let k = LaunchKey {
            pid: 7,
            api: Api::LaunchKernel as u16,
            bucket: OVERFLOW_BUCKET,
            function: OVERFLOW_FUNCTION,
        };
        let mut h = Harvest::new();
        // 1,000 launches of 4 µs each, then 10 more of 50 µs: each gain at its own mean.
        let gains = |h: &mut Harvest, c| {
            h.gains(vec![(k, c)])
                .into_iter()
                .map(|(_, d)| (d.function, d.bucket, d.count))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            gains(&mut h, cell(1000, 0, 4_000_000)),
            [(OVERFLOW_FUNCTION, latency_bucket(4_000), 1000)]
        );
        assert_eq!(
            gains(&mut h, cell(1010, 0, 4_500_000)),
            [(OVERFLOW_FUNCTION, latency_bucket(50_000), 10)]
        );
    }
}
