//! What `[mitigate]` did for each firing page, kept until a minute after the page resolved
//! (Alertmanager's task may post the resolved alert after the undo): the incident archive writes
//! it into the incident's record (`mitigation`), with the undo each cap gets at that moment, so
//! that the archive says which incidents were acted on, how, with what answer, and when undone.
use std::{collections::HashMap, sync::Mutex};

use serde_json::Value;

/// Pages remembered at most (the oldest forgotten past it: a page that never resolves).
const MAX_PAGES: usize = 4096;
/// Entries kept per page at most.
const MAX_ENTRIES: usize = 16;

/// An alert's key (`AlertChange::key`).
pub type Key = (u32, &'static str, &'static str);

/// Seconds a resolved page's entries are kept after its undo.
const KEEP_S: u64 = 60;

/// Each page's entries, with the order it was first noted in (the oldest goes first).
type Pages = HashMap<Key, (u64, Vec<Value>)>;

/// The actions of each firing page, by its alert's key.
#[derive(Default)]
pub struct Ledger {
    pages: Mutex<(u64, Pages)>,
    /// Pages undone, and when (to forget them [`KEEP_S`] later).
    undone: Mutex<Vec<(Key, std::time::Instant)>>,
}

/// The undo entries of a resolved page's `acted` entries: each cap taken or planned is undone
/// (asked of the actuator, or would be in a dry run) when the page resolves, at `at`; the
/// answer goes to the webhook and the log.
pub fn undo_entries(acted: &[Value], at: &str) -> Vec<Value> {
    acted
        .iter()
        .filter(|a| a["event"] == "act" && (a["done"] == true || a["dry_run"] == true))
        .map(|a| {
            serde_json::json!({"event": "undo", "at": at, "workload": a["workload"], "pid": a["pid"], "dry_run": a["dry_run"]})
        })
        .collect()
}

impl Ledger {
    /// Notes one action (or planned action) of a page.
    pub fn note(&self, key: Key, entry: Value) {
        // A new page of an alert undone less than a minute ago starts afresh.
        let again = {
            let mut undone = self
                .undone
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let before = undone.len();
            undone.retain(|(k, _)| *k != key);
            undone.len() != before
        };
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
        if again {
            pages.remove(&key);
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

    /// Forgets a page [`KEEP_S`] after its undo (every sink has read it by then), and the
    /// pages undone that long ago.
    pub fn forget(&self, key: &Key) {
        self.forget_at(key, std::time::Instant::now());
    }

    fn forget_at(&self, key: &Key, now: std::time::Instant) {
        let mut undone = self
            .undone
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        undone.push((*key, now));
        let due: Vec<Key> = undone
            .iter()
            .filter(|(_, t)| now.duration_since(*t).as_secs() >= KEEP_S)
            .map(|(k, _)| *k)
            .collect();
        undone.retain(|(_, t)| now.duration_since(*t).as_secs() < KEEP_S);
        // Bounded as the pages are.
        if undone.len() > MAX_PAGES {
            let over = undone.len() - MAX_PAGES;
            undone.drain(..over);
        }
        drop(undone);
        let mut g = self
            .pages
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for k in due {
            g.1.remove(&k);
        }
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
        // Kept a minute after its undo (for the resolved alert's post), then forgotten when
        // another page is undone.
        let t0 = std::time::Instant::now();
        l.forget_at(&k, t0);
        assert_eq!(l.of(&k).len(), 1);
        let other: Key = (8, "wait_per_launch", "CudatraceComputeContention");
        l.forget_at(&other, t0 + std::time::Duration::from_secs(KEEP_S));
        assert_eq!(l.of(&k), Vec::<Value>::new());
        // The same alert paging again within the minute starts afresh.
        l.note(other, json!("first page"));
        l.forget_at(&other, t0);
        l.note(other, json!("second page"));
        assert_eq!(l.of(&other), vec![json!("second page")]);
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
