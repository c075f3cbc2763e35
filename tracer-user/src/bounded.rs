//! An HTTP answer's body read within a bound: the servers cudatrace asks (Prometheus,
//! Alertmanager, the Kubernetes API) are not trusted with its memory.

/// Reads `answer`'s body from `url`, at most `limit` bytes; past it (or on a read error), one
/// line that names `what` was being read and the bound.
pub fn body(
    answer: &mut ureq::http::Response<ureq::Body>,
    limit: u64,
    url: &str,
    what: &str,
) -> Result<Vec<u8>, String> {
    answer
        .body_mut()
        .with_config()
        .limit(limit)
        .read_to_vec()
        .map_err(|e| format!("{url}: reading {what}: {e} (at most {} MiB)", limit >> 20))
}
