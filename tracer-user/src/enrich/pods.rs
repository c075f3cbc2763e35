//! Kubernetes names of a process: namespace, pod and container, from the node's pod list (a
//! `PodList` as the API server and the kubelet's `/pods` serve it), matched by the pod UID and
//! container id its cgroup path gives. The list is fetched off the event loop
//! ([`super::pods_api`]); this module parses it, bounded; the registry labels its processes from it
//! (`Registry::label_pods`).
use std::sync::Arc;

use foldhash::HashMap;
use serde::Deserialize;

use crate::identity::PodNames;

/// Pods indexed at most: more than any node runs (the kubelet's default limit is 110).
pub const MAX_PODS: usize = 4096;
/// Containers of one pod indexed at most (regular, init and ephemeral together).
pub const MAX_CONTAINERS: usize = 64;
/// Longest name kept: Kubernetes names are at most 253 characters.
const MAX_NAME: usize = 253;

/// One pod: its names and its containers' ids and names.
#[derive(Debug)]
struct PodEntry {
    namespace: Arc<str>,
    name: Arc<str>,
    /// Its owner as a workload ("" without a controller).
    owner: Arc<str>,
    containers: Vec<Container>,
}

/// One container of a pod: its id, name, restart count and how its last instance ended.
#[derive(Debug)]
struct Container {
    id: String,
    name: Arc<str>,
    restarts: Option<u32>,
    last_exit: Option<String>,
}

/// The node's pods by UID, as last fetched.
#[derive(Debug, Default)]
pub struct PodIndex {
    pods: HashMap<String, PodEntry>,
}

#[derive(Deserialize)]
struct PodList {
    #[serde(default)]
    items: Bounded<Pod, MAX_PODS>,
}

/// What a bounded list keeps of its elements.
trait Keep {
    /// Whether this element is worth a place in the list.
    fn keep(&self) -> bool;
}

/// A JSON array read with at most `N` kept elements (those [`Keep`] accepts): past them,
/// elements are skipped as they are parsed, never held, so memory is bounded by `N` whatever
/// the array's length. Every element is counted.
struct Bounded<T, const N: usize> {
    kept: Vec<T>,
    total: usize,
}

impl<T, const N: usize> Default for Bounded<T, N> {
    fn default() -> Self {
        Bounded {
            kept: Vec::new(),
            total: 0,
        }
    }
}

impl<'de, T: Deserialize<'de> + Keep, const N: usize> Deserialize<'de> for Bounded<T, N> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit<T, const N: usize>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de> + Keep, const N: usize> serde::de::Visitor<'de> for Visit<T, N> {
            type Value = Bounded<T, N>;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an array")
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Self::Value, A::Error> {
                let mut out = Bounded::default();
                while out.kept.len() < N {
                    let Some(t) = seq.next_element::<T>()? else {
                        return Ok(out);
                    };
                    out.total += 1;
                    if t.keep() {
                        out.kept.push(t);
                    }
                }
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {
                    out.total += 1;
                }
                Ok(out)
            }
        }
        d.deserialize_seq(Visit::<T, N>(std::marker::PhantomData))
    }
}

impl Keep for Pod {
    fn keep(&self) -> bool {
        !self.metadata.uid.is_empty()
    }
}

impl Keep for OwnerRef {
    fn keep(&self) -> bool {
        self.controller == Some(true)
    }
}

impl Keep for ContainerStatus {
    fn keep(&self) -> bool {
        self.container_id.is_some()
    }
}

#[derive(Deserialize)]
struct Pod {
    #[serde(default)]
    metadata: Meta,
    #[serde(default)]
    status: Option<Status>,
}

#[derive(Default, Deserialize)]
struct Meta {
    #[serde(default)]
    name: String,
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    uid: String,
    #[serde(default, rename = "ownerReferences")]
    owner_references: Option<Bounded<OwnerRef, 8>>,
    #[serde(default)]
    labels: Option<PodLabels>,
}

/// A pod's controller (only the one with `controller: true` is kept).
#[derive(Deserialize)]
struct OwnerRef {
    #[serde(default)]
    kind: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    controller: Option<bool>,
}

/// The one label read: the other labels are skipped unheld.
#[derive(Default, Deserialize)]
struct PodLabels {
    #[serde(default, rename = "pod-template-hash")]
    pod_template_hash: Option<String>,
}

impl Meta {
    /// The owner as a workload: a ReplicaSet's name less `-HASH` (its Deployment's name), any
    /// other controller's name, "" without one.
    fn owner(&self) -> String {
        let Some(c) = self.owner_references.as_ref().and_then(|o| o.kept.first()) else {
            return String::new();
        };
        let hash = self
            .labels
            .as_ref()
            .and_then(|l| l.pod_template_hash.as_deref());
        match (c.kind.as_str(), hash) {
            ("ReplicaSet", Some(h)) if !h.is_empty() => c
                .name
                .strip_suffix(h)
                .and_then(|n| n.strip_suffix('-'))
                .unwrap_or(&c.name)
                .to_owned(),
            _ => c.name.clone(),
        }
    }
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Status {
    #[serde(default)]
    container_statuses: Option<Bounded<ContainerStatus, MAX_CONTAINERS>>,
    #[serde(default)]
    init_container_statuses: Option<Bounded<ContainerStatus, MAX_CONTAINERS>>,
    #[serde(default)]
    ephemeral_container_statuses: Option<Bounded<ContainerStatus, MAX_CONTAINERS>>,
}

#[derive(Deserialize)]
struct ContainerStatus {
    #[serde(default)]
    name: String,
    #[serde(default, rename = "containerID")]
    container_id: Option<String>,
    #[serde(default, rename = "restartCount")]
    restart_count: Option<u32>,
    #[serde(default, rename = "lastState")]
    last_state: Option<LastState>,
}

/// `lastState`: only how the previous instance terminated is read.
#[derive(Default, Deserialize)]
struct LastState {
    #[serde(default)]
    terminated: Option<Terminated>,
}

#[derive(Default, Deserialize)]
struct Terminated {
    #[serde(default, rename = "exitCode")]
    exit_code: Option<i32>,
    #[serde(default)]
    reason: Option<String>,
}

impl Terminated {
    /// `OOMKilled (exit 137)`, `Error (exit 1)`, `exit 3`.
    fn words(&self) -> Option<String> {
        let code = self.exit_code.map(|c| format!("exit {c}"));
        match (self.reason.as_deref().map(clean), code) {
            (Some(r), Some(c)) => Some(format!("{r} ({c})")),
            (Some(r), None) => Some(r.to_string()),
            (None, c) => c,
        }
    }
}

/// A name as a label may carry it: printable, at most [`MAX_NAME`] characters.
fn clean(name: &str) -> Arc<str> {
    name.chars()
        .filter(|c| !c.is_control())
        .take(MAX_NAME)
        .collect::<String>()
        .into()
}

impl PodIndex {
    /// Parses a `PodList`; at most [`MAX_PODS`] pods and [`MAX_CONTAINERS`] containers each,
    /// capped while parsing (the rest are skipped unheld). Returns the index and how many pods
    /// were left out.
    pub fn parse(json: &[u8]) -> Result<(PodIndex, usize), serde_json::Error> {
        let list: PodList = serde_json::from_slice(json)?;
        let total = list.items.total;
        let mut pods = HashMap::default();
        for pod in list.items.kept {
            let status = pod.status.unwrap_or_default();
            let containers = [
                status.container_statuses,
                status.init_container_statuses,
                status.ephemeral_container_statuses,
            ]
            .into_iter()
            .flatten()
            .flat_map(|b| b.kept)
            .filter_map(|c| {
                // `containerd://<id>`, `cri-o://<id>`, `docker://<id>`.
                let id = c.container_id?;
                let id = id
                    .rsplit_once("://")
                    .map_or(id.as_str(), |(_, id)| id)
                    .to_owned();
                let last_exit = c
                    .last_state
                    .and_then(|s| s.terminated)
                    .and_then(|t| t.words());
                Some(Container {
                    id,
                    name: clean(&c.name),
                    restarts: c.restart_count,
                    last_exit,
                })
            })
            .take(MAX_CONTAINERS)
            .collect();
            let entry = PodEntry {
                namespace: clean(&pod.metadata.namespace),
                name: clean(&pod.metadata.name),
                owner: clean(&pod.metadata.owner()),
                containers,
            };
            pods.insert(pod.metadata.uid.chars().take(MAX_NAME).collect(), entry);
        }
        let left_out = total - pods.len().min(total);
        Ok((PodIndex { pods }, left_out))
    }

    /// How many pods it holds.
    pub fn len(&self) -> usize {
        self.pods.len()
    }

    /// Whether it holds no pod.
    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }

    /// The names of the container `container_id` (when known) of the pod `uid`.
    pub fn names(&self, uid: &str, container_id: Option<&str>) -> Option<PodNames> {
        let pod = self.pods.get(uid)?;
        let c = container_id.and_then(|id| pod.containers.iter().find(|c| c.id == id));
        Some(PodNames {
            namespace: pod.namespace.to_string(),
            pod: pod.name.to_string(),
            container: c.map_or_else(String::new, |c| c.name.to_string()),
            owner: pod.owner.to_string(),
            restarts: c.and_then(|c| c.restarts),
            last_exit: c.and_then(|c| c.last_exit.clone()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIST: &str = r#"{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"7"},"items":[
      {"metadata":{"name":"llm-0","namespace":"serving","uid":"0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0"},
       "spec":{"nodeName":"gpu-7"},
       "status":{"phase":"Running",
         "initContainerStatuses":[{"name":"fetch","containerID":"containerd://aaa"}],
         "containerStatuses":[{"name":"server","containerID":"containerd://bbb"},{"name":"sidecar"}]}},
      {"metadata":{"name":"pending","namespace":"x","uid":"u2"},"status":null},
      {"metadata":{"name":"no-uid","namespace":"x"}}]}"#;

    #[test]
    fn owners_are_workloads() {
        let list = r#"{"items":[
          {"metadata":{"name":"llm-7d9f8b6c5d-x2x4z","namespace":"serving","uid":"d",
             "labels":{"app":"llm","pod-template-hash":"7d9f8b6c5d"},
             "ownerReferences":[{"kind":"Node","name":"n","controller":false},
                                {"kind":"ReplicaSet","name":"llm-7d9f8b6c5d","controller":true}]}},
          {"metadata":{"name":"db-0","namespace":"data","uid":"s",
             "ownerReferences":[{"kind":"StatefulSet","name":"db","controller":true}]}},
          {"metadata":{"name":"rs-no-hash","namespace":"x","uid":"r",
             "ownerReferences":[{"kind":"ReplicaSet","name":"bare-rs","controller":true}]}},
          {"metadata":{"name":"lonely","namespace":"x","uid":"l"}}]}"#;
        let (index, _) = PodIndex::parse(list.as_bytes()).unwrap();
        let owner = |uid: &str| index.names(uid, None).unwrap().owner;
        assert_eq!(
            [owner("d"), owner("s"), owner("r"), owner("l")],
            ["llm", "db", "bare-rs", ""]
        );
    }

    #[test]
    fn pods_and_containers_by_uid_and_id() {
        let (index, left_out) = PodIndex::parse(LIST.as_bytes()).unwrap();
        assert_eq!((index.len(), left_out), (2, 1));
        let names = index
            .names("0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0", Some("bbb"))
            .unwrap();
        assert_eq!(
            (&*names.namespace, &*names.pod, &*names.container),
            ("serving", "llm-0", "server")
        );
        let init = index
            .names("0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0", Some("aaa"))
            .unwrap();
        assert_eq!(&*init.container, "fetch");
        let unknown_container = index
            .names("0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0", Some("ccc"))
            .unwrap();
        assert_eq!(
            (&*unknown_container.pod, &*unknown_container.container),
            ("llm-0", "")
        );
        assert_eq!(&*index.names("u2", None).unwrap().pod, "pending");
        assert!(index.names("nope", None).is_none());
        // The container's restart count and how its last instance ended.
        let restarted = r#"{"items":[{"metadata":{"name":"p","namespace":"n","uid":"u"},
            "status":{"containerStatuses":[{"name":"server","containerID":"containerd://c1",
            "restartCount":4,"lastState":{"terminated":{"exitCode":137,"reason":"OOMKilled\u001b"}}}]}}]}"#;
        let (index, _) = PodIndex::parse(restarted.as_bytes()).unwrap();
        let n = index.names("u", Some("c1")).unwrap();
        assert_eq!(
            (n.restarts, n.last_exit.as_deref()),
            (Some(4), Some("OOMKilled (exit 137)"))
        );
        assert_eq!(names.restarts, None);
    }

    #[test]
    fn hostile_lists_are_bounded_or_refused() {
        let many: Vec<String> = (0..MAX_PODS + 10)
            .map(|i| {
                format!(
                    r#"{{"metadata":{{"name":"p{i}\u0007\n","namespace":"{}","uid":"u{i}"}}}}"#,
                    "n".repeat(1000)
                )
            })
            .collect();
        let (index, left_out) =
            PodIndex::parse(format!(r#"{{"items":[{}]}}"#, many.join(",")).as_bytes()).unwrap();
        assert_eq!((index.len(), left_out), (MAX_PODS, 10));
        let names = index.names("u0", None).unwrap();
        assert_eq!((&*names.pod, names.namespace.len()), ("p0", MAX_NAME));
        let deep = "[".repeat(100_000);
        assert!(
            PodIndex::parse(format!(r#"{{"items":{deep}"#).as_bytes()).is_err(),
            "nesting is refused, not a stack overflow"
        );
        assert!(PodIndex::parse(b"not json").is_err());
    }

    #[test]
    fn a_flood_of_empty_items_is_counted_not_held() {
        let items = vec!["{}"; 1_000_000].join(",");
        let (index, left_out) =
            PodIndex::parse(format!(r#"{{"items":[{items}]}}"#).as_bytes()).unwrap();
        assert_eq!((index.len(), left_out), (0, 1_000_000));
        let containers: Vec<String> = (0..MAX_CONTAINERS + 5)
            .map(|i| format!(r#"{{"name":"c{i}","containerID":"containerd://id{i}"}}"#))
            .collect();
        let list = format!(
            r#"{{"items":[{{"metadata":{{"name":"p","namespace":"n","uid":"u"}},"status":{{"containerStatuses":[{}]}}}}]}}"#,
            containers.join(",")
        );
        let (index, _) = PodIndex::parse(list.as_bytes()).unwrap();
        assert!(index
            .names("u", Some(&format!("id{}", MAX_CONTAINERS - 1)))
            .is_some());
        assert_eq!(
            index
                .names("u", Some(&format!("id{}", MAX_CONTAINERS)))
                .map(|n| n.container),
            Some(String::new()),
            "past the cap a container is not known by its id"
        );
    }
}
