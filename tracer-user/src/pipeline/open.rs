//! Opening a [`Session`]: privileges checked, the programs loaded, the libraries attached (or
//! discovery started), the ring buffer and timers set up.
use std::{path::PathBuf, time::Duration};

use anyhow::{bail, Context as _, Result};
use tokio::{
    io::{unix::AsyncFd, Interest},
    signal::unix::{signal, SignalKind},
    time::MissedTickBehavior,
};

use super::{launches::Harvest, pace::Pace, Counts, Session, SessionOptions};
use crate::{
    probe::allow::AllowList,
    probe::breaker::Breaker,
    probe::caps,
    probe::discovery::{self, Discovery},
    probe::error::AttachError,
    probe::filter,
    probe::guard::Guard,
    probe::loader,
    probe::loader::Probes,
    probe::opens::OpenHook,
    probe::run_as,
    registry::Registry,
};

/// Attaches each library not attached yet; returns the failures.
fn attach_all(probes: &mut Probes, libs: &[PathBuf], quiet_errors: bool) -> Vec<AttachError> {
    let mut failures = Vec::new();
    for lib in libs {
        match probes.attach_library(lib) {
            Ok(Some(attached)) => {
                log::info!(target: "cudatrace::attached", "{}", crate::text::printable(&loader::report(attached)))
            }
            Ok(None) => {}
            Err(e) => {
                if !quiet_errors {
                    log::warn!("cudatrace: {}", crate::text::printable(&format!("{e:#}")));
                }
                failures.push(e);
            }
        }
    }
    failures
}

/// Attaches one library discovery prepared; says what was attached, or why not.
pub(super) fn attach_one(probes: &mut Probes, p: discovery::Prepared) {
    match probes.attach_prepared(p) {
        Ok(Some(attached)) => {
            log::info!(target: "cudatrace::attached", "{}", crate::text::printable(&loader::report(attached)))
        }
        Ok(None) => {}
        Err(e) => log::warn!("cudatrace: {}", crate::text::printable(&format!("{e:#}"))),
    }
}

/// How often the loop tells an event-driven discovery thread what is settled.
const EVENTS_TICK: Duration = Duration::from_secs(1);

impl Session {
    /// Checks privileges, attaches (or starts watching for) the libraries and arms the timers.
    /// Recording starts with [`Session::start_recording`].
    pub fn open(opts: SessionOptions) -> Result<Session> {
        let watch = opts.libs.is_empty();
        if let Some(why) = caps::missing_privilege(watch) {
            bail!(why);
        }
        let filter = filter::build(&opts.filter)?;
        let allow = AllowList::new(opts.lib_allow.clone())?;
        let libs = if watch {
            discovery::loader_libraries()
        } else {
            opts.libs.clone()
        };
        let mut probes = loader::load(
            opts.ringbuf_bytes,
            opts.filter.pid,
            opts.log_level,
            opts.max_libraries,
        )?;
        probes.maps.set_filter(filter)?;
        probes.set_allow(allow);
        probes.set_guard(Guard::running(opts.allow_stepped_probes));
        probes.breaker = Breaker::load(opts.state_dir.as_deref());
        let release = probes.kernel_release().to_owned();
        probes.breaker.on_kernel(&release);
        // The libraries named with --lib, or the host's own in the loader's directories: the
        // operator's files, not a tenant's. With one library its error is the run's error,
        // printed once below (before leaving uid 0, so that a command can still undo what it
        // made, as record removes its file).
        let failures = attach_all(&mut probes, &libs, !watch && libs.len() == 1);
        if probes.probe_count() == 0 && !watch {
            match failures.into_iter().next() {
                Some(e) if libs.len() == 1 => return Err(e.into()),
                _ => bail!(
                    "no probe attached in any of {} libraries; pass a libcuda.so.1 with --lib",
                    libs.len()
                ),
            }
        }
        // Discovery without polling where the kernel can name the processes that open a libcuda.
        let opens = if watch && !opts.poll_discovery {
            match probes.watch_opens() {
                Ok(opens) => Some(opens),
                Err(e) => {
                    log::warn!(
                        "cudatrace: the kernel cannot say which process opens a libcuda ({e:#}); \
                         discovering by reading every process's maps every {} ms instead",
                        opts.rescan.as_millis()
                    );
                    None
                }
            }
        } else {
            None
        };
        // Opened while still privileged: reading it needs CAP_SYSLOG at open only (where
        // `kernel.dmesg_restrict` is set), which uid 65534 does not have.
        let kmsg = crate::probe::kmsg::Kmsg::open();
        // Leave uid 0 before anything a tenant controls is read (other processes' /proc and
        // libraries, a pod list).
        if let Some(to) = opts.run_as {
            run_as::switch(to)?;
        }
        // Said once running as its own uid: a run that cannot switch says that one line only.
        if let Some((why, hook)) = opens
            .as_ref()
            .and_then(|o| Some((o.fell_back.as_ref()?, &o.hook)))
        {
            match hook {
                OpenHook::Syscalls(_) => log::warn!(
                    "cudatrace: discovery's open hook runs on every system call of the node ({}), \
                     since the kernel's open path cannot be probed ({why})",
                    hook.name()
                ),
                _ => log::info!(
                    "cudatrace: the kernel's open path cannot be probed ({why}); discovery hooks the dynamic loaders instead ({})",
                    hook.name()
                ),
            }
        }
        let discovery_stats = std::sync::Arc::new(discovery::Stats::default());
        let mut discovery = if watch {
            let d = Discovery::start(opens, discovery_stats.clone())
                .context("cannot start the discovery thread")?;
            let mode = if d.event_driven() { "events" } else { "poll" };
            let hook = d.hook().map(|h| h.name()).unwrap_or_default();
            log::info!(
                target: "cudatrace::discovery",
                mode = mode,
                hook = hook.as_str();
                "discovery: {}",
                if d.event_driven() {
                    format!("the kernel names each process that opens or loads a libcuda ({hook}); only its maps are read")
                } else {
                    "every process's maps are read at each rescan".to_owned()
                }
            );
            Some(d)
        } else {
            None
        };
        if let Some(d) = discovery.as_mut() {
            for p in d.first_pass(probes.settled()).found {
                attach_one(&mut probes, p);
            }
        }
        if watch && probes.probe_count() == 0 {
            log::info!(target: "cudatrace::watching", "no libcuda in use or installed yet; watching for processes that map one");
        }
        let ring = probes
            .take_ring()
            .context("the ring buffer was taken already")?;
        // SAFETY: the ring buffer owns its fd, and AsyncFd owns the ring buffer until into_inner.
        let ring = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
            .map_err(|e| anyhow::anyhow!("cannot poll the ring buffer: {}", e.into_parts().1))?;
        // Driven by the kernel, the tick only keeps the thread's list of settled files fresh.
        let tick = match discovery.as_ref() {
            Some(d) if d.event_driven() => EVENTS_TICK,
            _ => opts.rescan,
        };
        let mut rescan = tokio::time::interval(tick);
        rescan.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let forever = Duration::from_secs(u64::MAX / 4);
        // Wake the reader when an eighth of the ring buffer is used; drain on a timer otherwise.
        probes.maps.set_wakeup_bytes(opts.ringbuf_bytes / 8)?;
        probes.maps.set_aggregation(opts.sampling)?;
        probes.windows_for(opts.sampling.is_some());
        // Exit statuses where the kernel's BTF says where they are (restart loops name them).
        probes
            .maps
            .set_exit_code_offset(crate::probe::btf::exit_code_offset().unwrap_or(0))?;
        // Loaded and attached: from here on only discovery and identity need privileges (and
        // attaching, while watching). Threads started later inherit the reduced set.
        if let Err(e) = caps::reduce(watch, !probes.multi()) {
            log::warn!(
                "cudatrace: cannot drop the capabilities it no longer needs ({e}); tracing goes on"
            );
        }
        Ok(Session {
            probes,
            ring,
            registry: Registry::new(opts.limits),
            counts: Counts::default(),
            gone: Vec::new(),
            leaving: Vec::new(),
            harvest: Harvest::new(),
            harvested_at: std::time::Instant::now(),
            headless: Vec::new(),
            checked_at: std::time::Instant::now(),
            cmdline: opts.cmdline,
            discovery,
            found: discovery::Pass::default(),
            discovery_stats,
            asked_full: (0, 0),
            full_deferred: false,
            full_at: std::time::Instant::now(),
            pace: Pace::new(opts.ringbuf_bytes / 8),
            read_budget: Some(std::time::Duration::from_millis(100)),
            harm: super::harm::HarmState::new(kmsg),
            rescan,
            deadline: Box::pin(tokio::time::sleep(opts.duration.unwrap_or(forever))),
            sigint: signal(SignalKind::interrupt())?,
            sigterm: signal(SignalKind::terminate())?,
        })
    }
}
