//! Discovery seen from the loop: each tick tells the discovery thread what is settled (polling:
//! asks for a pass), and each pass's libraries are attached here, after the ones no process
//! maps any more are detached.
use std::time::Instant;

use super::{discovery, open, Session, LOST_OPENS_PASS_GAP};
use crate::event;

impl Session {
    /// A rescan tick.
    pub(super) fn tick_discovery(&mut self) {
        let settled = self.probes.settled();
        // Event-driven, a full pass is asked for when the kernel lost opens (and
        // when a library waits for a slot: see `rescan`).
        let lost = self.probes.maps.opens_lost();
        let mut full = lost != self.asked_full.1 && self.full_at.elapsed() >= LOST_OPENS_PASS_GAP;
        // Lost opens that must wait out the gap keep the clock on until their pass is asked.
        self.full_deferred = lost != self.asked_full.1 && !full;
        if full {
            self.asked_full.1 = lost;
            self.full_at = Instant::now();
        }
        // A discovered library whose holder exited: a pass tells whether anyone maps it still,
        // and gives its slot back if not.
        full |= self.probes.holder_gone();
        if let Some(d) = self.discovery.as_mut() {
            d.request(settled, full);
        }
    }

    /// Attaches the libcuda files the last discovery pass found, after detaching the ones it
    /// found no process maps any more; returns whether the probes changed.
    pub fn rescan(&mut self) -> bool {
        let discovery::Pass { found, mapped } = std::mem::take(&mut self.found);
        let (mut changed, mut released) = (false, false);
        let refused = self.probes.refused();
        if let Some(mapped) = mapped {
            for lib in self.probes.release_unmapped(&mapped) {
                (changed, released) = (true, true);
                let path = crate::text::printable(&lib.path.display().to_string()).into_owned();
                log::info!(
                    target: "cudatrace::detached",
                    path = path.as_str();
                    "detached: {path}: no process maps it any more"
                );
            }
        }
        let before = self.probes.libraries.len();
        if !found.is_empty() {
            self.probes.refresh_allow();
        }
        for p in found {
            open::attach_one(&mut self.probes, p);
        }
        for lib in &self.probes.libraries[before..] {
            let path = lib.path.display().to_string();
            let at_ns = event::monotonic_ns();
            let path = crate::text::printable(&path);
            log::info!(
                target: "cudatrace::discovered",
                path = path.as_ref(),
                at_ns = at_ns;
                "discovered: {path} at_ns={at_ns}"
            );
        }
        // Event-driven, a file refused for want of a slot asks at once for a pass over every
        // process (to find the files no process maps any more), and a slot given back for
        // another (to find the files that waited for it).
        if released || self.probes.refused() != refused {
            let settled = self.probes.settled();
            self.asked_full.0 = self.probes.refused();
            if let Some(d) = self.discovery.as_mut().filter(|d| d.event_driven()) {
                d.request(settled, true);
            }
        }
        // Event-driven, the loop has no clock of its own while discovery is quiet: each pass
        // (the thread sends one at least every second while opens come) is its tick.
        if self.discovery.as_ref().is_some_and(|d| d.event_driven()) {
            self.tick_discovery();
        }
        changed || self.probes.libraries.len() > before
    }

    /// Whether discovery needs the rescan clock now: polling always; event-driven, only while
    /// the slots are in demand (a holder's exit is noticed by the clock) or a full pass for
    /// lost opens waits out its gap.
    pub(super) fn discovery_clock(&self) -> bool {
        match &self.discovery {
            Some(d) if d.event_driven() => self.probes.slots_in_demand() || self.full_deferred,
            Some(_) => true,
            None => false,
        }
    }
}
