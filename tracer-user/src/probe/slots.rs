//! Which library files may be attached: `--lib-allow`, and `max_libraries` slots for the files
//! discovery finds. The operator's own files (`--lib`, the loader's directories) and files
//! `--lib-allow` names take no slot; a discovered file's slot is given back when it is
//! detached, no process mapping it any more, and the files refused for want of a slot are then
//! tried again. One tenant holds at most half of the slots, so that short processes of one
//! tenant, each with its own copy, cannot take every slot from the others; and the process that
//! mapped a file is remembered, so that a slot whose holder exited asks for the pass that gives
//! it back.
use std::{
    collections::{HashMap, HashSet},
    os::unix::fs::MetadataExt as _,
    path::Path,
};

use super::{allow::AllowList, discovery::FileKey, error::AttachError};
use crate::identity::{self, Tenant};

/// The process through which discovery found a file, and its tenant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    /// Its pid.
    pub pid: u32,
    /// Its start time (pid reuse).
    pub started: Option<u64>,
    /// Its tenant.
    pub tenant: Tenant,
}

impl Holder {
    /// Process `pid`, read from /proc.
    pub fn of(pid: u32) -> Holder {
        Holder {
            pid,
            started: identity::start_time(pid),
            tenant: Tenant::of_pid(pid),
        }
    }

    /// Whether that very process is gone.
    fn gone(&self) -> bool {
        identity::start_time(self.pid) != self.started || !identity::process_alive(self.pid)
    }
}

/// Refused files remembered at most (past it they are forgotten, then refused and counted again).
const MAX_REFUSED_FILES: usize = 4096;

/// The admission of library files.
#[derive(Default)]
pub struct Slots {
    /// Files attached (or being attached).
    attached: HashSet<FileKey>,
    /// Attached files that hold a slot, with the process they were found through.
    holding: HashMap<FileKey, Holder>,
    /// Held files whose holder was seen gone (a pass was asked for once).
    orphaned: HashSet<FileKey>,
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

    /// Whether the slots are in demand: half of them held, or a file waiting for one.
    pub fn in_demand(&self) -> bool {
        self.holding.len() * 2 >= self.max_libraries || !self.waiting.is_empty()
    }

    /// Libraries refused for want of a slot.
    pub fn refused(&self) -> u64 {
        self.refused
    }

    /// Slots one tenant may hold: half of them, at least one.
    pub fn tenant_share(&self) -> usize {
        (self.max_libraries / 2).max(1)
    }

    /// Whether the file may be attached now: `false` when attached already; an error (and the
    /// file remembered as refused) when `--lib-allow`, `max_libraries` or its tenant's share
    /// refuses it. `holder`: the process discovery found it through (`None`: the operator named
    /// it, `--lib` or the loader's directories, so it takes no slot).
    pub fn admit(
        &mut self,
        path: &Path,
        meta: &std::fs::Metadata,
        holder: Option<&Holder>,
    ) -> Result<bool, AttachError> {
        let operators = holder.is_none();
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
        if let Some(holder) = holder.filter(|_| takes_slot) {
            let held = self
                .holding
                .values()
                .filter(|h| h.tenant == holder.tenant)
                .count();
            let error = if held >= self.tenant_share() {
                Some(AttachError::TenantFull {
                    path: path.display().to_string(),
                    tenant: holder.tenant.to_string(),
                    share: self.tenant_share(),
                })
            } else if self.holding.len() >= self.max_libraries {
                Some(AttachError::TooMany {
                    path: path.display().to_string(),
                    max: self.max_libraries,
                })
            } else {
                None
            };
            if let Some(e) = error {
                if remember(&mut self.waiting, key) {
                    self.refused += 1;
                }
                return Err(e);
            }
            self.holding.insert(key, holder.clone());
        }
        self.attached.insert(key);
        Ok(true)
    }

    /// Whether a held file's holder exited since last asked (each file said once), while the
    /// slots are in demand (half of them held, or a file waiting): a pass over every process
    /// then tells whether anyone still maps it. Without demand no pass is spent on it (the
    /// next pass gives the slot back).
    pub fn holder_gone(&mut self) -> bool {
        if !self.in_demand() {
            return false;
        }
        let gone: Vec<FileKey> = self
            .holding
            .iter()
            .filter(|(k, h)| !self.orphaned.contains(*k) && h.gone())
            .map(|(k, _)| *k)
            .collect();
        self.orphaned.extend(&gone);
        !gone.is_empty()
    }

    /// Whether a file was admitted as the operator's or allowed (it is never given back).
    pub fn kept(&self, key: &FileKey) -> bool {
        self.attached.contains(key) && !self.holding.contains_key(key)
    }

    /// Gives back a detached file's slot; the files waiting for one are tried again.
    pub fn release(&mut self, key: &FileKey) {
        self.attached.remove(key);
        self.orphaned.remove(key);
        if self.holding.remove(key).is_some() {
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
        let holder = |pid: u32, cgroup: &str| Holder {
            pid,
            started: None,
            tenant: Tenant::of(Some(cgroup)),
        };
        let (a, b, c) = (holder(1, "/a"), holder(2, "/b"), holder(3, "/c"));
        let mut s = Slots::new(4);
        // The operator's file takes no slot; tenant a takes its share of two, then is refused.
        assert!(s.admit(&files[0].0, &files[0].1, None).unwrap());
        assert!(s.admit(&files[1].0, &files[1].1, Some(&a)).unwrap());
        assert!(s.admit(&files[2].0, &files[2].1, Some(&a)).unwrap());
        assert!(!s.admit(&files[1].0, &files[1].1, Some(&a)).unwrap());
        let refused = s.admit(&files[3].0, &files[3].1, Some(&a)).unwrap_err();
        assert!(
            matches!(&refused, AttachError::TenantFull { share: 2, tenant, .. } if tenant == "/a"),
            "{refused}"
        );
        // Another tenant gets in; past max_libraries, everyone is refused.
        let mut s = Slots::new(2);
        assert!(s.admit(&files[1].0, &files[1].1, Some(&a)).unwrap());
        assert!(s.admit(&files[2].0, &files[2].1, Some(&b)).unwrap());
        let refused = s.admit(&files[3].0, &files[3].1, Some(&c)).unwrap_err();
        assert!(matches!(refused, AttachError::TooMany { max: 2, .. }));
        assert!(s.admit(&files[3].0, &files[3].1, Some(&c)).is_err());
        let h = c;
        assert_eq!(s.refused(), 1, "a waiting file is counted once");
        assert!(s.settled().contains(&key(&files[3].1)));
        assert!(!s.kept(&key(&files[1].1)));
        // One detached: its slot goes to the waiting file, which discovery opens again.
        s.release(&key(&files[1].1));
        assert!(!s.settled().contains(&key(&files[3].1)));
        assert!(s.admit(&files[3].0, &files[3].1, Some(&h)).unwrap());
        assert!(s.admit(&files[1].0, &files[1].1, Some(&h)).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_holder_that_exited_is_said_once() {
        let dir = std::env::temp_dir().join(format!("cudatrace-holder-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("libcuda.so.1");
        std::fs::write(&p, b"x").unwrap();
        let m = std::fs::metadata(&p).unwrap();
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let mut s = Slots::new(2);
        assert!(s.admit(&p, &m, Some(&Holder::of(child.id()))).unwrap());
        assert!(!s.holder_gone(), "it lives");
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(s.holder_gone());
        assert!(!s.holder_gone(), "said once");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
