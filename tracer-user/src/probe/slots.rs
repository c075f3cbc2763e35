//! Which library files may be attached: `--lib-allow`, and `max_libraries` slots for the files
//! discovery finds. The operator's own files (`--lib`, the loader's directories) and files
//! `--lib-allow` names take no slot; a discovered file's slot is given back when it is
//! detached, no process mapping it any more, and the files refused for want of a slot are then
//! tried again.
use std::{collections::HashSet, os::unix::fs::MetadataExt as _, path::Path};

use super::{allow::AllowList, discovery::FileKey, error::AttachError};

/// Refused files remembered at most (past it they are forgotten, then refused and counted again).
const MAX_REFUSED_FILES: usize = 4096;

/// The admission of library files.
#[derive(Default)]
pub struct Slots {
    /// Files attached (or being attached).
    attached: HashSet<FileKey>,
    /// Attached files that hold a slot.
    holding: HashSet<FileKey>,
    /// Files `--lib-allow` refused.
    not_allowed: HashSet<FileKey>,
    /// Files refused for want of a slot, tried again when one is given back.
    waiting: HashSet<FileKey>,
    /// Slots for discovered files.
    max_libraries: usize,
    /// Files refused for want of a slot, each counted once while it waits.
    refused: u64,
    /// `--lib-allow`: the only library files attached, when set.
    allow: AllowList,
}

impl Slots {
    /// `max_libraries` slots, every file allowed.
    pub fn new(max_libraries: usize) -> Slots {
        Slots {
            max_libraries,
            ..Slots::default()
        }
    }

    /// Restricts attaching to the files `allow` names.
    pub fn set_allow(&mut self, allow: AllowList) {
        self.allow = allow;
    }

    /// Expands `--lib-allow` again (before a rescan attaches what it found).
    pub fn refresh_allow(&mut self) {
        if self.allow.active() {
            self.allow.refresh();
        }
    }

    /// `--lib-allow`'s files (`None`: every file is allowed).
    pub fn allowed(&self) -> Option<HashSet<FileKey>> {
        self.allow.active().then(|| self.allow.files().clone())
    }

    /// Files attached or refused: discovery does not open them again.
    pub fn settled(&self) -> HashSet<FileKey> {
        let refused = self.not_allowed.iter().chain(&self.waiting);
        self.attached.iter().chain(refused).copied().collect()
    }

    /// Libraries refused for want of a slot.
    pub fn refused(&self) -> u64 {
        self.refused
    }

    /// Whether the file may be attached now: `false` when attached already; an error (and the
    /// file remembered as refused) when `--lib-allow` or `max_libraries` refuses it. `operators`:
    /// the operator named it (`--lib`, the loader's directories), so it takes no slot.
    pub fn admit(
        &mut self,
        path: &Path,
        meta: &std::fs::Metadata,
        operators: bool,
    ) -> Result<bool, AttachError> {
        let key = (meta.dev(), meta.ino());
        if self.attached.contains(&key) {
            return Ok(false);
        }
        if !self.allow.allows(meta) {
            remember(&mut self.not_allowed, key);
            return Err(AttachError::NotAllowed {
                path: path.display().to_string(),
                allowed: self.allow.describe(),
            });
        }
        // Files the allow list names take no slot: the list bounds them.
        let takes_slot = !operators && !self.allow.active();
        if takes_slot && self.holding.len() >= self.max_libraries {
            if remember(&mut self.waiting, key) {
                self.refused += 1;
            }
            return Err(AttachError::TooMany {
                path: path.display().to_string(),
                max: self.max_libraries,
            });
        }
        self.attached.insert(key);
        if takes_slot {
            self.holding.insert(key);
        }
        Ok(true)
    }

    /// Whether a file was admitted as the operator's or allowed (it is never given back).
    pub fn kept(&self, key: &FileKey) -> bool {
        self.attached.contains(key) && !self.holding.contains(key)
    }

    /// Gives back a detached file's slot; the files waiting for one are tried again.
    pub fn release(&mut self, key: &FileKey) {
        self.attached.remove(key);
        if self.holding.remove(key) {
            self.waiting.clear();
        }
    }
}

/// Adds `key` to a bounded set of refused files (cleared when full); whether it is new.
fn remember(set: &mut HashSet<FileKey>, key: FileKey) -> bool {
    if set.len() >= MAX_REFUSED_FILES && !set.contains(&key) {
        set.clear();
    }
    set.insert(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_given_back_lets_a_waiting_file_in() {
        let dir = std::env::temp_dir().join(format!("cudatrace-slots-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let files: Vec<(std::path::PathBuf, std::fs::Metadata)> = (0..4)
            .map(|i| {
                let p = dir.join(format!("libcuda.so.{i}"));
                std::fs::write(&p, b"x").unwrap();
                let m = std::fs::metadata(&p).unwrap();
                (p, m)
            })
            .collect();
        let key = |m: &std::fs::Metadata| (m.dev(), m.ino());
        let mut s = Slots::new(2);
        // The operator's file takes no slot; two discovered files take both.
        assert!(s.admit(&files[0].0, &files[0].1, true).unwrap());
        assert!(s.admit(&files[1].0, &files[1].1, false).unwrap());
        assert!(s.admit(&files[2].0, &files[2].1, false).unwrap());
        assert!(!s.admit(&files[1].0, &files[1].1, false).unwrap());
        let refused = s.admit(&files[3].0, &files[3].1, false).unwrap_err();
        assert!(matches!(refused, AttachError::TooMany { max: 2, .. }));
        assert!(s.admit(&files[3].0, &files[3].1, false).is_err());
        assert_eq!(s.refused(), 1, "a waiting file is counted once");
        assert!(s.settled().contains(&key(&files[3].1)));
        assert!(s.kept(&key(&files[0].1)) && !s.kept(&key(&files[1].1)));
        // One detached: its slot goes to the waiting file, which discovery opens again.
        s.release(&key(&files[1].1));
        assert!(!s.settled().contains(&key(&files[3].1)));
        assert!(s.admit(&files[3].0, &files[3].1, false).unwrap());
        assert!(s.admit(&files[1].0, &files[1].1, false).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
