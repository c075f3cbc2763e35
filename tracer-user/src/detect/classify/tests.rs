//! Unit tests of the causal verdicts: a party is named only where its submitted work rose.
use super::*;
use crate::{
    alert::Cause,
    detect::{
        causes::Causal,
        change::Rise,
        verdict::{Nows, Reference, Steps},
        Signal,
    },
    nvml::GpuProcess,
};

fn id(cvd: Option<&str>) -> Identity {
    Identity {
        cuda_visible_devices: cvd.map(str::to_owned),
        container_id: Some("c1".into()),
        ..Default::default()
    }
}
fn seen<'a>(pid: u32, comm: &'a str, identity: &'a Identity, activity: Activity) -> Seen<'a> {
    Seen {
        process: ProcessRef {
            pid,
            comm,
            identity,
            workload: "",
        },
        activity,
    }
}
const LIMITS: Thresholds = Thresholds {
    memory_pressure_ratio: 0.95,
    idle_gpu_percent: 10,
    rise: Rise {
        ratio: 0.5,
        min_share: 0.1,
    },
    run_delay_min: 0.02,
    cpu_preemptor_min: 0.1,
    untraced_min_sm: 10.0,
};

fn act(launches: u64) -> Activity {
    Activity {
        launches,
        ..Activity::default()
    }
}

/// Threads per second before and now per pid (None before: it was not there).
fn world(threads: &[(u32, Option<f64>, f64)]) -> (Reference, Nows) {
    let mut r = Reference::default();
    let mut n = Nows::default();
    for (pid, before, now) in threads {
        if let Some(b) = before {
            r.traced.insert(*pid, [Some(*b), Some(0.0), Some(0.0)]);
        }
        n.traced.insert(*pid, [*now, 0.0, 0.0]);
    }
    (r, n)
}

fn run(
    signal: Signal,
    victim: &Seen<'_>,
    everyone: &[Seen<'_>],
    gpus: &[GpuSample],
    w: &(Reference, Nows),
) -> Verdict {
    let c = Causal {
        reference: &w.0,
        nows: &w.1,
        victim_cgroup: Some("/victim"),
    };
    classify(signal, victim, everyone, gpus, LIMITS, &c)
}

fn named(v: &Verdict) -> Vec<(u32, Option<f64>)> {
    v.aggressors.iter().map(|p| (p.pid, p.share)).collect()
}

#[test]
fn only_the_neighbour_whose_work_rose_is_named() {
    let (v, h, light, other_gpu) = (id(Some("0")), id(Some("0")), id(Some("0")), id(Some("1")));
    let everyone = [
        seen(1, "server", &v, act(1000)),
        seen(2, "trainer", &h, act(500)),
        seen(3, "light", &light, act(100)),
        seen(4, "elsewhere", &other_gpu, act(9000)),
    ];
    // The trainer arrived; the light neighbour is unchanged; the one on GPU 1 rose.
    let w = world(&[
        (1, Some(1e6), 1e6),
        (2, None, 8e6),
        (3, Some(2e5), 2e5),
        (4, Some(1.0), 9e9),
    ]);
    let got = run(Signal::WaitPerLaunch, &everyone[0], &everyone, &[], &w);
    assert_eq!(
        (got.cause, got.gpu.as_str()),
        (Cause::ComputeContention, "0")
    );
    assert_eq!(named(&got), vec![(2, Some(1.0))]);
    let c = got.aggressors[0].change.expect("its change");
    assert_eq!((c.before, c.now, c.arrived), (0.0, 8e6, true));
    assert_eq!(got.aggressors[0].container.as_deref(), Some("c1"));
    // Nobody changed: no neighbour is named, however heavy.
    let w = world(&[
        (1, Some(1e6), 1e6),
        (2, Some(8e6), 8e6),
        (3, Some(2e5), 2e5),
    ]);
    let got = run(Signal::WaitPerLaunch, &everyone[0], &everyone, &[], &w);
    assert_eq!((got.cause, got.aggressors.len()), (Cause::Unexplained, 0));
    // Launch latency up on an idle GPU, nobody changed, no run delay read: the driver.
    let got = run(Signal::LaunchLatency, &everyone[0], &everyone, &[], &w);
    assert_eq!(got.cause, Cause::CpuOrDriverContention);
}

#[test]
fn a_neighbour_growing_its_grid_is_named_with_before_and_now_and_shares_follow_the_rise() {
    let (a, b, c) = (id(None), id(None), id(None));
    let everyone = [
        seen(1, "server", &a, act(100)),
        seen(2, "grower", &b, act(100)),
        seen(3, "arrived", &c, act(100)),
    ];
    // Same launches, 5x the threads; another arrives with a rise a third of it.
    let mut w = world(&[(1, Some(1e6), 1e6), (2, Some(1e6), 5e6), (3, None, 2e6)]);
    w.0.steps.insert(
        2,
        Steps {
            threads_per_launch: Some(128.0),
            ..Steps::default()
        },
    );
    w.1.steps.insert(
        2,
        Steps {
            threads_per_launch: Some(640.0),
            ..Steps::default()
        },
    );
    let got = run(Signal::WaitPerLaunch, &everyone[0], &everyone, &[], &w);
    assert_eq!(got.cause, Cause::ComputeContention);
    assert_eq!(named(&got), vec![(2, Some(0.667)), (3, Some(0.333))]);
    assert!(got
        .chain
        .iter()
        .any(|l| l.contains("threads_per_s 1.000e6 → 5.000e6")));
}

#[test]
fn the_victims_own_growth_is_a_workload_change_beside_a_heavy_unchanged_neighbour() {
    let (a, b) = (id(None), id(None));
    let everyone = [
        seen(1, "server", &a, act(100)),
        seen(2, "heavy", &b, act(5000)),
    ];
    // The victim's threads per launch 5x; the heavy neighbour slowed (submits less).
    let mut w = world(&[(1, Some(1e6), 5e6), (2, Some(9e6), 6e6)]);
    w.0.victim = Steps {
        threads_per_launch: Some(8192.0),
        launches_per_step: Some(10.0),
        bytes_per_copy: None,
    };
    w.1.victim = Steps {
        threads_per_launch: Some(40960.0),
        launches_per_step: Some(10.0),
        bytes_per_copy: None,
    };
    let got = run(Signal::WaitPerLaunch, &everyone[0], &everyone, &[], &w);
    assert_eq!(
        (got.cause, got.aggressors.len()),
        (Cause::WorkloadChange, 0)
    );
}

#[test]
fn run_queue_delay_is_cpu_contention_naming_cgroups_whose_cpu_rose() {
    let (a, b) = (id(None), id(None));
    let everyone = [
        seen(1, "server", &a, act(100)),
        seen(2, "light", &b, act(10)),
    ];
    let mut w = world(&[(1, Some(1e6), 1e6), (2, Some(1e5), 1e5)]);
    w.0.run_delay = Some(0.001);
    w.1.run_delay = Some(0.4);
    w.0.cgroups.insert("/hogs".into(), 0.0);
    w.0.cgroups.insert("/steady".into(), 0.5);
    w.0.cgroups.insert("/victim".into(), 0.3);
    w.1.cgroups
        .insert("/hogs".into(), (1.0, Some(std::process::id())));
    w.1.cgroups.insert("/steady".into(), (0.55, Some(1)));
    w.1.cgroups.insert("/victim".into(), (0.9, Some(1)));
    w.1.cgroups.insert("/new".into(), (0.05, Some(1)));
    w.1.throttled = 7;
    let got = run(Signal::LaunchLatency, &everyone[0], &everyone, &[], &w);
    assert_eq!(got.cause, Cause::CpuContention);
    assert_eq!(named(&got), vec![(std::process::id(), Some(1.0))]);
    assert_eq!(got.aggressors[0].cgroup.as_deref(), Some("/hogs"));
    assert_eq!(
        (got.run_delay, got.throttled),
        (Some((0.001, 0.4)), Some(7))
    );
    // A delay that did not rise is no CPU contention.
    w.1.run_delay = Some(0.0012);
    let got = run(Signal::LaunchLatency, &everyone[0], &everyone, &[], &w);
    assert_eq!(got.cause, Cause::CpuOrDriverContention);
}

fn gpu(index: u32, used: u64, reasons: u64, procs: &[(u32, Option<u32>)]) -> GpuSample {
    GpuSample {
        index,
        uuid: format!("GPU-{index}"),
        memory_used: Some(used),
        memory_total: Some(100),
        sm_util: Some(90),
        reasons: Some(reasons),
        processes: procs
            .iter()
            .map(|&(pid, sm)| GpuProcess {
                pid,
                sm_util: sm,
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

#[test]
fn nvml_names_untraced_work_memory_pressure_and_throttling() {
    let (v, n) = (id(None), id(None));
    let everyone = [
        seen(
            1,
            "v",
            &v,
            Activity {
                memory_bytes: 10,
                ..act(10)
            },
        ),
        seen(
            2,
            "n",
            &n,
            Activity {
                memory_bytes: 86,
                ..act(10)
            },
        ),
    ];
    let mut w = world(&[(1, Some(1e6), 1e6), (2, Some(1e6), 1e6)]);
    // An untraced process (pid 9) arrived on GPU 0 at 70%.
    w.1.sm.insert(9, 70.0);
    w.0.sm.insert(1, 20.0);
    w.1.sm.insert(1, 20.0);
    let gpus = [gpu(0, 50, 0, &[(1, Some(20)), (2, Some(5)), (9, Some(70))])];
    let got = run(Signal::WaitPerLaunch, &everyone[0], &everyone, &gpus, &w);
    assert_eq!(got.cause, Cause::UntracedContention);
    assert_eq!(named(&got), vec![(9, Some(1.0))]);
    // Nobody listed, but the GPU went from 30% to 90%: untraced work, nobody named.
    let mut w2 = world(&[(1, Some(1e6), 1e6), (2, Some(1e6), 1e6)]);
    w2.0.gpu.insert(0, 30.0);
    w2.1.gpu.insert(0, 90.0);
    let gpus = [gpu(0, 50, 0, &[(1, None), (2, None)])];
    let got = run(Signal::WaitPerLaunch, &everyone[0], &everyone, &gpus, &w2);
    assert_eq!(
        (got.cause, got.aggressors.len()),
        (Cause::UntracedContention, 0)
    );
    // NVML puts them on different GPUs; GPU 0 throttles.
    let gpus = [
        gpu(0, 50, 0x20 | 0x1, &[(1, None)]),
        gpu(1, 50, 0, &[(2, None)]),
    ];
    let w3 = world(&[(1, Some(1e6), 1e6), (2, None, 1e9)]);
    let got = run(Signal::WaitPerLaunch, &everyone[0], &everyone, &gpus, &w3);
    assert_eq!((got.cause, got.gpu.as_str()), (Cause::Throttling, "0"));
    assert_eq!(
        (got.reasons.clone(), got.memory_ratio, got.utilization),
        (vec!["sw_thermal_slowdown"], Some(0.5), Some(0.9))
    );
    // Same GPU, 96% full: memory pressure, the neighbour by its memory.
    let gpus = [gpu(0, 96, 0, &[(1, None), (2, None)])];
    let got = run(Signal::WaitPerLaunch, &everyone[0], &everyone, &gpus, &w3);
    assert_eq!((got.cause, got.gpu.as_str()), (Cause::MemoryPressure, "0"));
    assert_eq!(named(&got), vec![(2, Some(1.0))]);
}

#[test]
fn copies_blame_copiers_whose_bytes_rose_and_nvml_unlisted_processes_are_not_named() {
    let (a, b, c) = (id(None), id(None), id(None));
    let everyone = [
        seen(1, "a", &a, act(10)),
        seen(2, "b", &b, act(10)),
        seen(3, "fake", &c, act(10)),
    ];
    let mut w = world(&[(1, Some(1.0), 1.0), (2, Some(1.0), 1.0), (3, None, 1e12)]);
    for (pid, before, now) in [(1, 1e6, 1e6), (2, 1e6, 8e6), (3, 0.0, 1e12)] {
        if let Some(x) = w.0.traced.get_mut(&pid) {
            x[2] = Some(before);
        }
        w.1.traced.get_mut(&pid).unwrap()[2] = now;
    }
    // NVML lists 1 and 2, not the fake library's caller.
    let gpus = [gpu(0, 10, 0, &[(1, None), (2, None)])];
    let got = run(Signal::CopyTime, &everyone[0], &everyone, &gpus, &w);
    assert_eq!(got.cause, Cause::CopyContention);
    assert_eq!(named(&got), vec![(2, Some(1.0))]);
    assert!(vouched(1, &gpus) && vouched(2, &gpus) && !vouched(3, &gpus));
    assert!(vouched(3, &[]));
}

/// On a MIG GPU the GPU instance is the unit: two instances of GPU 0 share nothing, one
/// instance is shared, and the parent GPU's facts are no instance's.
#[test]
fn mig_instances_of_one_gpu_are_not_neighbours() {
    let on = |pid, gi| GpuProcess {
        pid,
        gpu_instance: gi,
        ..Default::default()
    };
    let g = GpuSample {
        index: 0,
        sm_util: Some(95),
        processes: vec![on(1, Some(1)), on(2, Some(2)), on(3, Some(1)), on(4, None)],
        ..Default::default()
    };
    let gpus = [g];
    let set = |pid| gpus_of(pid, &id(None), &gpus);
    assert_eq!(set(1), GpuSet::Only(vec!["0/gi1".into()]));
    assert_eq!(set(1).shared_with(&set(2)), None);
    assert_eq!(set(1).shared_with(&set(3)), Some("0/gi1".into()));
    assert_eq!(set(4).shared_with(&set(1)), None);
    assert!(!set(1).holds(0) && set(4).holds(0));
    // A process NVML does not list, given MIG instances by its environment: the older
    // `MIG-GPU-<uuid>/<gi>/<ci>` form is the instance, so it shares with pid 1 (gi 1) only.
    let gpus = [GpuSample {
        uuid: "GPU-aaaa".into(),
        ..gpus[0].clone()
    }];
    let env = |v: &str| Identity {
        nvidia_visible_devices: Some(v.into()),
        ..Default::default()
    };
    let by_env = gpus_of(9, &env("MIG-GPU-aaaa/1/0"), &gpus);
    assert_eq!(by_env, GpuSet::Only(vec!["0/gi1".into()]));
    let set = |pid| gpus_of(pid, &id(None), &gpus);
    assert_eq!(by_env.shared_with(&set(1)), Some("0/gi1".into()));
    assert_eq!(by_env.shared_with(&set(2)), None);
    assert_eq!(
        gpus_of(9, &env("MIG-GPU-aaaa/2/0"), &gpus).shared_with(&set(1)),
        None
    );
    // An unknown parent, or a MIG device NVML does not list, stays as written.
    assert_eq!(
        gpus_of(9, &env("MIG-GPU-zzzz/1/0,MIG-8932f937"), &gpus),
        GpuSet::Only(vec!["MIG-GPU-zzzz/1/0".into(), "MIG-8932f937".into()])
    );
    // The newer form, `MIG-<uuid>`: the instance NVML lists that MIG device in.
    let gpus = [GpuSample {
        mig: vec![
            crate::nvml::MigDevice {
                uuid: "MIG-8932f937".into(),
                gpu_instance: 2,
            },
            crate::nvml::MigDevice {
                uuid: "MIG-11112222".into(),
                gpu_instance: 1,
            },
        ],
        ..gpus[0].clone()
    }];
    let set = |pid| gpus_of(pid, &id(None), &gpus);
    let newer = gpus_of(9, &env("MIG-11112222"), &gpus);
    assert_eq!(newer, GpuSet::Only(vec!["0/gi1".into()]));
    assert_eq!(newer.shared_with(&set(1)), Some("0/gi1".into()));
    assert_eq!(newer.shared_with(&set(2)), None);
    assert_eq!(
        gpus_of(9, &env("MIG-8932f937"), &gpus),
        GpuSet::Only(vec!["0/gi2".into()])
    );
}

/// A PCI bus id in the environment is the GPU NVML gives that bus id, however it is spelled.
#[test]
fn pci_bus_ids_are_nvml_indices() {
    let mut gpus = vec![gpu(0, 0, 0, &[]), gpu(1, 0, 0, &[])];
    gpus[0].pci_bus = pci_bus("00000000:18:00.0");
    gpus[1].pci_bus = pci_bus("00000000:3B:00.0");
    let env = |v: &str| Identity {
        nvidia_visible_devices: Some(v.into()),
        ..Default::default()
    };
    assert_eq!(
        gpus_of(9, &env("0000:3b:00.0"), &gpus),
        GpuSet::Only(vec!["1".into()])
    );
    assert_eq!(
        gpus_of(9, &env("18:00.0,00000000:3B:00.0"), &gpus),
        GpuSet::Only(vec!["0".into(), "1".into()])
    );
    // Unknown, or not a bus id: kept as written.
    assert_eq!(
        gpus_of(9, &env("0000:5e:00.0,3b:00"), &gpus),
        GpuSet::Only(vec!["0000:5e:00.0".into(), "3b:00".into()])
    );
    assert_eq!(pci_bus("123456789:3b:00.0"), None);
    assert_eq!(pci_bus("3B:00.0"), Some((0, 0x3b, 0, 0)));
}

/// A container's devices: CUDA_VISIBLE_DEVICES indices are positions in NVIDIA_VISIBLE_DEVICES
/// (host indices or UUIDs); UUIDs NVML knows become its indices.
#[test]
fn container_device_indices_are_read_through_the_runtime_list() {
    let with = |cuda: Option<&str>, nvidia: Option<&str>| Identity {
        cuda_visible_devices: cuda.map(str::to_owned),
        nvidia_visible_devices: nvidia.map(str::to_owned),
        ..Default::default()
    };
    let host = |c, n| host_devices(&with(c, n));
    assert_eq!(host(None, None), None);
    assert_eq!(host(Some("1"), None), Some(vec!["1".into()]));
    assert_eq!(host(None, Some("2,3")), Some(vec!["2".into(), "3".into()]));
    assert_eq!(host(Some("1"), Some("2,3")), Some(vec!["3".into()]));
    // Index 5 is past the container's two devices: CUDA stops there.
    assert_eq!(host(Some("0,5,1"), Some("2,3")), Some(vec!["2".into()]));
    let gpu = |index, uuid: &str| GpuSample {
        index,
        uuid: uuid.into(),
        ..Default::default()
    };
    let gpus = [gpu(0, "GPU-aaaa"), gpu(1, "GPU-bbbb")];
    assert_eq!(
        gpus_of(7, &with(Some("0"), Some("GPU-bbbb")), &gpus),
        GpuSet::Only(vec!["1".into()])
    );
    assert_eq!(
        gpus_of(7, &with(None, Some("GPU-aaaa,GPU-bbbb")), &gpus),
        GpuSet::Only(vec!["0".into(), "1".into()])
    );
}
