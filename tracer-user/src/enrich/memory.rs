//! Device memory per process from allocations and frees: bytes held now, the peak, and frees of
//! pointers this tracer never saw allocated (allocated before it started, or a bug).

use std::collections::BTreeMap;

use foldhash::HashMap;
use serde::Serialize;

use tracer_common::api::Shape;

use crate::event::{Detail, Event};

/// Live allocations tracked per process at most (16 bytes each).
pub const MAX_LIVE: usize = 65_536;
/// Marks the key of a VMM handle (`cuMemCreate` to `cuMemRelease`), so that handles and device
/// pointers never meet in one table. A handle imported from another process is not traced
/// (not new memory); its release is an unknown free.
const VMM_KEY: u64 = 1 << 63;

/// Device memory of one process (its registry entry holds it).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ProcessMemory {
    /// Bytes allocated and not yet freed.
    pub current_bytes: u64,
    /// Highest `current_bytes` seen.
    pub peak_bytes: u64,
    /// Successful allocations.
    pub allocs: u64,
    /// Successful frees of known pointers.
    pub frees: u64,
    /// Frees of pointers not allocated while traced.
    pub unknown_frees: u64,
    /// Allocations not tracked, the table being full (their bytes still count).
    #[serde(skip)]
    pub overflowed: u64,
    /// Bytes held per CUDA ordinal (`None`: no known device), at most [`MAX_DEVICES`] of them.
    #[serde(skip)]
    pub by_device: BTreeMap<Option<i32>, u64>,
    #[serde(skip)]
    live: HashMap<u64, (u64, Option<i32>)>,
}

/// Devices memory is kept apart for, per process (more, named by a tenant, count as unknown).
pub const MAX_DEVICES: usize = 256;

impl ProcessMemory {
    /// Accounts an allocation or free of no known device; other events are ignored.
    pub fn observe(&mut self, ev: &Event) {
        self.observe_on(ev, None);
    }

    /// Accounts an allocation or free on `device` (the call's context's; a VMM allocation's own
    /// location wins); other events are ignored.
    pub fn observe_on(&mut self, ev: &Event, device: Option<i32>) {
        if ev.result != 0 {
            return;
        }
        let m = self;
        let vmm = matches!(ev.api.info().shape, Shape::VmmCreate | Shape::VmmRelease);
        let key = |p: u64| if vmm { p | VMM_KEY } else { p };
        match ev.detail {
            Detail::Alloc {
                dptr,
                bytes,
                device: own,
                ..
            } if dptr != 0 => {
                let dptr = key(dptr);
                let mut device = own.or(device);
                if m.by_device.len() >= MAX_DEVICES && !m.by_device.contains_key(&device) {
                    device = None;
                }
                if m.live.len() < MAX_LIVE || m.live.contains_key(&dptr) {
                    if let Some((old, on)) = m.live.insert(dptr, (bytes, device)) {
                        // The same pointer again without a free we saw: replace, don't double count.
                        m.current_bytes = m.current_bytes.saturating_sub(old);
                        m.held(on, |h| h.saturating_sub(old));
                    }
                } else {
                    m.overflowed += 1;
                }
                m.current_bytes = m.current_bytes.saturating_add(bytes);
                m.held(device, |h| h.saturating_add(bytes));
                m.peak_bytes = m.peak_bytes.max(m.current_bytes);
                m.allocs += 1;
            }
            Detail::Free { dptr, .. } => match m.live.remove(&key(dptr)) {
                Some((bytes, on)) => {
                    m.current_bytes = m.current_bytes.saturating_sub(bytes);
                    m.held(on, |h| h.saturating_sub(bytes));
                    m.frees += 1;
                }
                None => m.unknown_frees += 1,
            },
            _ => {}
        }
    }

    /// Updates the bytes held on one device.
    fn held(&mut self, device: Option<i32>, f: impl FnOnce(u64) -> u64) {
        let h = self.by_device.entry(device).or_default();
        *h = f(*h);
    }

    /// Forgets the live allocations (the process exited); the totals stay.
    pub fn release(&mut self) {
        self.live = HashMap::default();
    }

    /// Whether the process allocated or freed anything while traced.
    pub fn touched(&self) -> bool {
        self.allocs + self.frees + self.unknown_frees > 0
    }

    /// The `memory:` line printed when the process exits or tracing stops.
    pub fn line(&self, pid: u32) -> String {
        format!(
            "memory: pid={pid} current_bytes={} peak_bytes={} allocs={} frees={} unknown_frees={}",
            self.current_bytes, self.peak_bytes, self.allocs, self.frees, self.unknown_frees
        )
    }
}

#[cfg(test)]
mod tests {
    use tracer_common::Api;

    use super::*;

    fn alloc(api: Api, dptr: u64, bytes: u64, device: Option<i32>) -> Event {
        let detail = Detail::Alloc {
            dptr,
            bytes,
            stream: None,
            device,
        };
        Event::of(api, 1, detail)
    }

    #[test]
    fn allocations_past_the_cap_count_their_bytes_untracked() {
        let mut t = ProcessMemory::default();
        for p in 1..=(MAX_LIVE as u64 + 3) {
            t.observe(&alloc(Api::MemAlloc, p, 2, None));
        }
        assert_eq!(
            (t.live.len(), t.overflowed, t.current_bytes),
            (MAX_LIVE, 3, 2 * (MAX_LIVE as u64 + 3))
        );
    }

    #[test]
    fn vmm_handles_and_device_pointers_are_apart() {
        let mut t = ProcessMemory::default();
        let alloc = |api, dptr, bytes| alloc(api, dptr, bytes, None);
        let free = |api, dptr| Event::of(api, 1, Detail::Free { dptr, stream: None });
        // Handle 7 and device pointer 7: two holdings; each released by its own call only.
        t.observe(&alloc(Api::MemCreate, 7, 2 << 20));
        t.observe(&alloc(Api::MemAlloc, 7, 100));
        t.observe(&alloc(Api::MemAllocManaged, 9, 50));
        assert_eq!(t.current_bytes, (2 << 20) + 150);
        t.observe(&free(Api::MemRelease, 7));
        assert_eq!(t.current_bytes, 150);
        t.observe(&free(Api::MemRelease, 7));
        assert_eq!((t.current_bytes, t.unknown_frees), (150, 1));
        t.observe(&free(Api::MemFree, 7));
        assert_eq!((t.current_bytes, t.frees), (50, 2));
    }

    #[test]
    fn memory_is_held_per_device_a_vmm_location_first() {
        let mut t = ProcessMemory::default();
        t.observe_on(&alloc(Api::MemAlloc, 1, 100, None), Some(0));
        t.observe_on(&alloc(Api::MemCreate, 2, 1000, Some(1)), Some(0));
        t.observe_on(&alloc(Api::MemAlloc, 3, 7, None), None);
        let held = |t: &ProcessMemory| t.by_device.clone().into_iter().collect::<Vec<_>>();
        assert_eq!(held(&t), vec![(None, 7), (Some(0), 100), (Some(1), 1000)]);
        t.observe_on(
            &Event::of(
                Api::MemRelease,
                1,
                Detail::Free {
                    dptr: 2,
                    stream: None,
                },
            ),
            Some(0),
        );
        assert_eq!(held(&t), vec![(None, 7), (Some(0), 100), (Some(1), 0)]);
        assert_eq!(t.current_bytes, 107);
    }

    #[test]
    fn current_peak_and_unknown_frees() {
        let mut t = ProcessMemory::default();
        t.observe(&Event::of(
            Api::MemAlloc,
            1,
            Detail::Alloc {
                dptr: 0x1000,
                bytes: 100,
                stream: None,
                device: None,
            },
        ));
        t.observe(&Event::of(
            Api::MemAllocAsync,
            1,
            Detail::Alloc {
                dptr: 0x2000,
                bytes: 50,
                stream: Some(1),
                device: None,
            },
        ));
        t.observe(&Event::of(
            Api::MemFree,
            1,
            Detail::Free {
                dptr: 0x1000,
                stream: None,
            },
        ));
        t.observe(&Event::of(
            Api::MemFree,
            1,
            Detail::Free {
                dptr: 0x9999,
                stream: None,
            },
        ));
        let mut failed = Event::of(
            Api::MemAlloc,
            1,
            Detail::Alloc {
                dptr: 0x3000,
                bytes: 7,
                stream: None,
                device: None,
            },
        );
        failed.result = 2;
        t.observe(&failed);
        let m = &t;
        assert!(m.touched());
        assert_eq!(
            (
                m.current_bytes,
                m.peak_bytes,
                m.allocs,
                m.frees,
                m.unknown_frees
            ),
            (50, 150, 2, 1, 1)
        );
    }
}
