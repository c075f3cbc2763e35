//! Ring-buffer records: any bytes decode to a record or an error, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tracer_user::event as decode;

fuzz_target!(|data: &[u8]| {
    let _ = decode::decode_record(data);
    let _ = decode::decode(data);
});
