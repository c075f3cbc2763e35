//! Per (process, api, kernel): calls, errors, the latency histogram, latency quantiles over
//! sliding windows, and bytes copied.
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, NoLabelSet},
    metrics::MetricType,
};

use super::{
    encode::{counter, gauge, with, Labels},
    snapshot::CallRow,
    SnapshotCell,
};
use crate::aggregate::{Failed, BUCKETS};
use tracer_common::Kind;

/// The calls collector.
#[derive(Debug)]
pub struct CallsCollector(pub SnapshotCell);

fn call_labels(c: &CallRow) -> Labels {
    with(
        c.process.labels(),
        &[
            ("api", c.api.symbol().into()),
            ("kind", c.api.info().kind.as_str().into()),
            ("kernel", c.kernel.to_string()),
        ],
    )
}

impl Collector for CallsCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let snap = self.0.load();
        let calls: Vec<(Labels, f64)> = snap
            .calls
            .iter()
            .map(|c| (call_labels(c), c.series.calls as f64))
            .collect();
        counter(
            &mut enc,
            "cudatrace_calls",
            "Driver calls completed.",
            &calls,
        )?;
        let runs: Vec<(Labels, f64)> = snap
            .kernel_runs
            .iter()
            .map(|r| {
                (
                    with(r.process.labels(), &[("kernel", r.kernel.to_string())]),
                    r.runs as f64,
                )
            })
            .collect();
        counter(
            &mut enc,
            "cudatrace_kernel_runs",
            "Kernels run: successful direct launches and the kernels of graph launches of known composition (launches made while their stream captures a graph run nothing).",
            &runs,
        )?;
        // Per result: the `CUresult` name (its number when unknown, `other` past the bound);
        // `not_recorded` for failures counted in-kernel whose record was lost.
        let errors: Vec<(Labels, f64)> = snap
            .calls
            .iter()
            .filter(|c| c.series.errors > 0)
            .flat_map(|c| {
                let named = c.series.failed.as_ref().map_or(&[][..], |f| &f.by_result);
                let seen: u64 = named.iter().map(|(_, n)| n).sum();
                let rest = c.series.errors.saturating_sub(seen);
                named
                    .iter()
                    .map(|(r, n)| (Failed::label(*r), *n))
                    .chain((rest > 0).then(|| ("not_recorded".to_owned(), rest)))
                    .map(|(result, n)| (with(call_labels(c), &[("result", result)]), n as f64))
                    .collect::<Vec<_>>()
            })
            .collect();
        counter(
            &mut enc,
            "cudatrace_call_errors",
            "Driver calls that returned an error (CUresult != 0), by result.",
            &errors,
        )?;
        // Launches that uprobe sessions counted without their return: how much of the
        // durations and failures is the sample's estimate.
        let untimed: Vec<(Labels, f64)> = snap
            .calls
            .iter()
            .filter(|c| c.series.untimed > 0)
            .map(|c| (call_labels(c), c.series.untimed as f64))
            .collect();
        counter(
            &mut enc,
            "cudatrace_calls_untimed",
            "Launches counted at entry without their return (uprobe sessions): exact in cudatrace_calls_total, their durations in the histogram estimated from the sampled launches of the same kernel.",
            &untimed,
        )?;
        // Per process: the share of its launches whose kernel has no known name (its lookup
        // came before cudatrace attached: a restarted agent, a long-lived server), labelled by
        // handle; so a late attach says how much it cannot name.
        let mut launches: std::collections::BTreeMap<u32, (Labels, u64, u64)> = Default::default();
        for c in snap
            .calls
            .iter()
            .filter(|c| c.api.info().kind == Kind::Launch)
        {
            let e = launches
                .entry(c.process.pid)
                .or_insert_with(|| (c.process.labels(), 0, 0));
            e.2 += c.series.calls;
            if c.kernel.starts_with("0x") {
                e.1 += c.series.calls;
            }
        }
        let unnamed: Vec<(Labels, f64)> = launches
            .into_values()
            .filter(|(_, _, all)| *all > 0)
            .map(|(labels, unnamed, all)| (labels, unnamed as f64 / all as f64))
            .collect();
        gauge(
            &mut enc,
            "cudatrace_launches_unnamed_ratio",
            "Share of a process's launches whose kernel has no known name (looked up before cudatrace attached): labelled by handle.",
            &unnamed,
        )?;
        let estimated: Vec<(Labels, f64)> = snap
            .calls
            .iter()
            .filter(|c| c.series.errors_estimated > 0)
            .map(|c| (call_labels(c), c.series.errors_estimated as f64))
            .collect();
        counter(
            &mut enc,
            "cudatrace_call_errors_estimated",
            "Failures estimated among the untimed launches (the sampled launches' failure rate): an estimate, not in cudatrace_call_errors_total.",
            &estimated,
        )?;
        if !snap.calls.is_empty() {
            let mut m = enc.encode_descriptor(
                "cudatrace_call_duration_seconds",
                "Time from entry to return of driver calls (for launches: CPU-side launch latency).",
                None,
                MetricType::Histogram,
            )?;
            for c in &snap.calls {
                // Split by outcome: the failed calls' own buckets, and the rest.
                let none = Failed::default();
                let f = c.series.failed.as_deref().unwrap_or(&none);
                let failed = f.buckets.iter().sum::<u64>();
                let ok: Vec<u64> = c
                    .series
                    .buckets
                    .iter()
                    .zip(&f.buckets)
                    .map(|(all, bad)| all.saturating_sub(*bad))
                    .collect();
                let parts = [
                    (
                        "ok",
                        &ok[..],
                        c.series.sum_ns.saturating_sub(f.sum_ns),
                        c.series.calls.saturating_sub(failed),
                    ),
                    ("error", &f.buckets[..], f.sum_ns, failed),
                ];
                for (outcome, counts, sum_ns, count) in parts {
                    if outcome == "error" && count == 0 {
                        continue;
                    }
                    // Per-bucket counts: the encoders make them cumulative.
                    let buckets: Vec<(f64, u64)> = BUCKETS
                        .iter()
                        .chain([f64::INFINITY].iter())
                        .copied()
                        .zip(counts.iter().copied())
                        .collect();
                    m.encode_family(&with(call_labels(c), &[("outcome", outcome.into())]))?
                        .encode_histogram::<NoLabelSet>(
                            sum_ns as f64 / 1e9,
                            count,
                            &buckets,
                            None,
                        )?;
                }
            }
        }
        let quantiles: Vec<(Labels, f64)> = snap
            .quantiles
            .iter()
            .map(|q| {
                let labels = with(
                    q.process.labels(),
                    &[
                        ("api", q.api.symbol().into()),
                        ("kind", q.api.info().kind.as_str().into()),
                        ("window", q.window.into()),
                        ("q", q.quantile.to_string()),
                    ],
                );
                (labels, q.seconds)
            })
            .collect();
        gauge(
            &mut enc,
            "cudatrace_call_duration_quantile_seconds",
            "Latency quantiles of driver calls per process and api over a sliding window (1m, 5m) or since start (all).",
            &quantiles,
        )?;
        let bytes: Vec<(Labels, f64)> = snap
            .calls
            .iter()
            .filter_map(|c| {
                let dir = c.api.info().direction?;
                Some((
                    with(
                        c.process.labels(),
                        &[
                            ("api", c.api.symbol().into()),
                            ("direction", dir.as_str().into()),
                        ],
                    ),
                    c.series.bytes as f64,
                ))
            })
            .collect();
        counter(
            &mut enc,
            "cudatrace_memcpy_bytes",
            "Bytes copied by driver copy calls.",
            &bytes,
        )
    }
}
