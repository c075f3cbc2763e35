//! `[[workloads]]`: names for workloads the built-in rule would name otherwise (see
//! `identity::workload`). The first entry whose every glob matches a process names its workload.
//! Globs on `namespace`, `pod`, `container` and `cgroup` are what a tenant cannot choose; `comm`
//! and `exe` are its own choice, so an entry on them alone lets a process join that workload.
use serde::Deserialize;

use super::ConfigError;

/// Longest glob taken.
const MAX_GLOB: usize = 256;
/// Longest workload name.
const MAX_WORKLOAD: usize = 128;

/// One `[[workloads]]` entry as written.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WorkloadEntry {
    /// The workload's name (the `workload` label).
    #[serde(default)]
    pub name: String,
    /// Glob on the pod's namespace.
    pub namespace: Option<String>,
    /// Glob on the pod's name.
    pub pod: Option<String>,
    /// Glob on the container's name.
    pub container: Option<String>,
    /// Glob on the command name.
    pub comm: Option<String>,
    /// Glob on the executable's path.
    pub exe: Option<String>,
    /// Glob on the cgroup path.
    pub cgroup: Option<String>,
}

impl WorkloadEntry {
    /// The globs given, by key.
    pub fn globs(&self) -> [(&'static str, Option<&str>); 6] {
        [
            ("namespace", self.namespace.as_deref()),
            ("pod", self.pod.as_deref()),
            ("container", self.container.as_deref()),
            ("comm", self.comm.as_deref()),
            ("exe", self.exe.as_deref()),
            ("cgroup", self.cgroup.as_deref()),
        ]
    }

    fn validate(&self) -> Result<(), String> {
        if self.name.len() > MAX_WORKLOAD || self.name.chars().any(char::is_control) {
            return Err(format!(
                "name: give at most {MAX_WORKLOAD} printable characters"
            ));
        }
        if self.globs().iter().all(|(_, g)| g.is_none()) {
            return Err(
                "give namespace, pod, container, comm, exe or cgroup (a glob), or the entry \
                 would name every process's workload"
                    .into(),
            );
        }
        for (key, glob) in self.globs() {
            if let Some(g) = glob {
                if g.len() > MAX_GLOB {
                    return Err(format!(
                        "{key}: a glob of {} bytes: give at most {MAX_GLOB}",
                        g.len()
                    ));
                }
                glob::Pattern::new(g).map_err(|e| format!("{key} = {g:?}: not a glob ({e})"))?;
            }
        }
        Ok(())
    }
}

/// Checks `[[workloads]]`: names (given, distinct) and globs; the error is the whole line.
pub fn validate(entries: &[WorkloadEntry]) -> Result<(), ConfigError> {
    let names: Vec<&str> = entries.iter().map(|e| e.name.as_str()).collect();
    super::entries::check("workloads", names.into_iter())?;
    for e in entries {
        e.validate().map_err(|why| {
            ConfigError::invalid("workloads", format!("workloads {:?}: {why}", e.name))
        })?;
    }
    Ok(())
}
