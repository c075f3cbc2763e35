//! An HTTP answer's body read within a bound: the servers cudatrace asks (Prometheus,
//! Alertmanager, the Kubernetes API) are not trusted with its memory; and the CA certificates a
//! client trusts, read from a PEM file.

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

/// Largest CA file read.
const MAX_CA_BYTES: u64 = 1 << 20;

/// The certificates of the PEM file `path` (at most 1 MiB), for a client to trust; one line
/// when it cannot be read or holds none.
pub fn pem_certificates(
    path: &std::path::Path,
) -> Result<Vec<ureq::tls::Certificate<'static>>, String> {
    use std::io::Read as _;
    let mut pem = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_CA_BYTES).read_to_end(&mut pem))
        .map_err(|e| format!("cannot read the CA certificate {} ({e})", path.display()))?;
    let certs: Vec<ureq::tls::Certificate<'static>> = ureq::tls::parse_pem(&pem)
        .filter_map(|item| match item {
            Ok(ureq::tls::PemItem::Certificate(c)) => Some(c),
            _ => None,
        })
        .collect();
    if certs.is_empty() {
        return Err(format!("no PEM certificate in {}", path.display()));
    }
    Ok(certs)
}
