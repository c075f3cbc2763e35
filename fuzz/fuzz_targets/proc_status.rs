//! `/proc/PID/stat`, `/proc/PID/status` and `/proc/PID/cgroup` text (a tenant picks its comm
//! and its cgroup names): start time, liveness, capabilities, cgroup path, container and pod
//! ids, never a panic; ids have their fixed shapes.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tracer_user::identity;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let _ = identity::parse_start_time(&text);
    let _ = identity::parse_alive(&text);
    let _ = tracer_common::caps::effective_from_status(&text);
    if let Some(cgroup) = identity::parse_cgroup(&text) {
        if let Some(id) = identity::container_id(&cgroup) {
            assert!(id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
        }
        if let Some(uid) = identity::pod_uid(&cgroup) {
            assert_eq!(uid.len(), 36, "{uid}");
        }
    }
});
