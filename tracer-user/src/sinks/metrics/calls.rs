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
use crate::aggregate::BUCKETS;

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
        let errors: Vec<(Labels, f64)> = snap
            .calls
            .iter()
            .map(|c| (call_labels(c), c.series.errors as f64))
            .collect();
        counter(
            &mut enc,
            "cudatrace_call_errors",
            "Driver calls that returned an error (CUresult != 0).",
            &errors,
        )?;
        if !snap.calls.is_empty() {
            let mut m = enc.encode_descriptor(
                "cudatrace_call_duration_seconds",
                "Time from entry to return of driver calls (for launches: CPU-side launch latency).",
                None,
                MetricType::Histogram,
            )?;
            for c in &snap.calls {
                // Per-bucket counts: the encoders make them cumulative.
                let buckets: Vec<(f64, u64)> = BUCKETS
                    .iter()
                    .chain([f64::INFINITY].iter())
                    .copied()
                    .zip(c.series.buckets.iter().copied())
                    .collect();
                m.encode_family(&call_labels(c))?
                    .encode_histogram::<NoLabelSet>(
                        c.series.sum_ns as f64 / 1e9,
                        c.series.calls,
                        &buckets,
                        None,
                    )?;
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
