//! The probe-harm breaker: a library whose probe harmed a process is detached on this node and
//! stays so, across restarts (`[state] dir`/baselines/probe-breaker.json, the daemon's own
//! folder), until an operator clears it (`cudatrace breaker --clear`).
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
}

/// The open breakers, with the file that keeps them (none: in memory only).
#[derive(Debug, Default)]
pub struct Breaker {
    file: Option<PathBuf>,
    /// Open breakers.
    pub open: Vec<Open>,
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
        Breaker { file, open }
    }

    /// The open breaker of this file (device and inode), if any.
    pub fn of(&self, key: FileKey) -> Option<&Open> {
        self.open.iter().find(|o| (o.dev, o.ino) == key)
    }

    /// Opens the breaker of `library` (`key`), saving it; `false` when it was open already.
    pub fn trip(&mut self, library: &str, key: FileKey, evidence: String) -> bool {
        if self.of(key).is_some() {
            return false;
        }
        if self.open.len() >= MAX_OPEN {
            self.open.remove(0);
        }
        self.open.push(Open {
            library: library.to_owned(),
            dev: key.0,
            ino: key.1,
            opened_at: crate::text::rfc3339(std::time::SystemTime::now()),
            evidence,
        });
        if let Some(f) = &self.file {
            if let Err(e) = write(f, &self.open) {
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
        let cleared = before - self.open.len();
        if let Some(f) = &self.file {
            write(f, &self.open)?;
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
            "SIGILL 12 bytes past cuCtxSynchronize".into()
        ));
        assert!(!b.trip("/usr/lib/libcuda.so.1", (2049, 77), "again".into()));
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
    fn an_unreadable_breaker_file_is_said_and_taken_as_none_open() {
        let dir =
            std::env::temp_dir().join(format!("cudatrace-breaker-bad-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("baselines")).unwrap();
        std::fs::write(dir.join("baselines").join(FILE), "{not json").unwrap();
        assert!(Breaker::load(Some(&dir)).open.is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
