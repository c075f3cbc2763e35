//! Each cause's alert name, advice and JSON name.
use super::Cause;

impl Cause {
    /// Every cause.
    pub const ALL: [Cause; 16] = [
        Cause::Starvation,
        Cause::MemoryLeak,
        Cause::RestartLoop,
        Cause::OutOfMemory,
        Cause::ComputeContention,
        Cause::CopyContention,
        Cause::MemoryPressure,
        Cause::Throttling,
        Cause::Degradation,
        Cause::WorkloadChange,
        Cause::CpuContention,
        Cause::UntracedContention,
        Cause::CpuOrDriverContention,
        Cause::Unexplained,
        Cause::ProbeHarm,
        Cause::ProbeHarmSuspected,
    ];

    /// The cause of this JSON name, if any.
    pub fn from_name(name: &str) -> Option<Cause> {
        Cause::ALL.into_iter().find(|c| c.as_str() == name)
    }

    /// The alert name for this cause.
    pub fn alert_name(self) -> &'static str {
        match self {
            Cause::Starvation => "CudatraceGpuStarved",
            Cause::OutOfMemory => "CudatraceGpuOutOfMemory",
            Cause::RestartLoop => "CudatraceRestartLoop",
            Cause::MemoryLeak => "CudatraceDeviceMemoryLeak",
            Cause::ComputeContention => "CudatraceComputeContention",
            Cause::CopyContention => "CudatraceCopyContention",
            Cause::MemoryPressure => "CudatraceGpuMemoryPressure",
            Cause::Throttling => "CudatraceGpuThrottled",
            Cause::Degradation => "CudatraceGradualDegradation",
            Cause::WorkloadChange => "CudatraceWorkloadChange",
            Cause::CpuContention => "CudatraceCpuContention",
            Cause::UntracedContention => "CudatraceUntracedContention",
            Cause::CpuOrDriverContention => "CudatraceLaunchLatencyHigh",
            Cause::Unexplained => "CudatraceSlowdown",
            Cause::ProbeHarm => "CudatraceProbeHarm",
            Cause::ProbeHarmSuspected => "CudatraceProbeHarmSuspected",
        }
    }

    /// What to do about it, in a sentence (`cudatrace explain`, the `advice` annotation).
    pub fn advice(self) -> &'static str {
        match self {
            Cause::Starvation => "the named process holds the GPU with long work: split its kernels, move it to another GPU, or give the victim a GPU (or MIG slice) of its own",
            Cause::ComputeContention => "move the named job to another GPU, or cap it with MPS (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE) or a MIG slice; schedule it outside the victim's busy hours",
            Cause::CopyContention => "move the named copier's transfers off the victim's GPU or link, batch them, or schedule them apart",
            Cause::MemoryPressure => "free device memory: lower the named processes' memory limits (PYTORCH_CUDA_ALLOC_CONF, vLLM's gpu_memory_utilization) or move one",
            Cause::OutOfMemory => "the named processes hold the memory: lower their limits or move one; then restart the victim",
            Cause::RestartLoop => "look at the exit statuses and the workload's logs: a crash at start, an OOM kill or a failing probe",
            Cause::MemoryLeak => "the process's device memory keeps growing: look for tensors kept across requests; restart it before the GPU is full",
            Cause::Throttling => "the GPU's clocks are held down: check its cooling, power cap and the node's other load",
            Cause::Degradation => "the workload got slower week by week: compare its request sizes and versions over the window",
            Cause::WorkloadChange => "its own requests changed (bigger batches, longer sequences, more kernels per step): look at the request sizes and the last deploy; no neighbour is to blame",
            Cause::CpuContention => "its launching threads wait for a CPU: pin it to CPUs of its own (cpuset, Kubernetes static CPU manager), raise its CPU limit, or move the named CPU users",
            Cause::UntracedContention => "work cudatrace does not trace shares the GPU: find the named process (nvidia-smi), or trace the library it loads",
            Cause::CpuOrDriverContention => "launches are slower with an idle GPU and no CPU wait: look at the driver (persistence mode, MPS server) and the host",
            Cause::Unexplained => "nothing traced explains it: compare the process's own request sizes and look at what else runs on the host",
            Cause::ProbeHarm => "cudatrace's probe harmed this process, not its own code: the library's probes are detached on this node (breaker open); send the evidence to the cudatrace maintainers, check the kernel against docs/security.md, and `cudatrace breaker --clear LIBRARY` only once it is fixed",
            Cause::ProbeHarmSuspected => "one tenant's process faulted where cudatrace's probe could have harmed it, but nothing corroborates it and other tenants use the library, so its probes stay: look at that tenant's code first (a fault it made on purpose names nobody else); a second tenant faulting the same way, or the kernel's uprobe log, opens the breaker",
        }
    }

    /// The JSON name.
    pub fn as_str(self) -> &'static str {
        match self {
            Cause::Starvation => "starvation",
            Cause::OutOfMemory => "out_of_memory",
            Cause::RestartLoop => "restart_loop",
            Cause::MemoryLeak => "memory_leak",
            Cause::ComputeContention => "compute_contention",
            Cause::CopyContention => "copy_contention",
            Cause::MemoryPressure => "memory_pressure",
            Cause::Throttling => "throttling",
            Cause::Degradation => "degradation",
            Cause::WorkloadChange => "workload_change",
            Cause::CpuContention => "cpu_contention",
            Cause::UntracedContention => "untraced_contention",
            Cause::CpuOrDriverContention => "cpu_or_driver_contention",
            Cause::Unexplained => "unexplained",
            Cause::ProbeHarm => "probe_harm",
            Cause::ProbeHarmSuspected => "probe_harm_suspected",
        }
    }
}
