//! Out of memory beside a process that drives two GPUs: it is named by what it holds on the
//! victim's GPU, found through the UUIDs it read, not by all it holds.
use super::*;
use crate::event::context::ContextCall;

const UUID_0: &str = "00000000-1111-2222-3333-444444444444";
const UUID_1: &str = "55555555-6666-7777-8888-999999999999";

fn on_gpu(index: u32, uuid: &str) -> GpuSample {
    GpuSample {
        index,
        uuid: format!("GPU-{}", uuid.to_uppercase()),
        ..Default::default()
    }
}

/// pid 3's CUDA ordinal 0 is NVML's GPU 1 and ordinal 1 is GPU 0 (named by the UUIDs it read);
/// it holds 7 GiB on GPU 1 and 1 GiB on GPU 0.
fn two_gpu_holder(d: &mut Det) {
    let p = d.r.live_mut(3).unwrap();
    let call = |c| {
        let mut e = Event::of(Api::DevicePrimaryCtxRetain, 3, Detail::Context(c));
        e.tid = 3;
        e
    };
    for (ctx, device, uuid) in [(0xa, 0, UUID_1), (0xb, 1, UUID_0)] {
        p.devices.observe(&call(ContextCall::Bind {
            context: ctx,
            device,
            created: false,
        }));
        p.devices.observe(&call(ContextCall::Uuid {
            device,
            uuid: uuid.into(),
        }));
    }
    p.memory.current_bytes = 8 << 30;
    p.memory.by_device = [(Some(0), 7 << 30), (Some(1), 1 << 30)].into();
}

#[test]
fn a_two_gpu_holder_is_weighed_by_what_it_holds_on_the_victims_gpu() {
    let mut d = Det::new(DetectConfig::default(), 100, 0.0);
    let gpu0 = Arc::new(Identity {
        cuda_visible_devices: Some("0".into()),
        ..Default::default()
    });
    let both = Arc::new(Identity {
        cuda_visible_devices: Some("0,1".into()),
        ..Default::default()
    });
    let gpus = [on_gpu(0, UUID_0), on_gpu(1, UUID_1)];
    let mut out = Vec::new();
    for k in 0..6u32 {
        window(&mut d, 1, &gpu0, 20, 1_000_000);
        window(&mut d, 2, &gpu0, 20, 1_000_000);
        window(&mut d, 3, &both, 20, 1_000_000);
        d.r.live_mut(1).unwrap().memory.current_bytes = 2 << 30;
        d.r.live_mut(2).unwrap().memory.current_bytes = 6 << 30;
        two_gpu_holder(&mut d);
        if k == 3 {
            d.observe(&refused(1, 1 << 30), &gpu0, None);
        }
        close(&mut d, k, &gpus, &mut out);
    }
    let firing = &out[0].1[0];
    assert_eq!(
        (out[0].0, firing.alert, firing.gpu.as_str()),
        (4, "CudatraceGpuOutOfMemory", "0")
    );
    let held: Vec<(u32, Option<f64>)> =
        firing.aggressors.iter().map(|a| (a.pid, a.share)).collect();
    // 6 + 2 + 1 GiB on GPU 0: pid 3's 7 GiB on GPU 1 are not GPU 0's.
    assert_eq!(
        held,
        vec![(2, Some(0.667)), (1, Some(0.222)), (3, Some(0.111))]
    );
}
