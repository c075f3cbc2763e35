//! What `[mitigate]` did for each firing page, kept until the page resolves: the incident
//! archive writes it into the incident's record (`mitigation`), so that the archive says which
//! incidents were acted on, how, and with what answer.
use std::{collections::HashMap, sync::Mutex};

use serde_json::Value;

/// Pages remembered at most (the oldest forgotten past it: a page that never resolves).
const MAX_PAGES: usize = 4096;
/// Entries kept per page at most.
const MAX_ENTRIES: usize = 16;

/// An alert's key (`AlertChange::key`).
pub type Key = (u32, &'static str, &'static str);

/// Each page's entries, with the order it was first noted in (the oldest goes first).
type Pages = HashMap<Key, (u64, Vec<Value>)>;

/// The actions of each firing page, by its alert's key.
#[derive(Default)]
pub struct Ledger {
    pages: Mutex<(u64, Pages)>,
}

impl Ledger {
    /// Notes one action (or planned action) of a page.
    pub fn note(&self, key: Key, entry: Value) {
        let mut g = self
            .pages
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (next, pages) = &mut *g;
        *next += 1;
        if pages.len() >= MAX_PAGES && !pages.contains_key(&key) {
            if let Some(oldest) = pages.iter().min_by_key(|(_, (n, _))| *n).map(|(k, _)| *k) {
                pages.remove(&oldest);
            }
        }
        let (_, entries) = pages.entry(key).or_insert((*next, Vec::new()));
        if entries.len() < MAX_ENTRIES {
            entries.push(entry);
        }
    }

    /// What was noted for a page (the archive's record when it resolves).
    pub fn of(&self, key: &Key) -> Vec<Value> {
        let g = self
            .pages
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        g.1.get(key).map(|(_, e)| e.clone()).unwrap_or_default()
    }

    /// Forgets a page (its undo was done: every sink has read it by then).
    pub fn forget(&self, key: &Key) {
        let mut g = self
            .pages
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        g.1.remove(key);
    }

    /// A page's actions in words, for the alert's `mitigation` annotation: `capped WORKLOAD
    /// (pid N): OUTCOME`, `;`-separated; none when nothing was noted.
    pub fn annotation(&self, key: &Key) -> Option<String> {
        let said: Vec<String> = self.of(key).iter().map(|a| describe(a, true)).collect();
        (!said.is_empty()).then(|| crate::text::printable(&said.join("; ")).into_owned())
    }
}

/// One noted action in words (not escaped): `capped WORKLOAD (pid N)` (`would cap` in a dry
/// run, `could not cap` when refused), and `: OUTCOME` when `outcome` and there is one.
pub fn describe(a: &Value, outcome: bool) -> String {
    let verb = match (a["dry_run"].as_bool(), a["done"].as_bool()) {
        (Some(true), _) => "would cap",
        (_, Some(true)) => "capped",
        _ => "could not cap",
    };
    format!(
        "{verb} {} (pid {}){}",
        a["workload"].as_str().unwrap_or("?"),
        a["pid"].as_u64().unwrap_or(0),
        a["outcome"]
            .as_str()
            .filter(|_| outcome)
            .map(|o| format!(": {o}"))
            .unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_page_keeps_its_entries_until_forgotten_and_the_ledger_is_bounded() {
        let l = Ledger::default();
        let k: Key = (7, "wait_per_launch", "CudatraceComputeContention");
        assert_eq!(l.annotation(&k), None);
        let act = json!({"event": "act", "workload": "batch/trainer", "pid": 20, "dry_run": false, "done": true, "outcome": "capped /sys/fs/cgroup/batch"});
        l.note(k, act.clone());
        assert_eq!(l.of(&k), vec![act]);
        assert_eq!(
            l.annotation(&k).as_deref(),
            Some("capped batch/trainer (pid 20): capped /sys/fs/cgroup/batch")
        );
        l.forget(&k);
        assert_eq!(l.of(&k), Vec::<Value>::new());
        for i in 0..20 {
            l.note(k, json!(i));
        }
        assert_eq!(l.of(&k).len(), MAX_ENTRIES);
        for pid in 0..(MAX_PAGES as u32 + 10) {
            l.note((pid, "s", "a"), json!(pid));
        }
        assert_eq!(l.pages.lock().unwrap().1.len(), MAX_PAGES);
        // The oldest went first.
        assert!(l.of(&(0, "s", "a")).is_empty());
        assert_eq!(
            l.of(&(MAX_PAGES as u32 + 9, "s", "a")),
            vec![json!(MAX_PAGES + 9)]
        );
    }
}
