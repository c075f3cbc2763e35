//! How often the ring buffer is drained. While records come, every [`POLL_PERIOD`] (the kernel
//! wakes the reader only once an eighth of the buffer waits, so that a busy process costs few
//! wake-ups). Once [`SLEEP_AFTER`] drains in a row found nothing, the programs are told to wake
//! the reader for every record and the timer slows to [`ASLEEP_PERIOD`]: an idle node costs
//! one wake-up a second, and the first record after a quiet spell is read at once. With no
//! process traced at all, not even that: the timer stops until a record comes.
use std::time::Duration;

use tokio::time::{Instant, Interval, MissedTickBehavior};

use crate::probe::bpf_maps::Maps;

/// How often the ring buffer is drained while records come: the most a record waits then.
pub(super) const POLL_PERIOD: Duration = Duration::from_millis(20);
/// Empty drains in a row before the reader sleeps (100 ms of nothing).
const SLEEP_AFTER: u32 = 5;
/// How often the ring buffer is looked at while asleep (harvests and process checks ride on it).
const ASLEEP_PERIOD: Duration = Duration::from_secs(1);

/// The drain timer and whether the reader sleeps.
pub(super) struct Pace {
    poll: Interval,
    /// The programs wake the reader for every record.
    asleep: bool,
    /// Drains in a row that found nothing.
    empty: u32,
    /// Bytes waiting before the kernel wakes the reader while awake.
    wakeup_bytes: u32,
}

impl Pace {
    /// Awake, draining every `POLL_PERIOD`, woken by the kernel past `wakeup_bytes`.
    pub(super) fn new(wakeup_bytes: u32) -> Pace {
        Pace {
            poll: interval(POLL_PERIOD),
            asleep: false,
            empty: 0,
            wakeup_bytes,
        }
    }

    /// Waits for the next drain by the clock; asleep with no process traced (`quiet`), never:
    /// the first record wakes the reader, and nothing else needs the clock.
    pub(super) async fn tick(&mut self, quiet: bool) {
        if self.asleep && quiet {
            std::future::pending::<()>().await;
        }
        self.poll.tick().await;
    }

    /// Called after each drain with how many records it read. Returns true when the reader has
    /// just gone to sleep: the caller reads the ring buffer once more, since a record written
    /// before the programs were told to wake it for each one woke nobody.
    pub(super) fn after_drain(&mut self, records: u64, maps: &mut Maps) -> bool {
        if records > 0 {
            self.empty = 0;
            if self.asleep && maps.set_wakeup_bytes(self.wakeup_bytes).is_ok() {
                self.asleep = false;
                self.poll = interval(POLL_PERIOD);
            }
            return false;
        }
        self.empty = self.empty.saturating_add(1);
        if self.asleep || self.empty < SLEEP_AFTER || maps.set_wakeup_bytes(0).is_err() {
            return false;
        }
        self.asleep = true;
        self.poll = interval(ASLEEP_PERIOD);
        true
    }
}

/// A timer whose first tick is one period from now, that does not catch up on missed ticks.
fn interval(period: Duration) -> Interval {
    let mut i = tokio::time::interval_at(Instant::now() + period, period);
    i.set_missed_tick_behavior(MissedTickBehavior::Delay);
    i
}
