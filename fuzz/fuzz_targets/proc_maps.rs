//! `/proc/PID/maps` text: parsed line by line and read bounded; every mapping found is a
//! libcuda file with an absolute path.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tracer_user::probe::{discovery::is_libcuda, proc_maps as maps};

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        for line in text.lines() {
            if let Some(m) = maps::parse_line(line) {
                assert!(m.path.starts_with('/') && m.inode != 0);
            }
        }
    }
    for m in maps::libcuda_mappings(data) {
        assert!(is_libcuda(m.path.rsplit('/').next().unwrap_or_default()), "{}", m.path);
    }
});
