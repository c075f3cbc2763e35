//! Reading who a process is from /proc, bounded: every file is read at most
//! [`MAX_PROC_READ`] bytes.
use std::fs;

use super::{Comm, Identity};

/// `CUDA_VISIBLE_DEVICES` entries kept at most: more GPUs than a node has.
pub const MAX_VISIBLE_DEVICES: usize = 16;
/// Longest entry kept: a MIG UUID in its older form (`MIG-GPU-<uuid>/<gi>/<ci>`) is under 64.
const MAX_DEVICE_ENTRY: usize = 64;

/// A tenant's `CUDA_VISIBLE_DEVICES`, bounded: at most [`MAX_VISIBLE_DEVICES`] entries, each a
/// GPU index (up to three digits), a PCI bus id (at most 16 hex digits, `:` and `.`) or a
/// `GPU-`/`MIG-` UUID of at most 64 letters, digits, `-` and `/`; repeats are skipped, the rest dropped and counted. What is kept becomes metric labels and, where
/// NVML does not place the process, the GPU named in alerts, so it is never free text.
pub fn parse_visible_devices(raw: &[u8]) -> (String, u32) {
    let mut kept: Vec<&str> = Vec::new();
    let mut dropped = 0u32;
    for entry in raw.split(|&b| b == b',') {
        let Ok(entry) = std::str::from_utf8(entry).map(str::trim) else {
            dropped = dropped.saturating_add(1);
            continue;
        };
        if entry.is_empty() {
            continue;
        }
        let index = entry.len() <= 3 && entry.bytes().all(|b| b.is_ascii_digit());
        let uuid = (entry.starts_with("GPU-") || entry.starts_with("MIG-"))
            && entry.len() <= MAX_DEVICE_ENTRY
            && entry
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'/');
        // A PCI bus id, `[DOMAIN:]BUS:DEVICE.FUNCTION` in hex.
        let bus = entry.len() <= 16
            && entry.contains(':')
            && entry.contains('.')
            && entry
                .bytes()
                .all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.');
        let index = index || bus;
        if (index || uuid) && kept.contains(&entry) {
            // A repeat names no new GPU.
            continue;
        }
        if (index || uuid) && kept.len() < MAX_VISIBLE_DEVICES {
            kept.push(entry);
        } else {
            dropped = dropped.saturating_add(1);
        }
    }
    (kept.join(","), dropped)
}

/// Start time from the text of /proc/PID/stat (the comm field may hold spaces and parentheses).
pub fn parse_start_time(stat: &str) -> Option<u64> {
    let after_comm = &stat[stat.rfind(')')? + 1..];
    // Fields after comm start at field 3 (state); starttime is field 22.
    after_comm.split_whitespace().nth(19)?.parse().ok()
}

/// `PF_EXITING`: set before the exit tracepoint runs, so a process without it has not passed
/// that tracepoint yet.
const PF_EXITING: u64 = 0x4;

/// Whether /proc/PID/stat shows a process that has not begun to exit (not a zombie, and
/// `PF_EXITING` clear).
pub fn parse_alive(stat: &str) -> bool {
    let Some(end) = stat.rfind(')') else {
        return false;
    };
    let mut fields = stat[end + 1..].split_whitespace();
    let state = fields.next();
    // flags is field 9: the sixth after state.
    let flags = fields.nth(5).and_then(|f| f.parse::<u64>().ok());
    !matches!(state, None | Some("Z" | "X" | "x")) && flags.is_some_and(|f| f & PF_EXITING == 0)
}

/// The start time of the process `pid` now (`None`: no such process).
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = read_bounded(&format!("/proc/{pid}/stat"))?;
    parse_start_time(&String::from_utf8_lossy(&stat))
}

/// Threads looked at, at most, to tell whether a process whose leader has exited still runs.
const MAX_TASKS_CHECKED: usize = 256;

/// Whether the process still runs: its leader, or (after the leader called `pthread_exit`)
/// any of its first [`MAX_TASKS_CHECKED`] threads.
pub fn process_alive(pid: u32) -> bool {
    let stat = |path: String| {
        read_bounded(&path)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    };
    if parse_alive(&stat(format!("/proc/{pid}/stat"))) {
        return true;
    }
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks
        .flatten()
        .take(MAX_TASKS_CHECKED)
        .any(|t| parse_alive(&stat(format!("{}/stat", t.path().display()))))
}

/// The cgroup path that identifies the process: the v2 one (`0::/path`) unless it is the root,
/// else the first v1 hierarchy with a non-root path.
pub fn parse_cgroup(text: &str) -> Option<String> {
    let paths: Vec<(&str, &str)> = text
        .lines()
        .filter_map(|l| {
            let mut f = l.splitn(3, ':');
            let (id, _, path) = (f.next()?, f.next()?, f.next()?);
            Some((id, path))
        })
        .collect();
    let v2 = paths.iter().find(|(id, _)| *id == "0").map(|(_, p)| *p);
    match v2 {
        Some(p) if p != "/" => Some(p.to_owned()),
        _ => paths
            .iter()
            .map(|(_, p)| *p)
            .find(|p| *p != "/")
            .map(str::to_owned),
    }
}

/// Whether a cgroup path lies outside what systemd delegates to users: a tenant may create any
/// cgroup inside its own `user.slice` subtree (`user-1000.slice`, `user@1000.service`), named
/// like a runtime's or a pod's, so ids are never taken from there.
fn outside_user_delegation(cgroup: &str) -> bool {
    !cgroup.split('/').any(|c| {
        c == "user.slice"
            || (c.starts_with("user-") && c.ends_with(".slice"))
            || c.starts_with("user@")
    })
}

/// Container id in a cgroup path: 64 hex digits after `docker-`, `cri-containerd-`, `crio-`,
/// or as a whole path component (`/docker/<id>`, `/kubepods/.../<id>`); none inside a user's
/// delegated subtree.
pub fn container_id(cgroup: &str) -> Option<String> {
    if !outside_user_delegation(cgroup) {
        return None;
    }
    cgroup.split('/').rev().find_map(|part| {
        let part = part.strip_suffix(".scope").unwrap_or(part);
        let id = ["docker-", "cri-containerd-", "crio-", "containerd-"]
            .iter()
            .find_map(|p| part.strip_prefix(p))
            .unwrap_or(part);
        (id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit())).then(|| id.to_owned())
    })
}

/// Pod UID in a cgroup path: `pod<uid>` components, with `_` (systemd driver) or `-` separators.
pub fn pod_uid(cgroup: &str) -> Option<String> {
    // Only under the kubelet's hierarchy (`kubepods`, `kubepods.slice`, `kubepods-*.slice`), and
    // not inside a user's delegated subtree.
    if !outside_user_delegation(cgroup) {
        return None;
    }
    let mut parts = cgroup.split('/');
    parts.by_ref().find(|c| c.starts_with("kubepods"))?;
    parts.find_map(|part| {
        let part = part.strip_suffix(".slice").unwrap_or(part);
        let pod = &part[part.rfind("pod")? + 3..];
        let uid = pod.replace('_', "-");
        let ok = uid.len() == 36 && uid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-');
        ok.then_some(uid)
    })
}

/// Most bytes read of any /proc file: a tenant controls its command line, environment and
/// cgroup names, so none of them is read whole.
pub const MAX_PROC_READ: u64 = 64 * 1024;
/// Longest command line kept.
const MAX_CMDLINE: usize = 4096;

/// At most [`MAX_PROC_READ`] bytes of a /proc file.
fn read_bounded(path: &str) -> Option<Vec<u8>> {
    use std::io::Read as _;
    let mut out = Vec::new();
    fs::File::open(path)
        .ok()?
        .take(MAX_PROC_READ)
        .read_to_end(&mut out)
        .ok()?;
    Some(out)
}

/// At most [`MAX_PROC_READ`] bytes of a /proc file, as text (invalid UTF-8 replaced).
pub(super) fn read_text(path: &str) -> Option<String> {
    read_bounded(path).map(|b| String::from_utf8_lossy(&b).into_owned())
}

/// The process's name from /proc (the leader's), or `pid<N>` when it is gone already.
pub fn comm(pid: u32) -> Comm {
    match read_bounded(&format!("/proc/{pid}/comm")) {
        Some(b) if !b.is_empty() => {
            Comm::from(String::from_utf8_lossy(b.strip_suffix(b"\n").unwrap_or(&b)).as_ref())
        }
        _ => Comm::from(format!("pid{pid}")),
    }
}

/// Reads a process's identity from /proc; fields that cannot be read are left out. The command
/// line (it may hold secrets) only when `with_cmdline`.
pub fn read(pid: u32, with_cmdline: bool) -> Identity {
    let proc = format!("/proc/{pid}");
    let stat = read_bounded(&format!("{proc}/stat"))
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    let start_time = parse_start_time(&stat).unwrap_or(0);
    let exe = fs::read_link(format!("{proc}/exe"))
        .ok()
        .map(|p| p.display().to_string());
    let cmdline = with_cmdline
        .then(|| read_bounded(&format!("{proc}/cmdline")))
        .flatten()
        .filter(|c| !c.is_empty())
        .map(|c| {
            let parts: Vec<String> = c
                .split(|&b| b == 0)
                .filter(|p| !p.is_empty())
                .map(|p| String::from_utf8_lossy(p).into_owned())
                .collect();
            parts.join(" ").chars().take(MAX_CMDLINE).collect()
        });
    let cgroup = read_bounded(&format!("{proc}/cgroup"))
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .as_deref()
        .and_then(parse_cgroup);
    let environ = read_bounded(&format!("{proc}/environ"));
    let var = |name: &[u8]| {
        environ.as_deref().and_then(|env| {
            env.split(|&b| b == 0)
                .find_map(|kv| kv.strip_prefix(name).map(parse_visible_devices))
        })
    };
    let visible = var(b"CUDA_VISIBLE_DEVICES=");
    // "all", "none", "void" or nothing valid: no list of devices.
    let nvidia_visible_devices = var(b"NVIDIA_VISIBLE_DEVICES=")
        .map(|(kept, _)| kept)
        .filter(|kept| !kept.is_empty());
    let (cuda_visible_devices, devices_dropped) = match visible {
        Some((kept, dropped)) => (Some(kept), dropped),
        None => (None, 0),
    };
    Identity {
        start_time,
        exe,
        cmdline,
        container_id: cgroup.as_deref().and_then(container_id),
        pod_uid: cgroup.as_deref().and_then(pod_uid),
        cgroup,
        cuda_visible_devices,
        devices_dropped,
        nvidia_visible_devices,
        kube: None,
        alive: parse_alive(&stat) || process_alive(pid),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::PodNames;

    const ID: &str = "3f1c0a6e9b2d4c8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e";

    #[test]
    fn start_time_survives_odd_comms() {
        let stat = "4242 (my (odd) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 4 0 987654 1000 10";
        assert_eq!(parse_start_time(stat), Some(987654));
        assert!(parse_alive(stat));
        assert!(!parse_alive("4242 (x) Z 1 4242 4242 0 -1 4194560"));
        assert!(
            !parse_alive("4242 (x) R 1 4242 4242 0 -1 4194564 100"),
            "PF_EXITING set"
        );
        assert!(!parse_alive(""));
    }

    #[test]
    fn container_ids_of_each_runtime() {
        assert_eq!(
            container_id(&format!("/system.slice/docker-{ID}.scope")).as_deref(),
            Some(ID)
        );
        assert_eq!(container_id(&format!("/docker/{ID}")).as_deref(), Some(ID));
        assert_eq!(
            container_id(&format!("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1234.slice/cri-containerd-{ID}.scope")).as_deref(),
            Some(ID)
        );
        assert_eq!(
            container_id(&format!("/kubepods/burstable/pod0b1c/crio-{ID}.scope")).as_deref(),
            Some(ID)
        );
        assert_eq!(
            container_id("/user.slice/user-1000.slice/session-2.scope"),
            None
        );
    }

    #[test]
    fn pod_uids_with_either_driver() {
        let uid = "0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0";
        let systemd = format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{ID}.scope", uid.replace('-', "_"));
        assert_eq!(pod_uid(&systemd).as_deref(), Some(uid));
        assert_eq!(
            pod_uid(&format!("/kubepods/besteffort/pod{uid}/{ID}")).as_deref(),
            Some(uid)
        );
        assert_eq!(pod_uid("/system.slice/docker.service"), None);
    }

    #[test]
    fn ids_from_a_users_delegated_cgroups_are_not_believed() {
        let uid = "0b1c2d3e_4f50_6172_8394_a5b6c7d8e9f0";
        for forged in [
            format!("/user.slice/user-1000.slice/user@1000.service/app.slice/kubepods-pod{uid}.slice/cri-containerd-{ID}.scope"),
            format!("/user.slice/user-1000.slice/session-3.scope/kubepods/pod{uid}/{ID}"),
            format!("/user.slice/user-1000.slice/user@1000.service/docker-{ID}.scope"),
        ] {
            assert_eq!((pod_uid(&forged), container_id(&forged)), (None, None), "{forged}");
        }
        // A pod UID outside the kubelet's hierarchy is not one either.
        assert_eq!(
            pod_uid(&format!("/system.slice/kubepods-pod{uid}.slice")),
            None
        );
        assert_eq!(pod_uid(&format!("/system.slice/pod{uid}.slice")), None);
    }

    #[test]
    fn pod_labels_are_names_once_known_else_ids() {
        let uid = "0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0";
        let mut id = Identity {
            pod_uid: Some(uid.into()),
            container_id: Some(ID.into()),
            ..Default::default()
        };
        assert_eq!(id.pod_labels(), [None, Some(uid.into()), Some(ID.into())]);
        id.kube = Some(PodNames {
            namespace: "serving".into(),
            pod: "llm-0".into(),
            container: "server".into(),
            owner: "llm".into(),
            ..Default::default()
        });
        assert_eq!(
            id.pod_labels(),
            [
                Some("serving".into()),
                Some("llm-0".into()),
                Some("server".into())
            ]
        );
        id.kube.as_mut().unwrap().container.clear();
        assert_eq!(
            id.pod_labels()[2].as_deref(),
            Some(ID),
            "a container the pod does not list keeps its id"
        );
        assert_eq!(Identity::default().pod_labels(), [None, None, None]);
    }

    #[test]
    fn cgroup_prefers_v2_then_v1() {
        assert_eq!(
            parse_cgroup("0::/kubepods/x\n").as_deref(),
            Some("/kubepods/x")
        );
        assert_eq!(
            parse_cgroup("4:memory:/docker/abc\n3:cpu:/\n0::/\n").as_deref(),
            Some("/docker/abc")
        );
        assert_eq!(parse_cgroup("1:cpu:/\n0::/\n"), None);
    }

    #[test]
    fn visible_devices_are_bounded_and_never_free_text() {
        assert_eq!(parse_visible_devices(b"0,1"), ("0,1".into(), 0));
        let uuid = "GPU-11111111-2222-3333-4444-555555555555";
        assert_eq!(
            parse_visible_devices(format!("{uuid}, MIG-GPU-x/1/0").as_bytes()),
            (format!("{uuid},MIG-GPU-x/1/0"), 0)
        );
        assert_eq!(
            parse_visible_devices(b"0,\x1b[2J,evil label,1234,GPU-\xff"),
            ("0".into(), 4)
        );
        // PCI bus ids, and what only looks like one.
        assert_eq!(
            parse_visible_devices(
                b"0000:3b:00.0,00000000:3B:00.0,3b:00,00000000:3B:00.0:1.2,zz:00.0"
            ),
            ("0000:3b:00.0,00000000:3B:00.0".into(), 3)
        );
        // 0..99 two hundred times: 0..15 kept once, their repeats skipped, 16..99 dropped.
        let many: String = (0..20_000).map(|i| format!("{},", i % 100)).collect();
        let (kept, dropped) = parse_visible_devices(many.as_bytes());
        assert_eq!(
            kept,
            (0..16).map(|i| i.to_string()).collect::<Vec<_>>().join(",")
        );
        assert_eq!(dropped, 84 * 200);
    }
}
