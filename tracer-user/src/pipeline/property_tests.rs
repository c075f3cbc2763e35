//! Property: any records the ring buffer could hold (any api id, tag, arguments, results,
//! durations, names), decoded, enriched and aggregated as `cudatrace run` does, never panic;
//! every decoded call is counted once, and byte and time totals saturate instead of wrapping.
use std::{sync::Arc, time::Duration};

use proptest::prelude::*;
use tracer_common::{CallEvent, EventTag, LookupEvent, NAME_MAX};

use super::{
    decode::{RingRecord, decode_record},
    enrich::{self, identity::Identity},
};
use crate::{
    aggregate::{Aggregator, SeriesLimits},
    config::DetectConfig,
    detect::Detector,
    registry::{Registry, RegistryLimits},
};

/// A record's bytes: a call, or a lookup with `name`.
fn bytes(call: CallEvent, name: Option<&[u8]>) -> Vec<u8> {
    fn raw<T>(v: &T) -> Vec<u8> {
        // SAFETY: T is a #[repr(C)] record of integers (no padding left uninitialised: every
        // field, `_pad` included, was set), read as bytes for as long as `v` lives.
        unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), std::mem::size_of::<T>()).to_vec() }
    }
    match name {
        None => raw(&call),
        Some(n) => {
            let mut ev = LookupEvent { call: CallEvent { tag: EventTag::Lookup as u32, ..call }, name: [0; NAME_MAX] };
            let len = n.len().min(NAME_MAX);
            ev.name[..len].copy_from_slice(&n[..len]);
            raw(&ev)
        }
    }
}

fn call() -> impl Strategy<Value = (CallEvent, Option<Vec<u8>>)> {
    (
        0u32..50,
        1u32..4,
        any::<[u64; 6]>(),
        any::<u64>(),
        prop_oneof![Just(0i32), any::<i32>()],
        prop_oneof![0u64..10_000_000, any::<u64>()],
        prop::option::weighted(0.1, prop::collection::vec(any::<u8>(), 0..300)),
    )
        .prop_map(|(api, pid, args, out, result, duration_ns, name)| {
            let call = CallEvent {
                tag: EventTag::Call as u32,
                api,
                pid,
                tid: pid,
                start_ns: 1_000_000_000,
                duration_ns,
                result,
                _pad: 0,
                args,
                out,
                comm: *b"fuzzed\0\0\0\0\0\0\0\0\0\0",
            };
            (call, name)
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn any_records_are_counted_once_and_never_wrap(records in prop::collection::vec(call(), 1..120)) {
        let mut registry = Registry::new(RegistryLimits { max_processes: 8, retain_exited: Duration::from_secs(60) });
        let mut aggregator = Aggregator::new(SeriesLimits { top_kernels: 3, max_kernels: 5 });
        let detector = Detector::new(DetectConfig::default(), 0.0);
        let (mut decoded, mut longest) = (0u64, 0u64);
        for (call, name) in &records {
            let Ok(RingRecord::Call(ev)) = decode_record(&bytes(*call, name.as_deref())) else { continue };
            decoded += 1;
            longest = longest.max(ev.duration_ns);
            if registry.live_mut(ev.pid).is_none() {
                registry.insert(ev.pid, ev.comm.clone(), Identity { start_time: 1, alive: true, ..Default::default() });
            }
            let process = registry.live_mut(ev.pid).expect("inserted");
            let e = enrich::enrich(process, &ev);
            aggregator.observe(&mut process.series, &ev, e.kernel.as_deref());
            detector.observe(process, &ev, e.batch.as_ref());
            prop_assert!(process.memory.current_bytes <= process.memory.peak_bytes);
        }
        let views = aggregator.series(&registry);
        let counted: u64 = views.iter().map(|v| v.series.calls).sum();
        prop_assert_eq!(counted, decoded);
        // Sums that wrapped would come out below their largest term.
        let total = views.iter().fold(0u64, |t, v| t.saturating_add(v.series.sum_ns));
        prop_assert!(total >= longest, "total {} < longest {}", total, longest);
        let _ = aggregator.quantiles(&registry);
        let _: Vec<Arc<str>> = views.iter().map(|v| v.kernel.clone()).collect();
    }
}
