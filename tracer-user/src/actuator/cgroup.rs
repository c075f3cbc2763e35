//! Which CPU knob a capped process's cgroup has, and writing it: cgroup v2's `cpu.max` where the
//! unified hierarchy has the `cpu` controller, else cgroup v1's `cpu.cfs_period_us` and
//! `cpu.cfs_quota_us`. A cap goes to the cgroup the kernel says the process is in (its
//! `/proc/PID/cgroup`), never to a path a request names; the root cgroup and every cgroup that
//! holds the actuator or its client (or is above one) are refused.
use std::{
    fs,
    path::{Path, PathBuf},
};

/// `/proc/PID/cgroup` is read up to this many bytes.
const MAX_PROC_CGROUP: u64 = 64 * 1024;

/// Where the hierarchies are mounted.
#[derive(Clone, Debug)]
pub struct Roots {
    /// The unified (v2) hierarchy.
    pub v2: PathBuf,
    /// Whether the unified hierarchy has the `cpu` controller.
    pub v2_cpu: bool,
    /// The v1 hierarchy that has the `cpu` controller, if any.
    pub v1_cpu: Option<PathBuf>,
}

impl Roots {
    /// The host's: `/sys/fs/cgroup` (pure v2) or `/sys/fs/cgroup/unified` (hybrid), and v1's
    /// `cpu` mount where there is one.
    pub fn detect() -> Roots {
        let v2 = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
            .into_iter()
            .map(PathBuf::from)
            .find(|p| p.join("cgroup.controllers").exists())
            .unwrap_or_else(|| PathBuf::from("/sys/fs/cgroup"));
        let v2_cpu = fs::read_to_string(v2.join("cgroup.controllers"))
            .is_ok_and(|c| c.split_whitespace().any(|c| c == "cpu"));
        let v1_cpu = ["/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"]
            .into_iter()
            .map(PathBuf::from)
            .find(|p| p.join("cpu.cfs_quota_us").exists());
        Roots { v2, v2_cpu, v1_cpu }
    }
}

/// A cgroup directory and the files that cap it.
#[derive(Clone, Debug, PartialEq)]
pub struct Target {
    /// The cgroup's directory.
    pub dir: PathBuf,
    /// Whether it is a v1 `cpu` cgroup (CFS files) rather than v2 (`cpu.max`).
    pub v1: bool,
}

/// The paths of `/proc/PID/cgroup`'s text: the unified one and v1's `cpu` one.
pub fn paths(text: &str) -> (Option<&str>, Option<&str>) {
    let (mut v2, mut v1) = (None, None);
    for line in text.lines() {
        let mut f = line.splitn(3, ':');
        let (Some(id), Some(ctl), Some(path)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        if id == "0" && ctl.is_empty() {
            v2 = Some(path);
        } else if ctl.split(',').any(|c| c == "cpu") {
            v1 = Some(path);
        }
    }
    (v2, v1)
}

/// Reads a process's `/proc/PID/cgroup` (bounded).
pub fn proc_cgroup(pid: u32) -> Result<String, String> {
    use std::io::Read;
    let mut text = String::new();
    fs::File::open(format!("/proc/{pid}/cgroup"))
        .and_then(|f| f.take(MAX_PROC_CGROUP).read_to_string(&mut text))
        .map_err(|e| format!("cannot read /proc/{pid}/cgroup: {e}"))?;
    Ok(text)
}

/// The cgroup to cap for a process whose `/proc/PID/cgroup` says `text`.
pub fn target(roots: &Roots, text: &str) -> Result<Target, String> {
    let (v2, v1) = paths(text);
    let (root, path, is_v1) = match (roots.v2_cpu, v2, &roots.v1_cpu, v1) {
        (true, Some(p), _, _) => (roots.v2.as_path(), p, false),
        (false, _, Some(r), Some(p)) => (r.as_path(), p, true),
        _ => return Err("no cgroup with the cpu controller holds it".into()),
    };
    let rel = path.trim_start_matches('/');
    if rel.is_empty() {
        return Err("it is in the root cgroup, which is never capped".into());
    }
    if Path::new(rel)
        .components()
        .any(|c| !matches!(c, std::path::Component::Normal(_)))
    {
        return Err(format!("its cgroup path {path:?} is not a plain path"));
    }
    let dir = root.join(rel);
    let real = dir
        .canonicalize()
        .map_err(|e| format!("its cgroup {} cannot be opened: {e}", dir.display()))?;
    if !real.starts_with(root) || real == root {
        return Err(format!(
            "its cgroup {} is outside {}",
            dir.display(),
            root.display()
        ));
    }
    Ok(Target {
        dir: real,
        v1: is_v1,
    })
}

/// Refuses a target that is, or is above, a protected cgroup (the actuator's, its client's).
pub fn check_protected(t: &Target, protected: &[Target]) -> Result<(), String> {
    match protected.iter().find(|p| p.dir.starts_with(&t.dir)) {
        Some(p) => Err(format!(
            "{} holds the actuator or cudatrace ({}): never capped",
            t.dir.display(),
            p.dir.display()
        )),
        None => Ok(()),
    }
}

/// The writes that cap a target at `cpu_max` (`QUOTA PERIOD`, checked by the config), in order.
pub fn cap_writes(t: &Target, cpu_max: &str) -> Result<Vec<(String, String)>, String> {
    let mut parts = cpu_max.split_whitespace();
    let (Some(q), Some(p), None) = (parts.next(), parts.next(), parts.next()) else {
        return Err(format!("cpu_max {cpu_max:?} is not \"QUOTA PERIOD\""));
    };
    let quota = q.parse::<u64>().ok().filter(|q| *q >= 1000);
    let period = p
        .parse::<u64>()
        .ok()
        .filter(|p| (1000..=1_000_000).contains(p));
    let (Some(quota), Some(period)) = (quota, period) else {
        return Err(format!(
            "cpu_max {cpu_max:?}: quota at least 1000, period 1000 to 1000000"
        ));
    };
    Ok(if t.v1 {
        vec![
            ("cpu.cfs_period_us".into(), period.to_string()),
            ("cpu.cfs_quota_us".into(), quota.to_string()),
        ]
    } else {
        vec![("cpu.max".into(), format!("{quota} {period}"))]
    })
}

/// What the target's files say now, in the order that restores them.
pub fn current(t: &Target) -> Result<Vec<(String, String)>, String> {
    let files: &[&str] = if t.v1 {
        &["cpu.cfs_quota_us", "cpu.cfs_period_us"]
    } else {
        &["cpu.max"]
    };
    files
        .iter()
        .map(|f| {
            fs::read_to_string(t.dir.join(f))
                .map(|v| ((*f).to_owned(), v.trim().to_owned()))
                .map_err(|e| format!("cannot read {}: {e}", t.dir.join(f).display()))
        })
        .collect()
}

/// Writes `(file, value)` pairs into `dir`, in order; the first failure stops it.
pub fn write_all(dir: &Path, writes: &[(String, String)]) -> Result<(), String> {
    for (f, v) in writes {
        if f.contains('/') || !f.starts_with("cpu.") {
            return Err(format!("{f:?} is not a cpu knob"));
        }
        fs::write(dir.join(f), v)
            .map_err(|e| format!("cannot write {v:?} to {}: {e}", dir.join(f).display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unified_and_the_v1_cpu_paths_are_read() {
        let text = "12:cpu,cpuacct:/batch/job\n4:memory:/m\n0::/kubepods/pod1/c1\n";
        assert_eq!(paths(text), (Some("/kubepods/pod1/c1"), Some("/batch/job")));
        assert_eq!(paths("0::/\n"), (Some("/"), None));
        assert_eq!(paths("garbage\n1:cpuset:/x\n"), (None, None));
    }

    #[test]
    fn the_root_a_dotted_path_and_a_missing_controller_are_refused() {
        let dir = std::env::temp_dir().join(format!("ct-cg-{}", std::process::id()));
        fs::create_dir_all(dir.join("a/b")).unwrap();
        let roots = Roots {
            v2: dir.clone(),
            v2_cpu: true,
            v1_cpu: None,
        };
        let t = target(&roots, "0::/a/b\n").unwrap();
        assert_eq!(
            t,
            Target {
                dir: dir.join("a/b").canonicalize().unwrap(),
                v1: false
            }
        );
        assert!(target(&roots, "0::/\n")
            .unwrap_err()
            .contains("root cgroup"));
        assert!(target(&roots, "0::/a/../..\n")
            .unwrap_err()
            .contains("not a plain path"));
        assert!(target(&roots, "0::/nope\n")
            .unwrap_err()
            .contains("cannot be opened"));
        let v1 = Roots {
            v2: dir.clone(),
            v2_cpu: false,
            v1_cpu: None,
        };
        assert!(target(&v1, "0::/a/b\n")
            .unwrap_err()
            .contains("cpu controller"));
        let v1 = Roots {
            v2: "/nonexistent".into(),
            v2_cpu: false,
            v1_cpu: Some(dir.clone()),
        };
        assert!(target(&v1, "3:cpu:/a\n0::/\n").unwrap().v1);
        // Capping a/ would cap a/b, which holds cudatrace: refused; a sibling is not.
        let a = target(&roots, "0::/a\n").unwrap();
        assert!(check_protected(&a, std::slice::from_ref(&t)).is_err());
        assert!(check_protected(&t, std::slice::from_ref(&t)).is_err());
        fs::create_dir_all(dir.join("a/c")).unwrap();
        let c = target(&roots, "0::/a/c\n").unwrap();
        assert!(check_protected(&c, std::slice::from_ref(&t)).is_ok());
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_writes_follow_the_hierarchy() {
        let v2 = Target {
            dir: "/x".into(),
            v1: false,
        };
        let v1 = Target {
            dir: "/x".into(),
            v1: true,
        };
        assert_eq!(
            cap_writes(&v2, "5000 100000").unwrap(),
            vec![("cpu.max".into(), "5000 100000".into())]
        );
        assert_eq!(
            cap_writes(&v1, "1000 1000000").unwrap(),
            vec![
                ("cpu.cfs_period_us".into(), "1000000".into()),
                ("cpu.cfs_quota_us".into(), "1000".into())
            ]
        );
        assert!(cap_writes(&v2, "max 100000").is_err());
        assert!(cap_writes(&v2, "5000").is_err());
        assert!(write_all(Path::new("/tmp"), &[("../../etc/x".into(), "1".into())]).is_err());
    }
}
