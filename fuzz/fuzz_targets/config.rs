//! The config file: any text is a config or a one-line error.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tracer_user::config::Config;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Err(e) = Config::parse(text) {
            let _ = e.to_string();
        }
    }
});
