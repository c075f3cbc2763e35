//! A process that drives two GPUs, its memory known per GPU through the UUIDs it read: named in
//! an out-of-memory alert by what it holds on the victim's GPU, and leaking on the GPU its
//! memory grows on.
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

/// A process whose `CUDA_VISIBLE_DEVICES` is `devices`.
fn visible(devices: &str) -> Arc<Identity> {
    let cuda_visible_devices = Some(devices.into());
    Arc::new(Identity {
        cuda_visible_devices,
        ..Default::default()
    })
}

/// pid 3's CUDA ordinal 0 is NVML's GPU 1 and ordinal 1 is GPU 0 (named by the UUIDs it read);
/// it holds `on_1` bytes on GPU 1 and `on_0` on GPU 0.
fn two_gpu_holder(d: &mut Det, on_1: u64, on_0: u64) {
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
    p.memory.current_bytes = on_1 + on_0;
    p.memory.by_device = [(Some(0), on_1), (Some(1), on_0)].into();
}

#[test]
fn a_two_gpu_holder_is_weighed_by_what_it_holds_on_the_victims_gpu() {
    let mut d = Det::new(DetectConfig::default(), 100, 0.0);
    let (gpu0, both) = (visible("0"), visible("0,1"));
    let gpus = [on_gpu(0, UUID_0), on_gpu(1, UUID_1)];
    let mut out = Vec::new();
    for k in 0..6u32 {
        window(&mut d, 1, &gpu0, 20, 1_000_000);
        window(&mut d, 2, &gpu0, 20, 1_000_000);
        window(&mut d, 3, &both, 20, 1_000_000);
        d.r.live_mut(1).unwrap().memory.current_bytes = 2 << 30;
        d.r.live_mut(2).unwrap().memory.current_bytes = 6 << 30;
        two_gpu_holder(&mut d, 7 << 30, 1 << 30);
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

/// GPU 0 has 1 GiB free, GPU 1 40 GiB. pid 3 holds 1 GiB on GPU 0, steady, and grows by 64 MiB a
/// window on GPU 1: a leak on GPU 1, full in 3,200 s, not GPU 0 full in 80 s.
#[test]
fn a_two_gpu_leak_is_on_the_gpu_it_grows_on() {
    let mut d = Det::new(DetectConfig::default(), 100, 0.0);
    let both = visible("0,1");
    let free = |g: GpuSample, used: u64| GpuSample {
        memory_total: Some(80 << 30),
        memory_used: Some(used),
        ..g
    };
    let gpus = [
        free(on_gpu(0, UUID_0), 79 << 30),
        free(on_gpu(1, UUID_1), 40 << 30),
    ];
    let mut out = Vec::new();
    for k in 0..8u32 {
        window(&mut d, 3, &both, 20, 1_000_000);
        two_gpu_holder(&mut d, u64::from(k) * (64 << 20), 1 << 30);
        close(&mut d, k, &gpus, &mut out);
    }
    let got: Vec<(u32, Vec<_>)> = out.iter().map(|(k, c)| (*k, states(c))).collect();
    let name = "CudatraceDeviceMemoryLeak";
    assert_eq!(
        got,
        vec![(6, vec![(3, "device_memory_growth", "firing", name)])]
    );
    let r = &out[0].1[0];
    assert_eq!(
        (r.gpu.as_str(), r.evidence.now, r.evidence.time_to_full_s),
        ("1", 13_421_773.0, Some(3200.0))
    );
}
