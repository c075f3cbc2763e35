//! Who a process is: pid plus start time (safe against pid reuse), comm, exe, command line,
//! cgroup path, container id and Kubernetes pod UID from the cgroup path, and
//! `CUDA_VISIBLE_DEVICES`. Read from /proc once per process and cached until it exits.
use serde::Serialize;

mod comm;
mod proc;
mod tenant;
pub mod workload;

pub use comm::Comm;
pub use proc::{
    comm, container_id, parse_alive, parse_cgroup, parse_start_time, parse_visible_devices,
    pod_uid, process_alive, read, start_time, MAX_PROC_READ, MAX_VISIBLE_DEVICES,
};
pub use tenant::Tenant;

/// Identity of one process, as read from /proc when its first event arrived.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Identity {
    /// Start time in clock ticks since boot (field 22 of /proc/PID/stat): pid plus this is unique.
    pub start_time: u64,
    /// Path of the executable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exe: Option<String>,
    /// Command line, arguments joined by spaces.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cmdline: Option<String>,
    /// The cgroup path (v2, else the first v1 hierarchy with a non-root path).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
    /// Container id (docker, containerd, CRI-O) found in the cgroup path.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    /// Kubernetes pod UID found in the cgroup path.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    /// `CUDA_VISIBLE_DEVICES` from the environment, when set: its valid entries only, at most
    /// [`MAX_VISIBLE_DEVICES`] (see [`parse_visible_devices`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cuda_visible_devices: Option<String>,
    /// `CUDA_VISIBLE_DEVICES` entries dropped (past the bound, or not an index or a UUID).
    #[serde(skip)]
    pub devices_dropped: u32,
    /// `NVIDIA_VISIBLE_DEVICES` (what the container runtime gave the container, as host indices
    /// or UUIDs), when it lists devices: its valid entries only, bounded as above.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nvidia_visible_devices: Option<String>,
    /// Namespace, pod and container names, once the node's pod list has them (`run`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kube: Option<PodNames>,
    /// Whether the process was running (not gone, not a zombie) when this was read.
    #[serde(skip)]
    pub alive: bool,
}

impl Identity {
    /// `namespace`, `pod` and `container` as dcgm-exporter labels them: the names once the
    /// node's pod list has them, else the pod UID and container id from the cgroup path.
    pub fn pod_labels(&self) -> [Option<String>; 3] {
        let named = self.kube.as_ref();
        let container = named
            .map(|k| k.container.as_str())
            .filter(|c| !c.is_empty());
        [
            named.map(|k| k.namespace.clone()),
            named
                .map(|k| k.pod.clone())
                .or_else(|| self.pod_uid.clone()),
            container
                .map(str::to_owned)
                .or_else(|| self.container_id.clone()),
        ]
    }
}

/// A traced process as views of it name it: pid, comm and identity.
#[derive(Clone, Copy, Debug)]
pub struct ProcessRef<'a> {
    /// Process id.
    pub pid: u32,
    /// Its comm.
    pub comm: &'a str,
    /// Its identity.
    pub identity: &'a Identity,
    /// Its workload ([`workload`]).
    pub workload: &'a str,
}

/// The Kubernetes names of one process's container.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PodNames {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// The container's name ("" when the pod lists no container with the process's id).
    pub container: String,
    /// The pod's owner as a workload: a Deployment's name (its ReplicaSet's, less the pod
    /// template hash), a StatefulSet's, DaemonSet's or Job's ("" when it has no controller).
    pub owner: String,
    /// The container's restart count, as the pod's status gave it when the process was named.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restarts: Option<u32>,
    /// How its previous instance ended (`lastState.terminated`): `OOMKilled (exit 137)`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_exit: Option<String>,
}
