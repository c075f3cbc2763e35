//! Finds the libcuda libraries to attach when none is named: every `libcuda.so*` file mapped by
//! a running process, then the ones the host's loader would find. A mapped file is opened as
//! exactly the file the process mapped: inside the process's root (`openat2` with
//! `RESOLVE_IN_ROOT`, so a tenant's absolute symlink cannot point cudatrace at a host file),
//! non-blocking, and refused unless its device and inode are the maps line's; a deleted
//! mapping only through `/proc/PID/map_files` (CAP_CHECKPOINT_RESTORE). Passes after the first
//! run on a thread of their own ([`Scanner`]); a file that failed is retried with backoff.
use std::{
    collections::{BTreeSet, HashMap, HashSet},
    fs::{self, File},
    os::{fd::FromRawFd as _, unix::fs::MetadataExt as _},
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

mod events;
pub mod loaders;
mod queue;
mod sweep;
mod watch;

pub use watch::Discovery;

use crate::probe::{
    proc_maps::{self, Mapping},
    slots::Holder,
    symbols::{self, Resolution},
};
use crate::text::printable;

/// Directories where distributions and the NVIDIA installer put libcuda on x86-64 hosts.
#[cfg(not(target_arch = "aarch64"))]
const LOADER_DIRS: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/nvidia/lib64",
    "/usr/local/cuda/compat",
    "/lib/x86_64-linux-gnu",
];
/// Directories where distributions and the NVIDIA installer put libcuda on aarch64 hosts
/// (Grace): Debian/Ubuntu multiarch, and CUDA's server-Arm (`sbsa-linux`) target folder.
#[cfg(target_arch = "aarch64")]
const LOADER_DIRS: &[&str] = &[
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/nvidia/lib64",
    "/usr/local/cuda/compat",
    "/usr/local/cuda/targets/sbsa-linux/lib",
    "/lib/aarch64-linux-gnu",
];
/// First wait before a failed file is tried again; doubled each failure up to [`MAX_RETRY`].
const FIRST_RETRY: Duration = Duration::from_secs(1);
/// Longest wait between two tries of a failed file.
const MAX_RETRY: Duration = Duration::from_secs(300);
/// Failed files remembered at most (beyond, the oldest are forgotten and tried again).
const MAX_FAILED: usize = 4096;

/// Is this a libcuda file name (`libcuda.so`, `libcuda.so.1`, `libcuda.so.550.54.15`)?
pub fn is_libcuda(name: &str) -> bool {
    name == "libcuda.so" || name.starts_with("libcuda.so.")
}

/// A file key: device and inode.
pub type FileKey = (u64, u64);

/// What the loop has settled, as the discovery thread sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Settled {
    /// Files attached or refused: not opened again.
    pub skip: HashSet<FileKey>,
    /// `--lib-allow`'s files (`None`: every file is allowed): another file's symbols are not
    /// read, only its device and inode, for the loop to refuse it.
    pub allowed: Option<HashSet<FileKey>>,
}

/// A mapped libcuda opened and read, ready to attach.
pub struct Prepared {
    /// How it is named in output: `/proc/PID/root<path in the process's namespace>`.
    pub path: PathBuf,
    /// The open file: the kernel probes this inode.
    pub file: File,
    /// Its metadata.
    pub meta: fs::Metadata,
    /// The process it was found through.
    pub holder: Holder,
    /// Its entry points (`None`: not read, `--lib-allow` does not name it).
    pub resolution: Option<Resolution>,
}

/// `openat2(2)` of `path` inside the root directory `root`: absolute symlinks and `..` stay in
/// it, magic links are refused; non-blocking (a FIFO cannot hang it).
fn open_in_root(root: &Path, path: &str) -> std::io::Result<File> {
    let dir = File::open(root)?;
    let relative = std::ffi::CString::new(path.trim_start_matches('/'))
        .map_err(|_| std::io::ErrorKind::InvalidInput)?;
    // SAFETY: open_how is plain data; zeroed is a valid value, then the fields are set.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS;
    use std::os::fd::AsRawFd as _;
    // SAFETY: the directory fd is open for the call, the path is NUL-terminated and `how` is
    // an open_how of the size passed.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            relative.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: openat2 returned a new descriptor that nothing else owns.
    Ok(unsafe { File::from_raw_fd(fd as i32) })
}

/// Why [`open_mapped`] gave no file.
#[derive(Debug, thiserror::Error)]
pub(super) enum Unmapped {
    /// Its path could not be opened inside the process's root (gone, or not there yet).
    #[error("{0}")]
    Unopened(String),
    /// Opened, or deleted, but not a file this agent can use: not the file mapped, or not
    /// readable as a library.
    #[error("{0}")]
    Unusable(String),
}

/// Opens the file `pid` mapped as `m` and checks it is that very file (device, inode), a
/// regular file within the size cap: the file, its metadata, and its path as shown.
pub(super) fn open_mapped(
    pid: u32,
    m: &Mapping,
) -> Result<(File, fs::Metadata, PathBuf), Unmapped> {
    let path = PathBuf::from(format!("/proc/{pid}/root{}", m.path));
    let shown = printable(&path.display().to_string()).into_owned();
    let file = if m.deleted {
        File::options()
            .read(true)
            .open(format!("/proc/{pid}/map_files/{}", m.range))
            .map_err(|e| Unmapped::Unusable(format!("{shown} was deleted after pid {pid} mapped it; it can be read only through /proc/{pid}/map_files, which needs CAP_CHECKPOINT_RESTORE ({e})")))?
    } else {
        open_in_root(Path::new(&format!("/proc/{pid}/root")), &m.path).map_err(|e| {
            Unmapped::Unopened(format!("cannot open {shown} inside pid {pid}'s root: {e}"))
        })?
    };
    let meta = symbols::check(&file, &path).map_err(|e| Unmapped::Unusable(e.to_string()))?;
    if (meta.dev(), meta.ino()) != (m.dev, m.inode) {
        return Err(Unmapped::Unusable(format!(
            "{shown} is not the file pid {pid} mapped (inode {} there, {} in its maps): it changed since, not attached",
            meta.ino(),
            m.inode
        )));
    }
    Ok((file, meta, path))
}

/// Opens the file `pid` mapped as `m` ([`open_mapped`]) and reads its entry points.
fn prepare(pid: u32, m: &Mapping, settled: &Settled) -> Result<Prepared, String> {
    let (file, meta, path) = open_mapped(pid, m).map_err(|e| e.to_string())?;
    let allowed = settled
        .allowed
        .as_ref()
        .is_none_or(|a| a.contains(&(m.dev, m.inode)));
    let resolution = match allowed {
        true => Some(symbols::resolve(&file, &path).map_err(|e| e.to_string())?),
        false => None,
    };
    Ok(Prepared {
        holder: Holder::of(pid),
        path,
        file,
        meta,
        resolution,
    })
}

/// What one pass over every process's maps found.
#[derive(Default)]
pub struct Pass {
    /// The libcuda files to attach, opened and read.
    pub found: Vec<Prepared>,
    /// Every libcuda file some process whose maps cudatrace reads maps now (`None`: /proc could
    /// not be listed). A process whose maps it cannot read keeps no file attached: discovery
    /// could not have found one through it either.
    pub mapped: Option<HashSet<FileKey>>,
}

/// A file that failed: when to try again and what it said.
struct Retry {
    next: Instant,
    delay: Duration,
    said: String,
    pass: u64,
}

/// What discovery did, shared with the metrics.
#[derive(Debug, Default)]
pub struct Stats {
    /// Processes whose maps were read.
    pub reads: AtomicU64,
    /// Opens not queued: their tenant's share, or the queue, was full (a full pass then ran).
    pub dropped: AtomicU64,
    /// Opens of a process whose reads found nothing a moment ago, read when its quiet time is up.
    pub deferred: AtomicU64,
    /// Full passes over every process (the first one included).
    pub full_passes: AtomicU64,
    /// Dynamic loaders hooked (where discovery hooks loaders).
    pub loaders: AtomicU64,
    /// Executions of new files whose process's maps were read for its loader.
    pub execs_read: AtomicU64,
    /// Executions of new files not read (the reads' budget was spent): said again at the file's
    /// next execution.
    pub execs_dropped: AtomicU64,
}

impl Stats {
    /// The counts now.
    pub fn counted(&self) -> Counted {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Counted {
            maps_read: get(&self.reads),
            opens_dropped: get(&self.dropped),
            opens_deferred: get(&self.deferred),
            full_passes: get(&self.full_passes),
            loaders: get(&self.loaders),
            execs_read: get(&self.execs_read),
            execs_dropped: get(&self.execs_dropped),
        }
    }
}

/// What discovery did, copied out for a scrape.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counted {
    /// Processes whose maps were read.
    pub maps_read: u64,
    /// Opens not queued (their tenant's share or the queue was full).
    pub opens_dropped: u64,
    /// Opens of quiet processes, read later.
    pub opens_deferred: u64,
    /// Full passes.
    pub full_passes: u64,
    /// Dynamic loaders hooked.
    pub loaders: u64,
    /// Executions of new files read for their loader.
    pub execs_read: u64,
    /// Executions of new files not read (budget spent).
    pub execs_dropped: u64,
}

/// Discovery's memory between passes: files that failed, retried with backoff, and pruned once
/// no process maps them.
#[derive(Default)]
pub struct Scanner {
    failed: HashMap<FileKey, Retry>,
    pass: u64,
    /// What it did, shared with the metrics.
    pub stats: Arc<Stats>,
    /// The dynamic loaders in the maps read, not handed on yet (`None`: not looked for, as
    /// where discovery does not hook loaders).
    pub loaders: Option<Vec<(u32, Mapping)>>,
}

impl Scanner {
    /// One pass over every process's maps: the libcuda files not in `skip` (attached or refused
    /// already), opened and read, and every libcuda file mapped. Failures are said once per new
    /// reason.
    pub fn pass(&mut self, settled: &Settled) -> Pass {
        self.begin_pass();
        let now = Instant::now();
        let mut out = Vec::new();
        let mut tried = HashSet::new();
        let mut mapped = HashSet::new();
        let Ok(procs) = fs::read_dir("/proc") else {
            return Pass::default();
        };
        for p in procs.flatten() {
            let name = p.file_name();
            let Some(pid) = name.to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            self.scan(pid, settled, now, &mut tried, &mut mapped, &mut out);
        }
        self.end_pass();
        Pass {
            found: out,
            mapped: Some(mapped),
        }
    }

    /// A full pass begins: counted, and the files it sees marked as seen again.
    fn begin_pass(&mut self) {
        self.pass += 1;
        self.stats.full_passes.fetch_add(1, Ordering::Relaxed);
    }

    /// A full pass ended: the failed files it did not see (no process maps them) are forgotten.
    fn end_pass(&mut self) {
        let pass = self.pass;
        self.failed.retain(|_, r| r.pass == pass);
    }

    /// The libcuda files process `pid` maps, not in `skip`, opened and read into `out` (each
    /// file tried once per pass: `tried`); every libcuda file it maps goes into `mapped`.
    /// Whether it maps any (`None`: its maps cannot be read; it is gone).
    pub fn scan(
        &mut self,
        pid: u32,
        settled: &Settled,
        now: Instant,
        tried: &mut HashSet<FileKey>,
        mapped: &mut HashSet<FileKey>,
        out: &mut Vec<Prepared>,
    ) -> Option<bool> {
        let file = File::open(format!("/proc/{pid}/maps")).ok()?;
        self.stats.reads.fetch_add(1, Ordering::Relaxed);
        let mut any = false;
        let found = proc_maps::mappings(file);
        if let Some(loaders) = self.loaders.as_mut() {
            loaders.extend(found.loaders.into_iter().map(|m| (pid, m)));
        }
        for m in found.libcuda {
            any = true;
            let key = (m.dev, m.inode);
            mapped.insert(key);
            if settled.skip.contains(&key) || !tried.insert(key) {
                continue;
            }
            if let Some(r) = self.failed.get_mut(&key) {
                r.pass = self.pass;
                if now < r.next {
                    continue;
                }
            }
            match prepare(pid, &m, settled) {
                Ok(p) => {
                    self.failed.remove(&key);
                    out.push(p);
                }
                Err(why) => self.failed_again(key, why, now),
            }
        }
        Some(any)
    }

    fn failed_again(&mut self, key: FileKey, why: String, now: Instant) {
        if self.failed.len() >= MAX_FAILED && !self.failed.contains_key(&key) {
            if let Some(oldest) = self
                .failed
                .iter()
                .min_by_key(|(_, r)| r.next)
                .map(|(k, _)| *k)
            {
                self.failed.remove(&oldest);
            }
        }
        let r = self.failed.entry(key).or_insert(Retry {
            next: now,
            delay: FIRST_RETRY / 2,
            said: String::new(),
            pass: self.pass,
        });
        r.delay = (r.delay * 2).min(MAX_RETRY);
        r.next = now + r.delay;
        r.pass = self.pass;
        if r.said != why {
            log::warn!("cudatrace: {why} (tried again in {} s)", r.delay.as_secs());
            r.said = why;
        }
    }
}

/// Libcuda files the host's loader would find.
pub fn loader_libraries() -> Vec<PathBuf> {
    LOADER_DIRS
        .iter()
        .map(|d| Path::new(d).join("libcuda.so.1"))
        .filter(|p| p.exists())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libcuda_names() {
        assert!(is_libcuda("libcuda.so.1"));
        assert!(is_libcuda("libcuda.so"));
        assert!(is_libcuda("libcuda.so.550.54.15"));
        assert!(!is_libcuda("libcudart.so.12"));
        assert!(!is_libcuda("libcuda_stub.so"));
    }

    #[test]
    fn failures_back_off_and_are_pruned() {
        let mut s = Scanner::default();
        let now = Instant::now();
        s.pass = 1;
        s.failed_again((1, 2), "x".into(), now);
        assert_eq!(s.failed[&(1, 2)].delay, FIRST_RETRY);
        for _ in 0..20 {
            s.failed_again((1, 2), "x".into(), now);
        }
        assert_eq!(s.failed[&(1, 2)].delay, MAX_RETRY);
        // A pass that no longer sees the file forgets it.
        s.pass(&Settled::default());
        assert!(!s.failed.contains_key(&(1, 2)));
    }

    #[test]
    fn in_root_symlinks_stay_in_the_root() {
        let dir = std::env::temp_dir().join(format!("cudatrace-inroot-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("etc")).unwrap();
        fs::write(dir.join("etc/hostname"), "inside").unwrap();
        std::os::unix::fs::symlink("/etc/hostname", dir.join("abs")).unwrap();
        std::os::unix::fs::symlink("../../../../etc/hostname", dir.join("up")).unwrap();
        let read = |name: &str| std::io::read_to_string(open_in_root(&dir, name).unwrap()).unwrap();
        assert_eq!(
            read("abs"),
            "inside",
            "an absolute symlink resolves inside the root"
        );
        assert_eq!(read("up"), "inside", "`..` stops at the root");
        let _ = fs::remove_dir_all(&dir);
    }
}
