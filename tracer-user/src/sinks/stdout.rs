//! Stdout: events as one JSON object a line or a table for people (`trace`), and alert changes
//! as JSON lines (`run`).
use std::io::{self, BufWriter, Stdout, Write};

use serde::Serialize;

use crate::{
    alert::AlertChange, enrich::gputime::BatchEstimate, enrich::kernels::KernelName, event::Detail,
    event::Event, identity::Identity, text::printable,
};

/// An event with what the tracer learned about it, as one JSON line.
#[derive(Serialize)]
struct JsonEvent<'a> {
    api: &'static str,
    kind: &'static str,
    pid: u32,
    tid: u32,
    comm: &'a str,
    start_ns: u64,
    duration_ns: u64,
    result: i32,
    #[serde(flatten)]
    detail: &'a Detail,
    #[serde(skip_serializing_if = "Option::is_none")]
    kernel: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    kernel_mangled: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    closed: Option<&'a BatchEstimate>,
    #[serde(skip_serializing_if = "Option::is_none")]
    process: Option<&'a Identity>,
    /// CUDA's ordinal of the device the call went to, when its context is known.
    #[serde(skip_serializing_if = "Option::is_none")]
    cuda_device: Option<i32>,
    /// That device's UUID as the process read it, written as NVML writes it (`GPU-...`).
    #[serde(skip_serializing_if = "Option::is_none")]
    gpu_uuid: Option<GpuUuid<'a>>,
}

/// A UUID as `cuDeviceGetUuid` gives it, written as NVML and `nvidia-smi -L` write it.
struct GpuUuid<'a>(&'a str);

impl Serialize for GpuUuid<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&format_args!("GPU-{}", self.0))
    }
}

/// The device a call went to: CUDA's ordinal and, when the process read it, its UUID.
#[derive(Clone, Copy, Debug, Default)]
pub struct OnDevice<'a> {
    /// CUDA's ordinal in the process.
    pub ordinal: Option<i32>,
    /// The device's UUID.
    pub uuid: Option<&'a str>,
}

/// Buffered event printer; flushed after each batch read from the ring buffer.
pub struct Printer {
    json: bool,
    out: BufWriter<Stdout>,
    header: bool,
}

impl Printer {
    /// A printer of JSON lines (`json`) or of a table.
    pub fn new(json: bool) -> Self {
        Printer {
            json,
            out: BufWriter::with_capacity(1 << 16, io::stdout()),
            header: false,
        }
    }

    /// Prints one event.
    pub fn print(
        &mut self,
        ev: &Event,
        kernel: Option<&KernelName>,
        est: Option<&BatchEstimate>,
        process: Option<&Identity>,
        device: OnDevice<'_>,
    ) -> io::Result<()> {
        if self.json {
            let line = JsonEvent {
                api: ev.api.symbol(),
                kind: ev.api.info().kind.as_str(),
                pid: ev.pid,
                tid: ev.tid,
                comm: &ev.comm,
                start_ns: ev.start_ns,
                duration_ns: ev.duration_ns,
                result: ev.result,
                detail: &ev.detail,
                kernel: kernel.map(|k| &*k.demangled),
                kernel_mangled: kernel.map(|k| k.mangled.as_str()),
                closed: est,
                process,
                cuda_device: device.ordinal,
                gpu_uuid: device.uuid.map(GpuUuid),
            };
            serde_json::to_writer(&mut self.out, &line)?;
            return self.out.write_all(b"\n");
        }
        if !self.header {
            self.header = true;
            writeln!(
                self.out,
                "{:>16} {:>7} {:>7} {:<15} {:<28} {:>12} {:>4}  DETAIL",
                "START_NS", "PID", "TID", "COMM", "API", "DURATION_US", "RES"
            )?;
        }
        let detail = describe(&ev.detail, kernel, est);
        writeln!(
            self.out,
            "{:>16} {:>7} {:>7} {:<15} {:<28} {:>12.3} {:>4}  {}",
            ev.start_ns,
            ev.pid,
            ev.tid,
            printable(&ev.comm),
            ev.api.symbol(),
            ev.duration_ns as f64 / 1e3,
            ev.result,
            printable(&detail)
        )
    }

    /// Flushes what was printed.
    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

fn describe(d: &Detail, kernel: Option<&KernelName>, est: Option<&BatchEstimate>) -> String {
    let mut s = match d {
        Detail::Launch {
            function,
            grid,
            block,
            shared_mem_bytes,
            stream,
        } => {
            let name = kernel.map_or_else(|| format!("{function:#x}"), |k| k.demangled.to_string());
            format!(
                "{name} grid={}x{}x{} block={}x{}x{} smem={shared_mem_bytes} stream={stream:#x}",
                grid[0], grid[1], grid[2], block[0], block[1], block[2]
            )
        }
        Detail::Graph { graph_exec, stream } => format!("graph={graph_exec:#x} stream={stream:#x}"),
        Detail::Copy {
            bytes,
            direction,
            stream,
            ..
        } => match stream {
            Some(st) => format!("{direction} {bytes} bytes stream={st:#x}"),
            None => format!("{direction} {bytes} bytes"),
        },
        Detail::Sync { stream, event } | Detail::Poll { stream, event } => {
            let mut s = String::new();
            if let Some(st) = stream {
                s += &format!("stream={st:#x} ");
            }
            if let Some(e) = event {
                s += &format!("event={e:#x}");
            }
            s
        }
        Detail::Alloc { dptr, bytes, .. } => format!("{bytes} bytes at {dptr:#x}"),
        Detail::Free { dptr, .. } => format!("{dptr:#x}"),
        Detail::Record { event, stream } => format!("event={event:#x} stream={stream:#x}"),
        Detail::Capture { stream, graph: 0 } => format!("stream={stream:#x}"),
        Detail::Capture { stream, graph } => format!("stream={stream:#x} graph={graph:#x}"),
        Detail::GraphBuild { graph_exec, graph } => {
            format!("graph={graph:#x} -> exec={graph_exec:#x}")
        }
        Detail::Resolve { symbol, address } => {
            format!("{} -> {address:#x}", symbol.as_deref().unwrap_or("?"))
        }
        Detail::Lookup { handle, name, .. } => match kernel.or(None) {
            Some(k) => format!("{} -> {handle:#x}", k.demangled),
            None => format!("{} -> {handle:#x}", name.as_deref().unwrap_or("?")),
        },
        Detail::Context(c) => c.text(),
    };
    if let Some(e) = est {
        s += &format!(
            " (closed: {} launches, batch span {} us)",
            e.launches,
            e.span_ns / 1000
        );
    }
    s
}

/// Writes alert changes as JSON lines on stdout. A closed stdout loses the lines, not the
/// alerts: the sinks and metrics go on.
pub fn print_changes(changes: &[AlertChange]) {
    if changes.is_empty() {
        return;
    }
    let mut out = io::stdout().lock();
    for change in changes {
        if let Ok(line) = serde_json::to_string(change) {
            let _ = writeln!(out, "{line}");
        }
    }
    let _ = out.flush();
}
