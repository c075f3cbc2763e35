//! Kernel names (any bytes a tenant passes to cuModuleGetFunction): demangled within
//! MAX_DEMANGLED bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tracer_user::enrich::kernels;

fuzz_target!(|data: &[u8]| {
    let name = String::from_utf8_lossy(data);
    let label = kernels::demangle(&name);
    assert!(label.len() <= kernels::MAX_DEMANGLED + 4, "{} bytes", label.len());
});
