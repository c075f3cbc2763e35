//! Small helpers the collectors share: a label list and one call per metric family.
use prometheus_client::{
    encoding::{DescriptorEncoder, NoLabelSet},
    metrics::MetricType,
};

/// A metric's labels, in order.
pub type Labels = Vec<(&'static str, String)>;

/// `labels` followed by `more`.
pub fn with(mut labels: Labels, more: &[(&'static str, String)]) -> Labels {
    labels.extend_from_slice(more);
    labels
}

/// Encodes one gauge family (nothing when it has no rows).
pub fn gauge(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: &[(Labels, f64)],
) -> std::fmt::Result {
    if rows.is_empty() {
        return Ok(());
    }
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, v) in rows {
        m.encode_family(labels)?.encode_gauge(v)?;
    }
    Ok(())
}

/// Encodes one counter family (nothing when it has no rows); `name` without `_total`.
pub fn counter(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: &[(Labels, f64)],
) -> std::fmt::Result {
    if rows.is_empty() {
        return Ok(());
    }
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, v) in rows {
        m.encode_family(labels)?
            .encode_counter::<NoLabelSet, _, f64>(v, None)?;
    }
    Ok(())
}
