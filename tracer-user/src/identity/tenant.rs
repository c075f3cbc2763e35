//! Who a process belongs to, for the shares one tenant may not take from another (library
//! slots, discovery's reads, baselines and exits): its pod under the kubelet's hierarchy, a
//! user's whole delegated systemd tree (`user@UID.service`: a user can make any cgroup inside
//! it, so one user is one tenant however many units it starts), else its cgroup path.
use std::fmt;

/// A tenant, from a cgroup path.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tenant(String);

impl Tenant {
    /// The tenant of a process in cgroup `cgroup` (`None`: unknown, the root's).
    pub fn of(cgroup: Option<&str>) -> Tenant {
        let Some(cgroup) = cgroup else {
            return Tenant("/".into());
        };
        if let Some(uid) = super::pod_uid(cgroup) {
            return Tenant(format!("pod:{uid}"));
        }
        let mut path = String::new();
        for part in cgroup.split('/').filter(|p| !p.is_empty()) {
            path.push('/');
            path.push_str(part);
            if part.starts_with("user@") {
                return Tenant(path);
            }
        }
        Tenant(if path.is_empty() { "/".into() } else { path })
    }

    /// The tenant as the probe-harm breaker counts them (`probe::scope`): a pod, a user's
    /// delegated tree, else the first unit below the slices (`/system.slice/docker-ID.scope`,
    /// a top-level cgroup): what a process cannot leave or make more of without privilege.
    /// Namespaces do not count, since any process may make new ones unprivileged.
    pub fn unit(cgroup: Option<&str>) -> Tenant {
        let t = Tenant::of(cgroup);
        if t.0.starts_with("pod:") || t.0.contains("/user@") {
            return t;
        }
        let mut path = String::new();
        for part in t.0.split('/').filter(|p| !p.is_empty()) {
            path.push('/');
            path.push_str(part);
            if !part.ends_with(".slice") {
                break;
            }
        }
        Tenant(if path.is_empty() { "/".into() } else { path })
    }

    /// The tenant of process `pid`, from its /proc cgroup file.
    pub fn of_pid(pid: u32) -> Tenant {
        Tenant::of(cgroup_of(pid).as_deref())
    }

    /// [`Tenant::unit`] of process `pid`, from its /proc cgroup file.
    pub fn unit_of_pid(pid: u32) -> Tenant {
        Tenant::unit(cgroup_of(pid).as_deref())
    }

    /// As written in messages.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The cgroup path of process `pid` (`None`: gone, or in no cgroup but the root).
fn cgroup_of(pid: u32) -> Option<String> {
    let text = super::proc::read_text(&format!("/proc/{pid}/cgroup"))?;
    super::parse_cgroup(&text)
}

impl fmt::Display for Tenant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_users_and_cgroups() {
        let pod = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b2c3d4e_0000_1111_2222_333344445555.slice/cri-containerd-ab.scope";
        assert_eq!(
            Tenant::of(Some(pod)).as_str(),
            "pod:1b2c3d4e-0000-1111-2222-333344445555"
        );
        // Two containers of one pod are one tenant.
        let other = pod.replace("cri-containerd-ab", "cri-containerd-cd");
        assert_eq!(Tenant::of(Some(pod)), Tenant::of(Some(&other)));
        // Every unit a user starts is that user's.
        let a = "/user.slice/user-1000.slice/user@1000.service/app.slice/run-u1.scope";
        let b = "/user.slice/user-1000.slice/user@1000.service/app.slice/triton.service";
        assert_eq!(Tenant::of(Some(a)), Tenant::of(Some(b)));
        assert_eq!(
            Tenant::of(Some(a)).as_str(),
            "/user.slice/user-1000.slice/user@1000.service"
        );
        // A user's tree cannot name a pod.
        let fake = "/user.slice/user-1000.slice/user@1000.service/kubepods/pod1b2c3d4e-0000-1111-2222-333344445555";
        assert!(Tenant::of(Some(fake)).as_str().starts_with("/user.slice"));
        assert_eq!(
            Tenant::of(Some("/system.slice/triton.service")).as_str(),
            "/system.slice/triton.service"
        );
        assert_eq!(Tenant::of(None).as_str(), "/");
    }

    #[test]
    fn units_for_the_breaker_are_what_a_process_cannot_leave() {
        let unit = |c| Tenant::unit(Some(c)).0;
        // A container's own sub-cgroups are the container's.
        assert_eq!(
            unit("/system.slice/docker-abc.scope/inner/deeper"),
            "/system.slice/docker-abc.scope"
        );
        assert_eq!(unit("/tenant-a/job-1"), "/tenant-a");
        assert_ne!(unit("/tenant-a/job-1"), unit("/tenant-b/job-1"));
        assert_eq!(
            unit("/user.slice/user-1000.slice/user@1000.service/app.slice/x.scope"),
            "/user.slice/user-1000.slice/user@1000.service"
        );
        let pod = "/kubepods.slice/kubepods-podab12cd34_0000_1111_2222_333344445555.slice/cri-containerd-ab.scope";
        assert_eq!(unit(pod), "pod:ab12cd34-0000-1111-2222-333344445555");
        assert_eq!(Tenant::unit(None).0, "/");
        assert_eq!(unit("/"), "/");
    }
}
