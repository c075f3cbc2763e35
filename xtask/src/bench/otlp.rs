//! The cost of OTLP export: the workload's launches at full speed for 30 s under `cudatrace
//! run`, OTLP off and then on, side by side in one run. On, `min_duration_us = 0` makes every
//! call written as a record a span: the 1% of launches the kernel samples (`sample_one_in =
//! 100`) and the first 10 a second, sent to a loopback OTLP receiver built on the official
//! protobuf definitions. Tracer CPU per million launches, both ways, and what the receiver got.
use std::path::Path;

use anyhow::Result;
use integration_tests::otlp::Receiver;
use serde_json::{json, Value};

use super::{throughput, Paths};

/// Runs both and returns (JSON, Markdown).
pub fn measure(p: &Paths, _results: &Path) -> Result<(Value, String)> {
    let receiver = Receiver::start();
    let config =
        std::env::temp_dir().join(format!("cudatrace-otlp-bench-{}.toml", std::process::id()));
    std::fs::write(
        &config,
        format!(
            "[otlp]\nendpoint = {:?}\nmin_duration_us = 0\n",
            receiver.url()
        ),
    )?;
    let config = config.display().to_string();
    eprintln!("bench: OTLP, 30 s at full speed under cudatrace run, export off then on");
    let off = throughput(p, &p.cudatrace, (None, 1), &[])?;
    let on = throughput(p, &p.cudatrace, (None, 1), &["--config", &config])?;
    let spans = receiver.spans().len();
    let _ = std::fs::remove_file(&config);
    let ratio = on.cpu_ms_per_million / off.cpu_ms_per_million;
    let v = json!({
        "off": { "launches": off.launches, "calls_per_second": off.calls_per_second, "cpu_ms_per_million": off.cpu_ms_per_million, "events": off.events, "dropped": off.dropped },
        "on": { "launches": on.launches, "calls_per_second": on.calls_per_second, "cpu_ms_per_million": on.cpu_ms_per_million, "events": on.events, "dropped": on.dropped, "spans_received": spans },
        "cpu_ratio_on_to_off": ratio,
    });
    let md = format!(
        "\nOTLP export (30 s of launches at full speed, one thread; on: every recorded call a span, 1% of launches):\n\n\
         | OTLP | launches/s | tracer CPU ms per million launches | records read | spans received |\n|---|---|---|---|---|\n\
         | off | {:.0} | {:.1} | {:.0} | - |\n| on | {:.0} | {:.1} | {:.0} | {spans} |\n\nCPU on/off: {ratio:.2}\n",
        off.calls_per_second, off.cpu_ms_per_million, off.events,
        on.calls_per_second, on.cpu_ms_per_million, on.events,
    );
    Ok((v, md))
}
