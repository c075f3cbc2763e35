//! The per-workload memory on disk (`[state] dir`/baselines/baselines.json): read at start,
//! written at least every `save_every_s` and at stop, atomically (a temporary file, fsync,
//! rename, fsync of the directory), mode 0600, at most [`MAX_FILE`] bytes. A file that is
//! missing, too large, truncated, of another format or of another version is one line on
//! stderr, set aside as `baselines.json.bad` (replacing an older one) and a fresh start.
use std::{
    fs::File,
    io::{self, Read as _, Write as _},
    path::{Path, PathBuf},
    time::{Duration, Instant, SystemTime},
};

use serde::{Deserialize, Serialize};

use crate::{
    config::DetectConfig,
    detect::memory::{Memory, Remembered},
    sinks::files::{open_private, How},
};

pub mod prepare;

/// What the file says it is.
pub const FORMAT: &str = "cudatrace-baselines";
/// The layout's version.
pub const VERSION: u32 = 1;
/// Largest file read.
pub const MAX_FILE: u64 = 64 << 20;
/// The directory under `[state] dir` the file is in (the daemon's own, once it left uid 0).
pub const SUBDIR: &str = "baselines";
/// The file's name.
pub const FILE: &str = "baselines.json";

/// The file as written.
#[derive(Serialize)]
struct Saving<'a> {
    format: &'static str,
    version: u32,
    saved_at: f64,
    season_s: u64,
    season_bucket_s: u64,
    workloads: Vec<(&'a str, &'a Remembered)>,
}

/// The file as read.
#[derive(Deserialize)]
struct Saved {
    format: String,
    version: u32,
    saved_at: f64,
    season_s: u64,
    season_bucket_s: u64,
    workloads: Vec<(String, Remembered)>,
}

/// Before leaving uid 0: `[state] dir`'s `baselines/` made the daemon's own (`owner`: who it
/// will run as). `None` (said in one line) when state is off or the directory cannot be had.
pub fn prepare_dir(cfg: &crate::config::Config, owner: (u32, u32)) -> Option<PathBuf> {
    let dir = cfg.state.dir.as_ref()?;
    match prepare::prepare(dir, owner) {
        Ok(sub) => Some(sub.join(FILE)),
        Err(e) => {
            log::warn!(
                target: "cudatrace::state",
                "state: {e}; baselines live in memory only"
            );
            None
        }
    }
}

/// Once running as the daemon's uid: the memory `path` holds, and its saver.
pub fn resume(path: PathBuf, cfg: &crate::config::Config) -> (Memory, Saver) {
    let mut memory = crate::detect::Detector::memory_for(&cfg.detect, cfg.state.max_workloads);
    load(&path, &mut memory, &cfg.detect);
    let every = Duration::from_secs(cfg.state.save_every_s);
    (memory, Saver::new(path, every))
}

/// The file under state directory `dir`.
pub fn path_in(dir: &Path) -> PathBuf {
    dir.join(SUBDIR).join(FILE)
}

/// How a load went.
#[derive(Debug, PartialEq, Eq)]
pub enum Loaded {
    /// No file yet.
    Missing,
    /// Read: workloads taken, workloads refused.
    Read(usize, usize),
    /// Not usable: set aside (why).
    SetAside(String),
}

/// Reads `path` into `memory` (made for `cfg`), saying how in one line.
pub fn load(path: &Path, memory: &mut Memory, cfg: &DetectConfig) -> Loaded {
    let shown = path.display();
    let outcome = match read(path) {
        Ok(None) => Loaded::Missing,
        Ok(Some(saved)) if saved.format != FORMAT => {
            Loaded::SetAside(format!("it is not a {FORMAT} file"))
        }
        Ok(Some(saved)) if saved.version != VERSION => Loaded::SetAside(format!(
            "it is version {}; this cudatrace reads version {VERSION}",
            saved.version
        )),
        Ok(Some(saved)) => {
            let reseason =
                saved.season_s != cfg.season_s || saved.season_bucket_s != cfg.season_bucket_s;
            let (mut taken, mut refused) = (0, 0);
            for (name, mut r) in saved.workloads {
                if reseason {
                    for s in &mut r.series {
                        s.season = Default::default();
                    }
                }
                if memory.adopt(&name, r) {
                    taken += 1;
                } else {
                    refused += 1;
                }
            }
            let age = crate::text::rfc3339(
                SystemTime::UNIX_EPOCH + Duration::from_secs_f64(saved.saved_at.clamp(0.0, 1e11)),
            );
            log::info!(
                target: "cudatrace::state",
                workloads = taken,
                refused = refused;
                "state: resumed {taken} workloads' baselines from {shown} (saved {age}){}{}",
                if refused > 0 { format!("; {refused} refused (out of range, or past max_workloads)") } else { String::new() },
                if reseason { "; seasons start over (season_s or season_bucket_s changed)" } else { "" }
            );
            Loaded::Read(taken, refused)
        }
        Err(why) => Loaded::SetAside(why),
    };
    match &outcome {
        Loaded::Missing => log::info!(
            target: "cudatrace::state",
            "state: no saved baselines at {shown} yet: starting fresh"
        ),
        Loaded::SetAside(why) => {
            let aside = path.with_extension("json.bad");
            let moved = match std::fs::rename(path, &aside) {
                Ok(()) => format!("set aside as {}", aside.display()),
                Err(e) => format!("could not set it aside ({e}); it will be overwritten"),
            };
            log::warn!(
                target: "cudatrace::state",
                "state: {shown} cannot be used ({why}): {moved}; baselines start fresh"
            );
        }
        Loaded::Read(..) => {}
    }
    outcome
}

/// The file's contents, `None` when there is none; an error says what is wrong with it.
fn read(path: &Path) -> Result<Option<Saved>, String> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path);
    let file = match file {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Err("it is a symlink".into()),
        Err(e) => return Err(format!("cannot read it: {e}")),
    };
    let meta = file.metadata().map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("it is not a regular file".into());
    }
    if meta.len() > MAX_FILE {
        return Err(format!(
            "{} bytes, over the {} MiB a state file may have",
            meta.len(),
            MAX_FILE >> 20
        ));
    }
    let mut text = Vec::new();
    file.take(MAX_FILE + 1)
        .read_to_end(&mut text)
        .map_err(|e| format!("cannot read it: {e}"))?;
    if text.is_empty() {
        return Err("it is empty".into());
    }
    serde_json::from_slice(&text).map_err(|e| format!("not a whole {FORMAT} file: {e}"))
}

/// Writes `memory` to `path` atomically; the bytes written.
pub fn save(path: &Path, memory: &Memory, now: SystemTime) -> io::Result<usize> {
    let mut workloads: Vec<(&str, &Remembered)> = memory.iter().map(|(k, r)| (&**k, r)).collect();
    workloads.sort_by(|a, b| a.0.cmp(b.0));
    let season = memory.season();
    let text = serde_json::to_vec(&Saving {
        format: FORMAT,
        version: VERSION,
        saved_at: now
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64()),
        season_s: season.len_s,
        season_bucket_s: season.bucket_s,
        workloads,
    })?;
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = dir.join(format!(".{FILE}.tmp"));
    let mut f = open_private(&tmp, How::Truncate)?;
    f.write_all(&text)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path)?;
    File::open(dir)?.sync_all()?;
    Ok(text.len())
}

/// Saves every `every`, and at stop; a failure is said once, and its end once.
pub struct Saver {
    path: PathBuf,
    every: Duration,
    last: Instant,
    failing: bool,
}

impl Saver {
    /// Saves to `path` every `every`.
    pub fn new(path: PathBuf, every: Duration) -> Saver {
        Saver {
            path,
            every,
            last: Instant::now(),
            failing: false,
        }
    }

    /// Saves when `every` has passed since the last save, or when `now_anyway`.
    pub fn tick(&mut self, memory: &Memory, now_anyway: bool) {
        if !now_anyway && self.last.elapsed() < self.every {
            return;
        }
        self.last = Instant::now();
        match save(&self.path, memory, SystemTime::now()) {
            Ok(bytes) => {
                if std::mem::take(&mut self.failing) {
                    log::info!(
                        target: "cudatrace::state",
                        "state: saved to {} again",
                        self.path.display()
                    );
                }
                log::debug!(
                    target: "cudatrace::state",
                    "state: saved {} workloads, {bytes} bytes, to {}",
                    memory.len(),
                    self.path.display()
                );
            }
            Err(e) if !self.failing => {
                self.failing = true;
                log::warn!(
                    target: "cudatrace::state",
                    "state: cannot save baselines to {} ({e}); they live in memory until it works (is {} the daemon's own?)",
                    self.path.display(),
                    self.path.parent().unwrap_or(Path::new("/")).display()
                );
            }
            Err(_) => {}
        }
    }
}

#[cfg(test)]
mod tests;
