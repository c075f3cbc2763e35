//! End-to-end: kernel names a tenant makes up cannot grow the agent past its memory limit
//! (finding 1 of the second tenant review: nine processes, each looking up 65,536 made-up
//! 254-byte names with a new handle for each, took the daemon to 365 MB, over the chart's
//! 256 MiB). Each process keeps at most 16 MiB of names and all together 64 MiB; past that the
//! oldest handles are forgotten and counted.
use integration_tests::{env, exposition, http, vm_hwm_kib, Cudatrace, Scenario, Workload};

#[test]
fn made_up_kernel_names_stay_within_the_memory_bound() {
    let Some(env) = env() else { return };
    let (daemon, listen) = Cudatrace::start_daemon_on_loopback(&env, &[], &[]);
    let before_kib = vm_hwm_kib(daemon.pid());
    const EACH: u64 = 65_536;
    let tenants: Vec<_> = (0..9)
        .map(|_| {
            Workload::new(
                &env,
                Scenario::Lookups {
                    lookups: EACH,
                    hold_s: 8.0,
                },
            )
            .var("CUDA_STANDIN_FRESH_HANDLES", "1")
            .spawn()
        })
        .collect();
    let reports: Vec<_> = tenants.into_iter().map(|t| t.finish()).collect();
    let samples = exposition::parse(&http::scrape(&listen));
    let lookups = exposition::sum(
        &samples,
        "cudatrace_calls_total",
        &[("api", "cuModuleGetFunction")],
    );
    let forgotten = exposition::sum(
        &samples,
        "cudatrace_table_overflows_total",
        &[("table", "kernel_handles")],
    );
    let peak_kib = vm_hwm_kib(daemon.pid());
    let traced = daemon.stop();
    let dropped = traced.summary()["dropped"];
    eprintln!(
        "e2e made_up_kernel_names_stay_within_the_memory_bound: 9 x {EACH} lookups ({} found); traced {lookups}, {dropped} records dropped; \
         handles forgotten {forgotten}; daemon peak RSS {} MiB (at ready {} MiB)",
        reports.iter().map(|r| r["found"].as_u64().unwrap_or(0)).sum::<u64>(),
        peak_kib / 1024,
        before_kib / 1024
    );
    assert!(reports.iter().all(|r| r["found"] == EACH), "{reports:?}");
    // Every lookup is traced or counted dropped (besides them, at most each tenant's first
    // record, its name, can be among the drops: the ring buffer is full when it starts).
    let (lookups, forgotten) = (lookups as u64, forgotten as u64);
    assert!(
        (9 * EACH..=9 * EACH + 9).contains(&(lookups + dropped)),
        "{lookups} traced, {dropped} dropped: {:?}",
        traced.stderr
    );
    // The names held (64 + 2 x 254 bytes a handle) end between 90% and 100% of 64 MiB; every
    // other handle traced was forgotten and counted. Each tenant's first lookup (its setup's
    // one short name) costs less: a table the trims never reached still holds it, so up to
    // nine handles more than 64 MiB of long names fit.
    let per_handle = 64 + 2 * 254;
    let (most, least) = (
        (64 << 20) / per_handle + 9,
        (64 << 20) / 100 * 90 / per_handle,
    );
    assert!(
        (lookups - most..=lookups - least).contains(&forgotten),
        "{forgotten} forgotten of {lookups}"
    );
    assert!(peak_kib < 160 * 1024, "peak RSS {peak_kib} KiB");
}
