//! Starvation: a call of a process stuck in the driver (in flight for a window or more) behind
//! work another process queued earlier on the same GPU. Such a process completes too few calls
//! for its signals to have values; its stuck time stands in for them, and the processes whose
//! unfinished work is older are what hold it up.
use super::classify::{gpus_of, shares, vouched, Activity, GpuSet, Seen};
use crate::{alert::Party, nvml::GpuSample};

impl Activity {
    /// When the work a stuck call of this process waits for was queued: its oldest open
    /// batch, else the stuck call itself.
    fn queued_since(&self) -> Option<u64> {
        let stuck = self.stuck_since?;
        Some(self.open_since.map_or(stuck, |o| o.min(stuck)))
    }
}

/// The process holding `victim`'s GPU while a call of its own is stuck: of those on a GPU it
/// uses whose unfinished work was queued before its own, the one queued first (others queued
/// behind it are starved too).
/// Empty when nothing of the victim's is stuck, or when its own work is the oldest (a long
/// kernel of its own is no starvation). Also the GPU they share with it.
pub fn holders(
    victim: &Seen<'_>,
    everyone: &[Seen<'_>],
    gpus: &[GpuSample],
) -> (Vec<Party>, Option<String>) {
    let Some(queued) = victim.activity.queued_since() else {
        return (Vec::new(), None);
    };
    let vset = gpus_of(victim.process.pid, victim.process.identity, gpus);
    let others: Vec<(Seen<'_>, GpuSet)> = everyone
        .iter()
        .filter(|s| s.process.pid != victim.process.pid && vouched(s.process.pid, gpus))
        .map(|s| (*s, gpus_of(s.process.pid, s.process.identity, gpus)))
        .collect();
    let weight = |a: &Activity| match a.open_since {
        Some(t) if t < queued => (queued - t) as f64,
        _ => 0.0,
    };
    // Only the head of the queue holds the GPU: a process whose work waits behind older work
    // of another is starved too (a co-victim), not a holder.
    let oldest = others
        .iter()
        .filter(|(s, set)| vset.shared_with(set).is_some() && weight(&s.activity) > 0.0)
        .map(|(s, _)| weight(&s.activity))
        .fold(0.0, f64::max);
    shares(victim, &vset, &others, |a| {
        let w = weight(a);
        if w > 0.0 && w >= oldest {
            w
        } else {
            0.0
        }
    })
}
