//! The probe-harm breaker: a library whose probe harmed a process (corroborated: `probe::scope`)
//! is detached on this node and stays so, across restarts (`[state] dir`/baselines/
//! probe-breaker.json, the daemon's own folder), until an operator clears it (`cudatrace breaker
//! --clear`). It half-opens by itself in one case only: the node now runs another kernel than the
//! one it opened on (a kernel update is the usual fix); the library is then attached again, and
//! its next harm that is not the process's own opens it at once, whoever made it.
use std::{
    io::Write as _,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

use super::discovery::FileKey;

/// The breaker file's name, in `[state] dir`/baselines/.
pub const FILE: &str = "probe-breaker.json";
/// The daemon's own folder under `[state] dir` (the baselines' one, which `prepare-state` makes
/// its own).
const STATE_SUBDIR: &str = "baselines";
/// Breakers kept at most (a node has few libcuda files; a hostile stream of faults cannot grow it).
pub const MAX_OPEN: usize = 64;
/// Largest breaker file read.
const MAX_BYTES: u64 = 1 << 20;

/// One open breaker: the library file, when, and the evidence.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Open {
    /// The library's path.
    pub library: String,
    /// Its device.
    pub dev: u64,
    /// Its inode.
    pub ino: u64,
    /// When it opened (RFC 3339).
    pub opened_at: String,
    /// The harm that opened it, in a line.
    pub evidence: String,
    /// The kernel release it opened on (empty in files written before it was kept: held).
    #[serde(default)]
    pub kernel: String,
}

/// The open breakers, with the file that keeps them (none: in memory only).
#[derive(Debug, Default)]
pub struct Breaker {
    file: Option<PathBuf>,
    /// Open breakers.
    pub open: Vec<Open>,
    /// Breakers opened on another kernel than the running one: attached again, and tripped at
    /// the library's next harm.
    pub half_open: Vec<Open>,
}

impl Breaker {
    /// The breakers kept under `state_dir` (none: in memory only); a missing file is none open,
    /// an unreadable one is said and taken as none open.
    pub fn load(state_dir: Option<&Path>) -> Breaker {
        let file = state_dir.map(|d| d.join(STATE_SUBDIR).join(FILE));
        let open = match &file {
            Some(f) => read(f).unwrap_or_else(|e| {
                log::warn!(
                    "cudatrace: cannot read the probe-harm breakers in {}: {e}",
                    f.display()
                );
                Vec::new()
            }),
            None => Vec::new(),
        };
        Breaker {
            file,
            open,
            half_open: Vec::new(),
        }
    }

    /// Half-opens the breakers that opened on another kernel than `release`, saying each once.
    pub fn on_kernel(&mut self, release: &str) {
        let (other, same): (Vec<Open>, Vec<Open>) = std::mem::take(&mut self.open)
            .into_iter()
            .partition(|o| !o.kernel.is_empty() && o.kernel != release);
        self.open = same;
        for o in other {
            log::warn!(
                target: "cudatrace::breaker_half_open",
                library = o.library.as_str();
                "cudatrace: the probe-harm breaker of {} opened on kernel {} ({}); this is kernel {release}: half-open, attached again, and its next harm opens it at once",
                crate::text::printable(&o.library),
                crate::text::printable(&o.kernel),
                crate::text::printable(&o.evidence)
            );
            self.half_open.push(o);
        }
    }

    /// What the file keeps: the open breakers and the half-open ones (held again on their kernel).
    fn kept(&self) -> Vec<Open> {
        self.open.iter().chain(&self.half_open).cloned().collect()
    }

    /// Whether the breaker of `key` is half-open (its next harm trips it).
    pub fn is_half_open(&self, key: FileKey) -> bool {
        self.half_open.iter().any(|o| (o.dev, o.ino) == key)
    }

    /// Refuses to attach `path` (`key`) while its breaker is open.
    pub fn refuse(&self, path: &Path, key: FileKey) -> Result<(), super::error::AttachError> {
        match self.of(key) {
            Some(open) => Err(super::error::AttachError::BreakerOpen {
                path: path.display().to_string(),
                since: open.opened_at.clone(),
                evidence: open.evidence.clone(),
            }),
            None => Ok(()),
        }
    }

    /// The open breaker of this file (device and inode), if any.
    pub fn of(&self, key: FileKey) -> Option<&Open> {
        self.open.iter().find(|o| (o.dev, o.ino) == key)
    }

    /// Opens the breaker of `library` (`key`) on kernel `kernel`, saving it; `false` when it
    /// was open already.
    pub fn trip(&mut self, library: &str, key: FileKey, evidence: String, kernel: &str) -> bool {
        if self.of(key).is_some() {
            return false;
        }
        self.half_open.retain(|o| (o.dev, o.ino) != key);
        if self.open.len() >= MAX_OPEN {
            self.open.remove(0);
        }
        self.open.push(Open {
            library: library.to_owned(),
            dev: key.0,
            ino: key.1,
            opened_at: crate::text::rfc3339(std::time::SystemTime::now()),
            evidence,
            kernel: kernel.to_owned(),
        });
        if let Some(f) = &self.file {
            if let Err(e) = write(f, &self.kept()) {
                log::warn!(
                    "cudatrace: cannot keep the probe-harm breaker in {}: {e} (it holds until this process stops)",
                    f.display()
                );
            }
        }
        true
    }

    /// Clears the breakers whose library path is `library` (all with `None`); returns how many.
    pub fn clear(&mut self, library: Option<&str>) -> std::io::Result<usize> {
        let before = self.open.len();
        self.open
            .retain(|o| library.is_some_and(|l| o.library != l));
        self.half_open
            .retain(|o| library.is_some_and(|l| o.library != l));
        let cleared = before - self.open.len();
        if let Some(f) = &self.file {
            write(f, &self.kept())?;
        }
        Ok(cleared)
    }
}

fn read(f: &Path) -> std::io::Result<Vec<Open>> {
    let text = match std::fs::metadata(f) {
        Ok(m) if m.len() > MAX_BYTES => {
            return Err(std::io::Error::other(format!(
                "larger than {MAX_BYTES} bytes"
            )))
        }
        Ok(_) => std::fs::read_to_string(f)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut open: Vec<Open> = serde_json::from_str(&text).map_err(std::io::Error::other)?;
    open.truncate(MAX_OPEN);
    Ok(open)
}

/// Written whole, then renamed over the old file.
fn write(f: &Path, open: &[Open]) -> std::io::Result<()> {
    if let Some(dir) = f.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = f.with_extension("json.tmp");
    let mut out = std::fs::File::create(&tmp)?;
    out.write_all(&serde_json::to_vec_pretty(open).map_err(std::io::Error::other)?)?;
    out.sync_all()?;
    std::fs::rename(&tmp, f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tripped_breaker_survives_a_restart_until_cleared() {
        let dir = std::env::temp_dir().join(format!("cudatrace-breaker-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut b = Breaker::load(Some(&dir));
        assert!(b.open.is_empty());
        assert!(b.trip(
            "/usr/lib/libcuda.so.1",
            (2049, 77),
            "SIGILL 12 bytes past cuCtxSynchronize".into(),
            "6.18.0"
        ));
        assert!(!b.trip(
            "/usr/lib/libcuda.so.1",
            (2049, 77),
            "again".into(),
            "6.18.0"
        ));
        let again = Breaker::load(Some(&dir));
        assert_eq!(again.open.len(), 1);
        assert_eq!(
            again.of((2049, 77)).unwrap().library,
            "/usr/lib/libcuda.so.1"
        );
        assert!(again.of((2049, 78)).is_none());
        let mut again = again;
        assert_eq!(again.clear(Some("/other")).unwrap(), 0);
        assert_eq!(again.clear(Some("/usr/lib/libcuda.so.1")).unwrap(), 1);
        assert!(Breaker::load(Some(&dir)).open.is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_breaker_half_opens_on_another_kernel_and_trips_at_the_next_harm() {
        let dir = std::env::temp_dir().join(format!("cudatrace-breaker-k-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut b = Breaker::load(Some(&dir));
        b.trip("/lib/a.so", (1, 1), "SIGILL".into(), "6.1.0");
        b.trip("/lib/b.so", (1, 2), "SIGILL".into(), "6.18.0");
        let mut again = Breaker::load(Some(&dir));
        again.on_kernel("6.18.0");
        // Opened on 6.1: half-open, attached again; opened on this kernel: held.
        assert!(again.refuse(Path::new("/lib/a.so"), (1, 1)).is_ok());
        assert!(again.is_half_open((1, 1)));
        assert!(matches!(
            again.refuse(Path::new("/lib/b.so"), (1, 2)),
            Err(crate::probe::error::AttachError::BreakerOpen { .. })
        ));
        assert!(!again.is_half_open((1, 2)));
        // Its next harm trips it on this kernel, and it is held from then on.
        assert!(again.trip("/lib/a.so", (1, 1), "SIGILL".into(), "6.18.0"));
        assert!(!again.is_half_open((1, 1)));
        let mut third = Breaker::load(Some(&dir));
        third.on_kernel("6.18.0");
        assert!(third.refuse(Path::new("/lib/a.so"), (1, 1)).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_unreadable_breaker_file_is_said_and_taken_as_none_open() {
        let dir =
            std::env::temp_dir().join(format!("cudatrace-breaker-bad-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("baselines")).unwrap();
        std::fs::write(dir.join("baselines").join(FILE), "{not json").unwrap();
        assert!(Breaker::load(Some(&dir)).open.is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
