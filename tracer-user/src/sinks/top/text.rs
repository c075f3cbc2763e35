//! `top`'s plain-text screen: what `top -b` prints per snapshot, for scripts and bug reports
//! (one header line, a line per GPU, a column header, a row per process).
use std::fmt::Write as _;

use super::{Row, View};
use crate::text::printable;

/// The column header; every row's fields line up under it, whitespace-separated, `-` when
/// unknown.
pub const HEADER: &str = "    PID COMM            POD              GPU  LAUNCH/S  P50_US  P99_US WAIT/L_MS  xBASE  COPY_MB/S  MEM_MIB  GPU%  ALERT";

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.digits$}"))
}

/// One field: control characters made visible, spaces replaced (a tenant's name must not
/// shift the columns), cut to `width`, `-` when empty.
fn field(s: &str, width: usize) -> String {
    let s: String = printable(s)
        .chars()
        .map(|c| if c.is_whitespace() { '_' } else { c })
        .take(width)
        .collect();
    if s.is_empty() {
        "-".into()
    } else {
        s
    }
}

/// A process's line.
pub fn row(r: &Row) -> String {
    let gpus = if r.gpus.is_empty() {
        "-".into()
    } else {
        r.gpus
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(",")
    };
    let alert = match &r.alert {
        Some((state, cause, who)) => format!(
            "{}:{cause}{}",
            state.as_str(),
            if who.is_empty() {
                String::new()
            } else {
                format!(" by {}", printable(who))
            }
        ),
        None => "-".into(),
    };
    format!(
        "{:>7} {:<15} {:<16} {:<4} {:>9.1} {:>7} {:>7} {:>9} {:>6} {:>10.2} {:>8.1} {:>5.1}  {alert}",
        r.pid,
        field(&r.comm, 15),
        field(&r.pod, 16),
        field(&gpus, 4),
        r.launches_per_s,
        opt(r.launch_p50_p99.map(|q| q.0 * 1e6), 1),
        opt(r.launch_p50_p99.map(|q| q.1 * 1e6), 1),
        opt(r.wait_per_launch.map(|w| w.0 * 1e3), 3),
        opt(r.wait_per_launch.map(|w| w.1), 2),
        r.copy_bytes_per_s / 1e6,
        r.memory_bytes as f64 / 1_048_576.0,
        r.gpu_share * 100.0,
    )
}

/// The whole screen; `clock` is the wall time to show (HH:MM:SS).
pub fn screen(v: &View, clock: &str) -> String {
    let mut out = format!(
        "cudatrace top - {clock}  processes: {}  records: {}  dropped: {}\n",
        v.rows.len(),
        v.events,
        v.dropped
    );
    if v.nvml_off {
        out += "NVML not available: no GPU lines (per-process figures are from the driver calls)\n";
    }
    for g in &v.gpus {
        let gib = |b: Option<u64>| opt(b.map(|b| b as f64 / 1_073_741_824.0), 1);
        let _ = writeln!(
            out,
            "GPU {}  util {}%  mem {}/{} GiB  {} C  {} W  throttle: {}",
            g.index,
            g.util.map_or_else(|| "-".into(), |u| u.to_string()),
            gib(g.memory.0),
            gib(g.memory.1),
            g.temperature.map_or_else(|| "-".into(), |t| t.to_string()),
            opt(g.power_w, 1),
            if g.throttle.is_empty() {
                "none".into()
            } else {
                g.throttle.join(",")
            }
        );
    }
    out += HEADER;
    out.push('\n');
    for r in &v.rows {
        out += &row(r);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alert::AlertState;

    #[test]
    fn rows_line_up_and_hostile_names_do_not_shift_them() {
        let r = Row {
            pid: 4242,
            comm: "model server".into(),
            pod: String::new(),
            gpus: vec![0, 1],
            launches_per_s: 1234.5,
            launch_p50_p99: Some((2.1e-6, 5.3e-6)),
            wait_per_launch: Some((1.2e-4, 8.5)),
            copy_bytes_per_s: 2.5e6,
            memory_bytes: 2 << 20,
            gpu_share: 0.4,
            alert: Some((
                AlertState::Firing,
                "compute_contention",
                "trainer (pid 4313)".into(),
            )),
        };
        let line = row(&r);
        let fields: Vec<&str> = line.split_whitespace().collect();
        let names: Vec<&str> = HEADER.split_whitespace().collect();
        assert_eq!(
            &fields[..12],
            [
                "4242",
                "model_server",
                "-",
                "0,1",
                "1234.5",
                "2.1",
                "5.3",
                "0.120",
                "8.50",
                "2.50",
                "2.0",
                "40.0"
            ]
        );
        assert_eq!(names.len(), 13);
        assert_eq!(
            &fields[12..],
            [
                "firing:compute_contention",
                "by",
                "trainer",
                "(pid",
                "4313)"
            ]
        );
        // A terminal escape is shown, not obeyed.
        assert_eq!(field("a\x1b[2J", 15), "a\\u{1b}[2J");
        let empty = Row {
            launch_p50_p99: None,
            wait_per_launch: None,
            alert: None,
            gpus: vec![],
            ..r
        };
        assert_eq!(row(&empty).split_whitespace().count(), 13);
    }
}
