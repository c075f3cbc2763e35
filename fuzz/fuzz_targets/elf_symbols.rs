//! A library file's bytes (a tenant can map any file named libcuda.so.1): entry points resolved
//! or an error, never a panic; every offset lies within the file.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tracer_user::probe::symbols;

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = symbols::resolve_bytes(data, std::path::Path::new("fuzz")) {
        assert_eq!(r.found.len() + r.missing.len() + r.aliases.len(), tracer_common::Api::ALL.len());
    }
});
