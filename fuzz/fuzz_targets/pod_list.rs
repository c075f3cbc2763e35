//! A node's pod list as the API server or kubelet answers it: an index within its bounds, or an
//! error.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tracer_user::enrich::pods::{MAX_PODS, PodIndex};

fuzz_target!(|data: &[u8]| {
    if let Ok((index, _)) = PodIndex::parse(data) {
        assert!(index.len() <= MAX_PODS);
    }
});
