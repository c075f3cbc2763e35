//! The workload a process belongs to: what its baselines, restarts and alerts are kept for
//! across its processes. The first `[[workloads]]` entry whose globs all match names it; else:
//! - in Kubernetes, with the pod list's names: `NAMESPACE/OWNER/CONTAINER`, the owner being the
//!   pod's controller (a Deployment through its ReplicaSet, a StatefulSet, a DaemonSet, a Job;
//!   the pod's own name when it has none);
//! - in a pod the pod list has not named (yet): `pod:UID/COMM`;
//! - in a systemd unit: `UNIT/COMM`; in another container: `container:ID12/COMM`;
//! - otherwise `EXE:COMM`, the executable's path and the command name;
//! - and a process in a user's delegated systemd tree (`user.slice/user-UID.slice`) has
//!   `user-UID/` before its unit or executable: a user starting `--user --unit=triton` or
//!   running `/usr/bin/python3` cannot take the system's `triton.service` or another user's
//!   workload.
use std::sync::Arc;

use super::Identity;
use crate::config::workloads::WorkloadEntry;

/// Longest workload name made by the rule (longer parts are cut).
const MAX_LEN: usize = 256;

/// One entry: its name, and its globs on namespace, pod, container, comm, exe and cgroup.
type Rule = (Arc<str>, [Option<glob::Pattern>; 6]);

/// The `[[workloads]]` entries, their globs compiled.
#[derive(Clone, Debug, Default)]
pub struct Rules(Arc<[Rule]>);

impl Rules {
    /// From the config's entries (checked there: a glob that does not compile matches nothing).
    pub fn new(entries: &[WorkloadEntry]) -> Rules {
        Rules(
            entries
                .iter()
                .map(|e| {
                    let globs = e
                        .globs()
                        .map(|(_, g)| g.and_then(|g| glob::Pattern::new(g).ok()));
                    (Arc::from(e.name.as_str()), globs)
                })
                .collect(),
        )
    }

    /// The workload of a process that is `id` and named `comm`.
    pub fn name(&self, id: &Identity, comm: &str) -> Arc<str> {
        let kube = id.kube.as_ref();
        let fields = [
            kube.map(|k| k.namespace.as_str()),
            kube.map(|k| k.pod.as_str()),
            kube.map(|k| k.container.as_str()),
            Some(comm),
            id.exe.as_deref(),
            id.cgroup.as_deref(),
        ];
        for (name, globs) in self.0.iter() {
            let all = globs.iter().zip(fields).all(|(g, f)| match g {
                None => true,
                Some(g) => f.is_some_and(|f| g.matches(f)),
            });
            if all {
                return name.clone();
            }
        }
        by_rule(id, comm).into()
    }
}

/// The tenant a workload name belongs to, for the bounds one tenant may not take from others
/// (baselines kept, exits counted): its first part (`serving` of `serving/llm/server`,
/// `pod:UID`, `user-1000`, `container:ID12`, a unit), or `host` for `EXE:COMM` and for a
/// process whose identity could not be read (`?:COMM`: gone before it was read), so that
/// short processes cannot each be a tenant of one.
pub fn tenant_of(name: &str) -> &str {
    if name.starts_with('/') || name.starts_with("?:") {
        return "host";
    }
    name.split('/').next().unwrap_or(name)
}

/// The user whose delegated systemd tree a cgroup path lies in (`user-1000`), if any.
fn delegated_user(cgroup: &str) -> Option<&str> {
    let mut parts = cgroup.split('/');
    parts.by_ref().find(|p| *p == "user.slice")?;
    parts
        .next()
        .and_then(|p| p.strip_suffix(".slice"))
        .filter(|p| p.starts_with("user-"))
        .or(Some("user-?"))
}

/// The built-in rule (see the module's documentation).
pub fn by_rule(id: &Identity, comm: &str) -> String {
    let cut = |s: &str| s.chars().take(MAX_LEN).collect::<String>();
    if let Some(k) = &id.kube {
        let owner = if k.owner.is_empty() { &k.pod } else { &k.owner };
        return cut(&match k.container.as_str() {
            "" => format!("{}/{owner}", k.namespace),
            c => format!("{}/{owner}/{c}", k.namespace),
        });
    }
    if let Some(uid) = &id.pod_uid {
        return cut(&format!("pod:{uid}/{comm}"));
    }
    let user = id
        .cgroup
        .as_deref()
        .and_then(delegated_user)
        .map(|u| format!("{u}/"))
        .unwrap_or_default();
    if let Some(unit) = id
        .cgroup
        .as_deref()
        .and_then(|c| c.rsplit('/').find(|part| part.ends_with(".service")))
        .filter(|u| !u.starts_with("user@"))
    {
        return cut(&format!("{user}{unit}/{comm}"));
    }
    if let Some(cid) = &id.container_id {
        return cut(&format!("container:{}/{comm}", &cid[..cid.len().min(12)]));
    }
    cut(&format!(
        "{user}{}:{comm}",
        id.exe.as_deref().unwrap_or("?")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::PodNames;

    fn kube(owner: &str, container: &str) -> Identity {
        Identity {
            kube: Some(PodNames {
                namespace: "serving".into(),
                pod: "llm-7d9f8b6c5d-x2x4z".into(),
                container: container.into(),
                owner: owner.into(),
                ..Default::default()
            }),
            pod_uid: Some("0b1c2d3e".into()),
            exe: Some("/usr/bin/python3".into()),
            ..Default::default()
        }
    }

    #[test]
    fn the_rule_names_pods_units_containers_and_executables() {
        let r = Rules::default();
        assert_eq!(
            &*r.name(&kube("llm", "server"), "python3"),
            "serving/llm/server"
        );
        assert_eq!(
            &*r.name(&kube("", ""), "python3"),
            "serving/llm-7d9f8b6c5d-x2x4z"
        );
        let unnamed = Identity {
            pod_uid: Some("0b1c2d3e".into()),
            ..Default::default()
        };
        assert_eq!(&*r.name(&unnamed, "server"), "pod:0b1c2d3e/server");
        let unit = Identity {
            cgroup: Some("/system.slice/triton.service".into()),
            exe: Some("/opt/triton/bin/tritonserver".into()),
            ..Default::default()
        };
        assert_eq!(
            &*r.name(&unit, "tritonserver"),
            "triton.service/tritonserver"
        );
        // A user's own unit of the same name, and a user's python, are the user's.
        let impostor = Identity {
            cgroup: Some(
                "/user.slice/user-1000.slice/user@1000.service/app.slice/triton.service".into(),
            ),
            exe: Some("/opt/triton/bin/tritonserver".into()),
            ..Default::default()
        };
        assert_eq!(
            &*r.name(&impostor, "tritonserver"),
            "user-1000/triton.service/tritonserver"
        );
        let session = Identity {
            cgroup: Some("/user.slice/user-1001.slice/session-4.scope".into()),
            exe: Some("/usr/bin/python3".into()),
            ..Default::default()
        };
        assert_eq!(
            &*r.name(&session, "python3"),
            "user-1001//usr/bin/python3:python3"
        );
        let docker = Identity {
            container_id: Some("0123456789abcdef0123".into()),
            ..Default::default()
        };
        assert_eq!(&*r.name(&docker, "train"), "container:0123456789ab/train");
        let bare = Identity {
            exe: Some("/usr/bin/python3".into()),
            ..Default::default()
        };
        assert_eq!(&*r.name(&bare, "bench"), "/usr/bin/python3:bench");
        assert_eq!(&*r.name(&Identity::default(), "x"), "?:x");
        let long = Identity {
            exe: Some("/".repeat(1000)),
            ..Default::default()
        };
        assert_eq!(r.name(&long, "x").chars().count(), MAX_LEN);
    }

    #[test]
    fn the_first_entry_whose_globs_all_match_names_it() {
        let entry = |name: &str, namespace: Option<&str>, comm: Option<&str>| WorkloadEntry {
            name: name.into(),
            namespace: namespace.map(Into::into),
            comm: comm.map(Into::into),
            ..Default::default()
        };
        let r = Rules::new(&[
            entry("llm-servers", Some("serving"), Some("python*")),
            entry("batch", Some("batch*"), None),
        ]);
        assert_eq!(&*r.name(&kube("llm", "server"), "python3"), "llm-servers");
        // Not every glob matches: the rule's name.
        assert_eq!(
            &*r.name(&kube("llm", "server"), "triton"),
            "serving/llm/server"
        );
        // A glob on a field the process does not have matches nothing.
        assert_eq!(&*r.name(&Identity::default(), "python3"), "?:python3");
    }
}
