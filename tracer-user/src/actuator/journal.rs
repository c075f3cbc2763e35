//! The actuator's journal: every cap it holds, written (and synced) before the cap is, so that a
//! cap outlives no actuator. The next start restores what a killed one left.
use std::{
    fs,
    io::Write as _,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

/// The journal is read up to this many bytes.
const MAX_JOURNAL: u64 = 4 << 20;

/// One cap held.
#[derive(Clone, Debug, Deserialize, PartialEq, Serialize)]
pub struct Hold {
    /// The verdict it answers (the client's key).
    pub key: String,
    /// The process the verdict named.
    pub pid: u32,
    /// The cgroup capped.
    pub dir: PathBuf,
    /// Its files as they were, in the order that restores them.
    pub restore: Vec<(String, String)>,
    /// The cap written, for the record.
    pub cpu_max: String,
    /// When it is undone at the latest, Unix seconds.
    pub until_unix: u64,
}

/// The journal file.
pub struct Journal {
    path: PathBuf,
}

impl Journal {
    /// The journal at `path`.
    pub fn new(path: &Path) -> Journal {
        Journal {
            path: path.to_path_buf(),
        }
    }

    /// The holds it records; an unreadable or damaged journal is an error that says which.
    pub fn load(&self) -> Result<Vec<Hold>, String> {
        use std::io::Read;
        let mut text = String::new();
        match fs::File::open(&self.path) {
            Ok(f) => f
                .take(MAX_JOURNAL)
                .read_to_string(&mut text)
                .map_err(|e| format!("cannot read {}: {e}", self.path.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(format!("cannot open {}: {e}", self.path.display())),
        };
        if text.trim().is_empty() {
            return Ok(Vec::new());
        }
        serde_json::from_str(&text).map_err(|e| {
            format!(
                "{} is damaged ({e}): restore its caps by hand",
                self.path.display()
            )
        })
    }

    /// Replaces it with `holds`: a temporary file, synced, renamed over it, the folder synced.
    pub fn save(&self, holds: &[Hold]) -> Result<(), String> {
        let tmp = self.path.with_extension("tmp");
        let write = || -> std::io::Result<()> {
            let mut f = fs::File::create(&tmp)?;
            f.write_all(&serde_json::to_vec(holds).map_err(std::io::Error::other)?)?;
            f.sync_all()?;
            fs::rename(&tmp, &self.path)?;
            if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
                fs::File::open(dir)?.sync_all()?;
            }
            Ok(())
        };
        write().map_err(|e| format!("cannot write {}: {e}", self.path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_survive_a_save_and_a_damaged_journal_is_said() {
        let dir = std::env::temp_dir().join(format!("ct-journal-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let j = Journal::new(&dir.join("actions.json"));
        assert_eq!(j.load().unwrap(), Vec::new());
        let h = Hold {
            key: "4121/p99/CudatraceComputeContention".into(),
            pid: 4190,
            dir: "/sys/fs/cgroup/batch".into(),
            restore: vec![("cpu.max".into(), "max 100000".into())],
            cpu_max: "20000 100000".into(),
            until_unix: 1_800_000_000,
        };
        j.save(std::slice::from_ref(&h)).unwrap();
        assert_eq!(j.load().unwrap(), vec![h]);
        j.save(&[]).unwrap();
        assert_eq!(j.load().unwrap(), Vec::new());
        fs::write(dir.join("actions.json"), "{not json").unwrap();
        assert!(j.load().unwrap_err().contains("is damaged"));
        let _ = fs::remove_dir_all(&dir);
    }
}
