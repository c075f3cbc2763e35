//! `cudatrace record`'s output: a timeline in the Trace Event format (JSON, optionally gzip),
//! which ui.perfetto.dev and chrome://tracing open. A track per process and thread with every
//! traced call as a complete slice (the kernel's name for launches), a batch-span track
//! per stream with each closed batch (and one for waits on every stream), counter tracks for NVML utilization and memory, and
//! instant events for alert state changes. Events are written as they come (memory stays flat);
//! past `max_events` they are counted, not written, and the file says so at its end.
use std::{
    collections::{HashMap, HashSet},
    io::{self, BufWriter, Write},
    path::{Path, PathBuf},
};

use flate2::{write::GzEncoder, Compression};
use serde_json::{json, Value};

use super::files::{give, open_private, How};
use crate::{
    alert::AlertChange, enrich::gputime::BatchEstimate, enrich::Enrichment, event::Detail,
    event::Event, nvml::GpuSample,
};

/// First track id of a process's streams' batch spans: synthetic tids above any real one
/// (pid_max is at most 2^22), within 32 bits for the viewers. The first is for context-wide
/// waits (and synchronous copies), then one per stream in order of appearance.
const ESTIMATE_TID: u64 = 2_000_000_000;
/// Stream tracks per process at most; waits on further streams share the context-wide track.
const MAX_STREAM_TRACKS: u64 = 1024;
/// Pseudo-process of the NVML counters.
const GPU_PID: u64 = 0;

/// Nanoseconds (CLOCK_MONOTONIC) as the format's microseconds.
fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

/// A timeline being written.
pub struct Timeline {
    path: PathBuf,
    out: Box<dyn Write>,
    /// Events written, metadata aside.
    written: u64,
    /// Events left out past `max_events`.
    left_out: u64,
    max_events: Option<u64>,
    /// Processes and threads named so far.
    named: HashSet<(u64, u64)>,
    /// End of the last slice on each estimate track (pid, tid), ns.
    estimate_end: HashMap<(u32, u64), u64>,
    /// Each process's stream tracks: (pid, stream) to tid, and the count per process.
    stream_tids: HashMap<(u32, u64), u64>,
    stream_count: HashMap<u32, u64>,
    first: bool,
}

impl Timeline {
    /// Creates `path` (gzip when it ends in `.gz`) and writes the format's opening.
    /// The file is opened as `sinks::files` opens every file cudatrace writes, and handed to
    /// `owner` (the person behind sudo) when given.
    pub fn create(
        path: &Path,
        max_events: Option<u64>,
        owner: Option<(u32, u32)>,
    ) -> io::Result<Timeline> {
        let file = open_private(path, How::Truncate)?;
        if let Some(owner) = owner {
            give(&file, owner)?;
        }
        let file = BufWriter::new(file);
        let mut out: Box<dyn Write> = if path.extension().is_some_and(|e| e == "gz") {
            Box::new(GzEncoder::new(file, Compression::fast()))
        } else {
            Box::new(file)
        };
        out.write_all(b"{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n")?;
        let mut t = Timeline {
            path: path.to_owned(),
            out,
            written: 0,
            left_out: 0,
            max_events,
            named: HashSet::new(),
            estimate_end: HashMap::new(),
            stream_tids: HashMap::new(),
            stream_count: HashMap::new(),
            first: true,
        };
        t.raw(&json!({"ph": "M", "name": "process_name", "pid": GPU_PID, "args": {"name": "GPUs (NVML)"}}))?;
        Ok(t)
    }

    fn raw(&mut self, ev: &Value) -> io::Result<()> {
        if !std::mem::replace(&mut self.first, false) {
            self.out.write_all(b",\n")?;
        }
        serde_json::to_writer(&mut self.out, ev).map_err(io::Error::other)
    }

    /// Writes one event, or counts it past `max_events`.
    fn event(&mut self, ev: &Value) -> io::Result<()> {
        if self.max_events.is_some_and(|m| self.written >= m) {
            self.left_out += 1;
            return Ok(());
        }
        self.written += 1;
        self.raw(ev)
    }

    /// Names a process's track, and a thread's or another track of it, once.
    fn name(&mut self, pid: u64, tid: Option<(u64, String)>, process: &str) -> io::Result<()> {
        if self.named.insert((pid, u64::MAX)) {
            self.raw(&json!({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": format!("{process} (pid {pid})")}}))?;
        }
        if let Some((tid, name)) = tid {
            if self.named.insert((pid, tid)) {
                self.raw(&json!({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}}))?;
            }
        }
        Ok(())
    }

    /// One traced call: a slice on its thread's track; a wait that closed batches adds a slice
    /// on its stream's estimate track.
    pub fn call(&mut self, ev: &Event, e: &Enrichment) -> io::Result<()> {
        let (kernel, batch) = (e.kernel.as_deref(), e.batch.as_ref());
        let (pid, tid) = (u64::from(ev.pid), u64::from(ev.tid));
        self.name(
            pid,
            Some((tid, format!("{} thread {tid}", &*ev.comm))),
            &ev.comm,
        )?;
        let info = ev.api.info();
        let name = match (&ev.detail, kernel) {
            (Detail::Launch { .. }, Some(k)) => k.demangled.to_string(),
            _ => info.symbol.to_owned(),
        };
        let mut args = serde_json::to_value(&ev.detail).unwrap_or(Value::Null);
        if let Value::Object(map) = &mut args {
            map.insert("api".into(), json!(info.symbol));
            map.insert("result".into(), json!(ev.result));
            // Recorded into a graph: ran nothing now. A graph launch: the kernels it ran.
            if e.captured {
                map.insert("captured".into(), json!(true));
            }
            if let Some(nodes) = &e.graph_runs {
                map.insert("kernel_runs".into(), json!(nodes.len()));
            }
        }
        self.event(&json!({
            "ph": "X", "name": name, "cat": info.kind.as_str(), "pid": pid, "tid": tid,
            "ts": us(ev.start_ns), "dur": us(ev.duration_ns), "args": args,
        }))?;
        if let Some(b) = batch.filter(|b| b.launches > 0 || b.span_ns > 0) {
            self.batch(ev, b)?;
        }
        Ok(())
    }

    /// The track of a wait's stream (the context-wide one for waits on every stream).
    fn stream_track(&mut self, pid: u32, stream: Option<u64>) -> (u64, String) {
        let Some(s) = stream else {
            return (ESTIMATE_TID, "batch span: every stream".into());
        };
        if let Some(tid) = self.stream_tids.get(&(pid, s)) {
            return (*tid, format!("batch span: stream {s:#x}"));
        }
        let n = self.stream_count.entry(pid).or_default();
        if *n >= MAX_STREAM_TRACKS {
            return (ESTIMATE_TID, "batch span: every stream".into());
        }
        *n += 1;
        let tid = ESTIMATE_TID + *n;
        self.stream_tids.insert((pid, s), tid);
        (tid, format!("batch span: stream {s:#x}"))
    }

    /// A closed batch as a slice on its stream's track, from its first launch to the wait's
    /// return (clamped so that slices on one track never overlap: a context-wide wait sums its
    /// streams' estimates, which may reach back past the previous batch's end).
    fn batch(&mut self, ev: &Event, b: &BatchEstimate) -> io::Result<()> {
        let stream = match ev.detail {
            Detail::Sync {
                stream: Some(s), ..
            }
            | Detail::Poll {
                stream: Some(s), ..
            } => Some(s),
            _ => None,
        };
        let (tid, track) = self.stream_track(ev.pid, stream);
        let pid = u64::from(ev.pid);
        let end = ev.start_ns.saturating_add(ev.duration_ns);
        let prev = self.estimate_end.get(&(ev.pid, tid)).copied().unwrap_or(0);
        let start = end.saturating_sub(b.span_ns).max(prev).min(end);
        self.estimate_end.insert((ev.pid, tid), end);
        self.name(pid, Some((tid, track)), &ev.comm)?;
        self.event(&json!({
            "ph": "X", "name": format!("batch of {} launches", b.launches), "cat": "batch_span", "pid": pid, "tid": tid,
            "ts": us(start), "dur": us(end - start),
            "args": {"launches": b.launches, "batch_span_ns": b.span_ns, "closed_by": ev.api.info().symbol},
        }))
    }

    /// NVML samples taken at `now_ns`: utilization and memory counters per GPU.
    pub fn gpus(&mut self, gpus: &[GpuSample], now_ns: u64) -> io::Result<()> {
        for g in gpus {
            let mut util = serde_json::Map::new();
            if let Some(v) = g.sm_util {
                util.insert("sm".into(), json!(v));
            }
            if let Some(v) = g.mem_util {
                util.insert("memory".into(), json!(v));
            }
            if !util.is_empty() {
                self.event(&json!({"ph": "C", "name": format!("GPU {} utilization %", g.index), "pid": GPU_PID, "ts": us(now_ns), "args": util}))?;
            }
            if let Some(used) = g.memory_used {
                self.event(&json!({
                    "ph": "C", "name": format!("GPU {} memory used MiB", g.index), "pid": GPU_PID, "ts": us(now_ns),
                    "args": {"used": used / 1_048_576},
                }))?;
            }
        }
        Ok(())
    }

    /// An alert state change at `now_ns`, on its victim's process track.
    pub fn alert(&mut self, change: &AlertChange, now_ns: u64) -> io::Result<()> {
        let pid = u64::from(change.victim.pid);
        self.name(pid, None, &change.victim.comm)?;
        self.event(&json!({
            "ph": "i", "s": "p", "name": format!("{} {}", change.alert, change.state.as_str()), "cat": "alert",
            "pid": pid, "tid": pid, "ts": us(now_ns),
            "args": {"summary": change.summary(), "cause": change.cause.as_str(), "aggressors": change.aggressors_label(), "gpu": change.gpu},
        }))
    }

    /// Closes the file: when `max_events` cut it, an instant event and `otherData` say how many
    /// were left out. Returns (events written, events left out).
    pub fn finish(mut self, now_ns: u64) -> io::Result<(u64, u64)> {
        if self.left_out > 0 {
            let note = format!(
                "cut at --max-events {}: {} events left out",
                self.written, self.left_out
            );
            self.raw(&json!({"ph": "i", "s": "g", "name": note, "cat": "cudatrace", "pid": GPU_PID, "tid": 0, "ts": us(now_ns)}))?;
        }
        self.out.write_all(b"\n],\"otherData\":")?;
        let other = json!({"tool": "cudatrace record", "events": self.written, "events_left_out": self.left_out, "max_events": self.max_events});
        serde_json::to_writer(&mut self.out, &other).map_err(io::Error::other)?;
        self.out.write_all(b"}\n")?;
        self.out.flush()?;
        // A gzip stream needs its trailer, written when the encoder is dropped after flush.
        drop(self.out);
        Ok((self.written, self.left_out))
    }

    /// The file written.
    pub fn path(&self) -> &Path {
        &self.path
    }
}
