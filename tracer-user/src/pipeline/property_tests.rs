//! Property: any records the ring buffer could hold (any api id, tag, arguments, results,
//! durations, names, flags), decoded, enriched and aggregated as `cudatrace run` does, with any
//! gains of in-kernel launch cells between them, never panic; every call is counted once (a
//! record the kernel counted already, never), and byte and time totals saturate instead of
//! wrapping.
use std::{sync::Arc, time::Duration};

use proptest::prelude::*;
use tracer_common::{
    launches::{FLAG_COUNTED, LATENCY_BUCKETS},
    Api, CallEvent, EventTag, LookupEvent, NAME_MAX,
};

use crate::{
    aggregate::Aggregator, aggregate::SeriesLimits, config::DetectConfig, detect::Detector,
    registry::Registry, registry::RegistryLimits,
};
use crate::{
    event::{decode_record, LaunchDelta, RingRecord},
    identity::Identity,
};

/// A record's bytes: a call, or a lookup with `name`.
fn bytes(call: CallEvent, name: Option<&[u8]>) -> Vec<u8> {
    fn raw<T>(v: &T) -> Vec<u8> {
        // SAFETY: T is a #[repr(C)] record of integers without padding, read as bytes for as
        // long as `v` lives.
        unsafe {
            std::slice::from_raw_parts((v as *const T).cast::<u8>(), std::mem::size_of::<T>())
                .to_vec()
        }
    }
    match name {
        None => raw(&call),
        Some(n) => {
            let mut ev = LookupEvent {
                call: CallEvent {
                    tag: EventTag::Lookup as u32,
                    ..call
                },
                name: [0; NAME_MAX],
            };
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
        prop_oneof![Just(0u32), Just(FLAG_COUNTED), any::<u32>()],
    )
        .prop_map(|(api, pid, args, out, result, duration_ns, name, flags)| {
            let call = CallEvent {
                tag: EventTag::Call as u32,
                api,
                pid,
                tid: pid,
                start_ns: 1_000_000_000,
                duration_ns,
                result,
                flags,
                args,
                out,
            };
            (call, name)
        })
}

/// A cell's gain: any launch api, kernel, bucket (past the last too), counts and sums.
fn delta() -> impl Strategy<Value = (u32, LaunchDelta)> {
    (
        1u32..4,
        0usize..6,
        0u64..8,
        0u32..LATENCY_BUCKETS + 3,
        1u64..1_000_000,
        any::<u64>(),
        any::<u64>(),
    )
        .prop_map(|(pid, api, function, bucket, count, errors, sum_ns)| {
            let api = Api::ALL[api];
            (
                pid,
                LaunchDelta {
                    api,
                    function,
                    bucket,
                    count,
                    errors: errors % (count + 1),
                    sum_ns,
                    threads: sum_ns / 7,
                    untimed: 0,
                    estimated_errors: 0,
                },
            )
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn any_records_are_counted_once_and_never_wrap(
        records in prop::collection::vec(call(), 1..120),
        deltas in prop::collection::vec(delta(), 0..20),
    ) {
        let mut registry = Registry::new(RegistryLimits { max_processes: 8, retain_exited: Duration::from_secs(60) });
        let mut aggregator = Aggregator::new(SeriesLimits { top_kernels: 3, max_kernels: 5 });
        let detector = Detector::new(DetectConfig::default(), 0.0);
        let (mut decoded, mut longest) = (0u64, 0u64);
        for (pid, d) in &deltas {
            if registry.live_mut(*pid).is_none() {
                registry.insert(*pid, "cells".into(), Identity { start_time: 1, alive: true, ..Default::default() });
            }
            let process = registry.live_mut(*pid).expect("inserted");
            aggregator.observe_launches(&mut process.series, d, None);
            detector.observe_launches(&mut process.signals, d);
            decoded += d.count;
            longest = longest.max(d.sum_ns);
        }
        for (call, name) in &records {
            let Ok(RingRecord::Call(ev)) = decode_record(&bytes(*call, name.as_deref())) else { continue };
            if !ev.counted {
                decoded += 1;
                longest = longest.max(ev.duration_ns);
            }
            if registry.live_mut(ev.pid).is_none() {
                registry.insert(ev.pid, ev.comm, Identity { start_time: 1, alive: true, ..Default::default() });
            }
            let process = registry.live_mut(ev.pid).expect("inserted");
            let e = process.enrich(&ev);
            aggregator.observe(&mut process.series, &ev, e.kernel.as_deref(), e.captured);
            detector.observe(&mut process.signals, &ev, e.batch.as_ref());
            prop_assert!(process.memory.current_bytes <= process.memory.peak_bytes);
        }
        let views = aggregator.series(registry.series());
        let counted: u64 = views.iter().map(|v| v.series.calls).sum();
        prop_assert_eq!(counted, decoded);
        // Sums that wrapped would come out below their largest term.
        let total = views.iter().fold(0u64, |t, v| t.saturating_add(v.series.sum_ns));
        prop_assert!(total >= longest, "total {} < longest {}", total, longest);
        let _ = aggregator.quantiles(registry.series());
        let _: Vec<Arc<str>> = views.iter().map(|v| v.kernel.clone()).collect();
    }
}
