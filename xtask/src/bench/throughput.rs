//! Throughput: the workload's launches at full speed for 30 s under `cudatrace run` (optionally
//! scraped, optionally with extra arguments): rate, drops, tracer CPU per million launches, RSS.
use std::{
    path::Path,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use anyhow::Result;
use integration_tests::{free_port, http};
use serde_json::Value;

use super::{cpu_seconds, launches_of, rss_bytes, scrape, start_binary, workload, Paths};

/// What one throughput run measured.
pub(super) struct Throughput {
    pub(super) calls_per_second: f64,
    pub(super) seconds: Value,
    /// Launches the workload made.
    pub(super) calls: f64,
    /// Launches `cudatrace_calls_total` counted.
    pub(super) launches: f64,
    /// Records read from the ring buffer.
    pub(super) events: f64,
    pub(super) dropped: f64,
    /// Tracer CPU per million launches.
    pub(super) cpu_ms_per_million: f64,
    pub(super) scrapes: u64,
    pub(super) scrape_ms_max: f64,
    /// Tracer RSS when the workload started and when it ended, bytes.
    pub(super) rss: (u64, u64),
}

/// `threads` workload threads at full speed for 30 s under `cudatrace run`; with `scrape_hz`, a
/// client scrapes `/metrics` that often meanwhile.
pub(super) fn throughput(
    p: &Paths,
    bin: &Path,
    (scrape_hz, threads): (Option<u32>, u32),
    extra: &[&str],
) -> Result<Throughput> {
    let port = free_port();
    let t = start_binary(bin, p, port, (extra, &[]))?;
    let stop = Arc::new(AtomicBool::new(false));
    let (scrapes, slowest_us) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let scraper = scrape_hz.map(|hz| {
        let (stop, scrapes, slowest_us) = (stop.clone(), scrapes.clone(), slowest_us.clone());
        std::thread::spawn(move || {
            let url = format!("http://127.0.0.1:{port}/metrics");
            let period = Duration::from_secs_f64(1.0 / f64::from(hz));
            let mut next = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                let start = Instant::now();
                if http::try_get(&url, None).is_ok() {
                    scrapes.fetch_add(1, Ordering::Relaxed);
                    slowest_us.fetch_max(start.elapsed().as_micros() as u64, Ordering::Relaxed);
                }
                next += period;
                std::thread::sleep(next.saturating_duration_since(Instant::now()));
            }
        })
    });
    let cpu0 = cpu_seconds(t.pid())?;
    let rss0 = rss_bytes(t.pid())?;
    let r = workload(
        p,
        &[
            "--threads",
            &threads.to_string(),
            "calls",
            "1000000000",
            "30",
        ],
    )?;
    stop.store(true, Ordering::Relaxed);
    if let Some(s) = scraper {
        let _ = s.join();
    }
    std::thread::sleep(Duration::from_millis(1500));
    let cpu1 = cpu_seconds(t.pid())?;
    let events = scrape(port, "cudatrace_events_total")?;
    let dropped = scrape(port, "cudatrace_events_dropped_total")?;
    let launches = launches_of(port)?;
    let rss1 = rss_bytes(t.pid())?;
    t.stop()?;
    Ok(Throughput {
        calls_per_second: r["calls_per_second"].as_f64().unwrap_or(0.0),
        seconds: r["seconds"].clone(),
        calls: r["calls"].as_f64().unwrap_or(0.0),
        launches,
        events,
        dropped,
        cpu_ms_per_million: (cpu1 - cpu0) * 1e3 / (launches / 1e6),
        scrapes: scrapes.load(Ordering::Relaxed),
        scrape_ms_max: slowest_us.load(Ordering::Relaxed) as f64 / 1e3,
        rss: (rss0, rss1),
    })
}
