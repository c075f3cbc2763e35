//! The in-kernel filter, from the command line's selection: filtered-out calls cost no record
//! and no user-space work.
use std::path::PathBuf;

use anyhow::{bail, Context as _, Result};
use tracer_common::{Filter, FILTER_CGROUP, FILTER_COMM};

/// Which processes to trace.
#[derive(Clone, Debug, Default)]
pub struct FilterOptions {
    /// Only this process (the uprobes are attached to it alone).
    pub pid: Option<u32>,
    /// Only threads with this comm.
    pub comm: Option<String>,
    /// Only processes in this cgroup (v2 directory).
    pub cgroup: Option<PathBuf>,
}

/// The filter the eBPF entry programs apply.
pub fn build(opts: &FilterOptions) -> Result<Filter> {
    let mut f = Filter::default();
    if let Some(comm) = &opts.comm {
        let bytes = comm.as_bytes();
        if bytes.is_empty() || bytes.len() > 15 {
            bail!("--comm {comm:?}: a thread name has 1 to 15 bytes (as in /proc/PID/comm)");
        }
        f.comm[..bytes.len()].copy_from_slice(bytes);
        f.flags |= FILTER_COMM;
    }
    if let Some(dir) = &opts.cgroup {
        use std::os::unix::fs::MetadataExt as _;
        let meta = std::fs::metadata(dir).with_context(|| {
            format!(
                "--cgroup {}: no such cgroup directory; give a cgroup v2 path under /sys/fs/cgroup",
                dir.display()
            )
        })?;
        f.cgroup_id = meta.ino();
        f.flags |= FILTER_CGROUP;
    }
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comm_is_checked_and_padded() {
        let f = build(&FilterOptions {
            comm: Some("python3".into()),
            ..Default::default()
        })
        .unwrap();
        assert_eq!((f.flags, &f.comm[..8]), (FILTER_COMM, &b"python3\0"[..]));
        let long = build(&FilterOptions {
            comm: Some("a".repeat(16)),
            ..Default::default()
        });
        assert!(long.unwrap_err().to_string().contains("1 to 15 bytes"));
        assert_eq!(build(&FilterOptions::default()).unwrap().flags, 0);
    }
}
