//! The incident archive: every alert that resolves is appended to a JSON-lines file (`[alerts]
//! archive`) with its cause, aggressors, evidence, start, end, duration and its root cause in
//! words; past `archive_max_mib` the file is rotated to `PATH.1`. Both files are opened once, at
//! start, while cudatrace may still be uid 0: created 0600, never through a symlink, never a FIFO
//! or a device, and rotated through those descriptors (copied, then truncated), so that neither
//! the process after it leaves uid 0 nor a tenant's symlink decides what is written where.
//! `cudatrace incidents` reads
//! both back, bounded: lines past [`MAX_LINE`] bytes and lines that are not incidents are
//! skipped and counted.
use std::{
    collections::VecDeque,
    fs::File,
    io::{self, BufRead, BufReader, Read as _, Seek as _, SeekFrom, Write as _},
    path::{Path, PathBuf},
    sync::Mutex,
    time::SystemTime,
};

use serde_json::{json, Value};

use super::files::{open_private, How};
use crate::alert::{AlertChange, AlertState, Cause};

/// Longest archive line read back (an incident is well under 4 KiB).
pub const MAX_LINE: u64 = 64 * 1024;

/// The archive, open, and its size bound.
pub struct Archive {
    max_bytes: u64,
    files: Mutex<Files>,
    ledger: Option<std::sync::Arc<super::mitigate::ledger::Ledger>>,
}

/// The archive and the file it is rotated to, open for the daemon's life.
struct Files {
    /// `PATH`, appended to.
    current: File,
    /// `PATH.1`, rewritten at each rotation.
    rotated: File,
}

/// What a signal is called in words.
fn signal_words(signal: &str) -> &str {
    match signal {
        "wait_per_launch" => "wait per launch",
        "launch_latency_p99" => "launch latency p99",
        "copy_time_per_mib" => "copy time per MiB",
        other => other,
    }
}

/// The root cause of an alert in words, as an SRE would say it: "trainer (pid 4313) took 92% of
/// GPU 0; model-server's wait per launch 8.5x its p99".
pub fn root_cause(c: &AlertChange) -> String {
    let victim = format!(
        "{}'s {} {:.1}x its p99",
        c.victim.comm,
        signal_words(c.evidence.signal),
        c.evidence.ratio
    );
    let gpu = &c.gpu;
    let share = |p: &crate::alert::Party| p.share.unwrap_or(0.0) * 100.0;
    let by = match (c.cause, c.aggressors.first()) {
        (Cause::ComputeContention, Some(a)) => format!(
            "{} (pid {}) took {:.0}% of GPU {gpu}",
            a.comm,
            a.pid,
            share(a)
        ),
        (Cause::CopyContention, Some(a)) => format!(
            "{} (pid {}) moved {:.0}% of the bytes copied on GPU {gpu}",
            a.comm,
            a.pid,
            share(a)
        ),
        (Cause::MemoryPressure, Some(a)) => format!(
            "GPU {gpu}'s memory nearly full, {} (pid {}) holding {:.0}% of it",
            a.comm,
            a.pid,
            share(a)
        ),
        (Cause::MemoryPressure, None) => format!("GPU {gpu}'s memory nearly full"),
        (Cause::Throttling, _) => {
            let why = if c.evidence.clock_event_reasons.is_empty() {
                "clock events".into()
            } else {
                c.evidence.clock_event_reasons.join(", ")
            };
            format!("GPU {gpu} throttled ({why})")
        }
        (Cause::WorkloadChange, _) => {
            let w = c.evidence.victim_work.as_ref();
            match w.and_then(|w| w.kernel.clone().zip(w.grid)) {
                Some((k, (b, n))) => format!(
                    "its own work grew: {k} grid {}x{}x{} → {}x{}x{}, nobody else changed",
                    b[0], b[1], b[2], n[0], n[1], n[2]
                ),
                None => "its own work grew, nobody else changed".into(),
            }
        }
        (Cause::CpuContention, Some(a)) => format!(
            "its threads waited for a CPU; {} (pid {}) used more CPU",
            a.comm, a.pid
        ),
        (Cause::CpuContention, None) => "its threads waited for a CPU".into(),
        (Cause::UntracedContention, Some(a)) => {
            format!("{} (pid {}), untraced, busier on GPU {gpu}", a.comm, a.pid)
        }
        (Cause::UntracedContention, None) => format!("untraced work on GPU {gpu}"),
        (Cause::CpuOrDriverContention, _) => {
            format!("launches slower while GPU {gpu} was idle (host CPU or driver)")
        }
        (_, _) => "no cause seen".into(),
    };
    let more = c.aggressors.len().saturating_sub(1);
    let more = if more > 0 && matches!(c.cause, Cause::ComputeContention | Cause::CopyContention) {
        format!(" (and {more} more)")
    } else {
        String::new()
    };
    format!("{by}{more}; {victim}")
}

/// Seconds between two RFC 3339 times (0 when either does not parse or the end is earlier).
fn seconds_between(start: &str, end: &str) -> f64 {
    match (
        humantime::parse_rfc3339(start),
        humantime::parse_rfc3339(end),
    ) {
        (Ok(a), Ok(b)) => b.duration_since(a).map_or(0.0, |d| d.as_secs_f64()),
        _ => 0.0,
    }
}

impl Archive {
    /// Opens the archive at `path` (made if missing) and `PATH.1`, rotated past `max_bytes`;
    /// an error before anything is traced when either cannot be written.
    pub fn open(path: &Path, max_bytes: u64) -> io::Result<Archive> {
        let files = Files {
            current: open_private(path, How::Append)?,
            rotated: open_private(&rotated(path), How::Write)?,
        };
        Ok(Archive {
            max_bytes,
            files: Mutex::new(files),
            ledger: None,
        })
    }

    /// Writes what `[mitigate]` did for each incident (noted in `ledger`) into its record.
    pub fn with_ledger(
        mut self,
        ledger: std::sync::Arc<super::mitigate::ledger::Ledger>,
    ) -> Archive {
        self.ledger = Some(ledger);
        self
    }

    /// Appends the resolved ones of `changes`; rotates first when the file would outgrow its
    /// bound.
    pub fn record(&self, changes: &[AlertChange]) -> io::Result<()> {
        for c in changes.iter().filter(|c| c.state == AlertState::Resolved) {
            let mut v = serde_json::to_value(c).map_err(io::Error::other)?;
            if let Value::Object(m) = &mut v {
                m.remove("state");
                m.remove("at");
                m.insert("ended_at".into(), json!(c.at));
                m.insert(
                    "duration_s".into(),
                    json!(seconds_between(&c.started_at, &c.at)),
                );
                m.insert("root_cause".into(), json!(root_cause(c)));
                let acted = self.ledger.as_ref().map(|l| l.of(&c.key()));
                if let Some(acted) = acted.filter(|a| !a.is_empty()) {
                    let undo = super::mitigate::ledger::undo_entries(&acted, &c.at);
                    m.insert(
                        "mitigation".into(),
                        Value::Array(acted.into_iter().chain(undo).collect()),
                    );
                }
            }
            let mut line = serde_json::to_string(&v).map_err(io::Error::other)?;
            line.push('\n');
            let mut files = self.files.lock().unwrap_or_else(|e| e.into_inner());
            let size = files.current.metadata()?.len();
            if size > 0 && size + line.len() as u64 > self.max_bytes {
                files.rotate()?;
            }
            files.current.write_all(line.as_bytes())?;
        }
        Ok(())
    }
}

impl Files {
    /// `PATH` becomes `PATH.1` (what `PATH.1` held goes), and `PATH` starts empty: copied and
    /// truncated through the descriptors opened at start.
    fn rotate(&mut self) -> io::Result<()> {
        self.rotated.set_len(0)?;
        self.rotated.seek(SeekFrom::Start(0))?;
        self.current.seek(SeekFrom::Start(0))?;
        io::copy(&mut (&self.current), &mut self.rotated)?;
        self.rotated.flush()?;
        // Appends go to the end, which is now 0.
        self.current.set_len(0)
    }
}

/// Where a full archive goes.
pub fn rotated(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".1");
    PathBuf::from(p)
}

/// Incidents read back at most: the newest this many (a window of lines, kept as the text they
/// are, so that memory stays bounded whatever the archive's size: at most [`MAX_INCIDENTS`]
/// lines of at most [`MAX_LINE`] bytes, a few MiB for real incidents).
pub const MAX_INCIDENTS: usize = 10_000;

/// Incidents read back from an archive and its rotated file, and how many lines were skipped.
pub struct Read {
    /// Each incident's line, oldest first: the newest [`MAX_INCIDENTS`] of those asked for.
    pub lines: VecDeque<Vec<u8>>,
    /// Lines that were too long or not incidents.
    pub skipped: u64,
    /// Incidents asked for but older than the window kept.
    pub left_out: u64,
}

/// Reads `path.1` (when present) and `path`, oldest first, keeping the newest
/// [`MAX_INCIDENTS`] incidents that ended at or after `since` (a line is parsed, checked and
/// dropped or kept as it is read: nothing else is held). Only the files' lines are trusted to
/// be bounded by [`MAX_LINE`]: longer ones are skipped unread.
pub fn read(path: &Path, since: Option<SystemTime>) -> io::Result<Read> {
    let mut out = Read {
        lines: VecDeque::new(),
        skipped: 0,
        left_out: 0,
    };
    let old = rotated(path);
    let mut found = false;
    for p in [old.as_path(), path] {
        let file = match File::open(p) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        found = true;
        let mut reader = BufReader::new(file);
        let mut line = Vec::new();
        loop {
            line.clear();
            let n = reader
                .by_ref()
                .take(MAX_LINE + 1)
                .read_until(b'\n', &mut line)?;
            if n == 0 {
                break;
            }
            if line.last() != Some(&b'\n') && n as u64 > MAX_LINE {
                // Too long: skip to the end of this line, in bounded steps.
                out.skipped += 1;
                let mut rest = Vec::new();
                while reader
                    .by_ref()
                    .take(MAX_LINE)
                    .read_until(b'\n', &mut rest)?
                    > 0
                    && rest.last() != Some(&b'\n')
                {
                    rest.clear();
                }
                continue;
            }
            match serde_json::from_slice::<Value>(&line) {
                Ok(v)
                    if v["alert"].is_string()
                        && v["ended_at"].is_string()
                        && v["victim"].is_object() =>
                {
                    if since.is_some_and(|t| !ended_since(&v, t)) {
                        continue;
                    }
                    if out.lines.len() == MAX_INCIDENTS {
                        out.lines.pop_front();
                        out.left_out += 1;
                    }
                    out.lines.push_back(std::mem::take(&mut line));
                }
                _ if line.iter().all(u8::is_ascii_whitespace) => {}
                _ => out.skipped += 1,
            }
        }
    }
    if !found {
        return Err(io::Error::new(io::ErrorKind::NotFound, "no archive yet"));
    }
    Ok(out)
}

impl Read {
    /// The incidents, newest first, each parsed as it is taken.
    pub fn newest_first(&self) -> impl Iterator<Item = Value> + '_ {
        self.lines
            .iter()
            .rev()
            .filter_map(|l| serde_json::from_slice(l).ok())
    }

    /// How many incidents were read (within the window).
    pub fn len(&self) -> usize {
        self.lines.len()
    }

    /// Whether none was.
    pub fn is_empty(&self) -> bool {
        self.lines.is_empty()
    }
}

/// Whether an incident ended at or after `since`.
pub fn ended_since(v: &Value, since: SystemTime) -> bool {
    v["ended_at"]
        .as_str()
        .and_then(|t| humantime::parse_rfc3339(t).ok())
        .is_some_and(|t| t >= since)
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;
    use crate::{alert::tests::record, event::monotonic_ns};

    fn temp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "cudatrace-archive-{name}-{}-{}",
            std::process::id(),
            monotonic_ns()
        ));
        fs::create_dir_all(&dir).unwrap();
        dir.join("incidents.jsonl")
    }

    #[test]
    fn resolved_alerts_are_archived_with_their_root_cause_and_rotated() {
        let path = temp("rotate");
        Archive::open(&path, u64::MAX)
            .unwrap()
            .record(&[record(AlertState::Firing), record(AlertState::Resolved)])
            .unwrap();
        let line = fs::metadata(&path).unwrap().len();
        // Room for two lines: the fourth incident rotates the file.
        let a = Archive::open(&path, 2 * line + 10).unwrap();
        for _ in 0..3 {
            a.record(&[record(AlertState::Resolved)]).unwrap();
        }
        let back = read(&path, None).unwrap();
        assert_eq!(
            (back.len(), back.skipped),
            (4, 0),
            "only resolved alerts; none lost to the rotation"
        );
        assert_eq!(
            (
                fs::metadata(rotated(&path)).unwrap().len(),
                fs::metadata(&path).unwrap().len()
            ),
            (2 * line, 2 * line)
        );
        let v = &back.newest_first().last().unwrap();
        assert_eq!(
            v["root_cause"],
            "trainer (pid 20) took 90% of GPU 0; server's wait per launch 3.6x its p99"
        );
        assert_eq!(v["duration_s"], 30.0);
        assert_eq!(v["ended_at"], "2027-01-15T08:00:30Z");
        assert!(v.get("state").is_none());
        let _ = fs::remove_dir_all(path.parent().unwrap());
    }

    #[test]
    fn an_incident_acted_on_is_archived_with_its_caps_and_their_undo() {
        let path = temp("mitigation");
        let ledger = std::sync::Arc::new(crate::sinks::mitigate::ledger::Ledger::default());
        let r = record(AlertState::Resolved);
        let act = serde_json::json!({"event": "act", "at": "2027-01-15T08:00:10Z", "workload": "batch/trainer", "pid": 20, "dry_run": false, "done": true, "outcome": "capped /sys/fs/cgroup/batch"});
        let refused = serde_json::json!({"event": "act", "workload": "batch/other", "pid": 21, "dry_run": false, "done": false, "outcome": "not capped: gone"});
        ledger.note(r.key(), act.clone());
        ledger.note(r.key(), refused.clone());
        Archive::open(&path, u64::MAX)
            .unwrap()
            .with_ledger(ledger)
            .record(&[r])
            .unwrap();
        let back = read(&path, None).unwrap();
        let v = back.newest_first().next().unwrap();
        // Only the cap taken is undone, when the incident ended.
        assert_eq!(
            v["mitigation"],
            serde_json::json!([act, refused, {"event": "undo", "at": "2027-01-15T08:00:30Z", "workload": "batch/trainer", "pid": 20, "dry_run": false}])
        );
        let _ = fs::remove_dir_all(path.parent().unwrap());
    }

    #[test]
    fn hostile_archive_lines_are_skipped_and_counted() {
        let path = temp("hostile");
        let mut text = "not json\n{\"alert\":1}\n\n".to_string();
        text += &"x".repeat(MAX_LINE as usize * 3);
        text += "\n";
        fs::write(&path, &text).unwrap();
        Archive::open(&path, 1 << 30)
            .unwrap()
            .record(&[record(AlertState::Resolved)])
            .unwrap();
        let back = read(&path, None).unwrap();
        assert_eq!((back.len(), back.skipped), (1, 3));
        assert!(read(&path.with_extension("missing"), None).is_err());
        let _ = fs::remove_dir_all(path.parent().unwrap());
    }

    #[test]
    fn files_are_private_and_never_a_symlink_or_a_fifo() {
        use std::os::unix::fs::PermissionsExt as _;
        let path = temp("private");
        let a = Archive::open(&path, 1 << 20).unwrap();
        a.record(&[record(AlertState::Resolved)]).unwrap();
        for p in [path.clone(), rotated(&path)] {
            assert_eq!(
                fs::metadata(&p).unwrap().permissions().mode() & 0o777,
                0o600
            );
        }
        let dir = path.parent().unwrap();
        let target = dir.join("target");
        fs::write(&target, "kept").unwrap();
        let link = dir.join("link.jsonl");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(
            Archive::open(&link, 1 << 20).is_err(),
            "a symlink is refused"
        );
        assert_eq!(fs::read_to_string(&target).unwrap(), "kept");
        let fifo = dir.join("fifo.jsonl");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo with a valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let started = std::time::Instant::now();
        assert!(Archive::open(&fifo, 1 << 20).is_err(), "a FIFO is refused");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(1),
            "without blocking"
        );
        let _ = fs::remove_dir_all(dir);
    }
}
