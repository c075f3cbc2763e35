//! The columns of `top`'s process table: titles, widths, and what each sorts by.
use super::Row;

/// A column: its title, its width, whether narrow terminals keep it, and how rows sort by it.
pub struct Column {
    /// Its title.
    pub title: &'static str,
    /// Its width in cells.
    pub width: u16,
    /// Whether narrow terminals keep it.
    pub narrow: bool,
    /// What rows sort by.
    pub key: fn(&Row) -> f64,
}

/// Firing alerts first, then pending, then none.
pub fn alert_rank(r: &Row) -> f64 {
    match &r.alert {
        Some((crate::alert::AlertState::Firing, ..)) => 2.0,
        Some(_) => 1.0,
        None => 0.0,
    }
}

/// The process table's columns, left to right.
pub const COLUMNS: [Column; 12] = [
    Column {
        title: "PID",
        width: 7,
        narrow: true,
        key: |r| f64::from(r.pid),
    },
    Column {
        title: "COMM",
        width: 15,
        narrow: true,
        key: |_| 0.0,
    },
    Column {
        title: "POD",
        width: 16,
        narrow: false,
        key: |_| 0.0,
    },
    Column {
        title: "GPU",
        width: 4,
        narrow: false,
        key: |r| r.gpus.first().map_or(-1.0, |g| f64::from(*g)),
    },
    Column {
        title: "LAUNCH/S",
        width: 9,
        narrow: true,
        key: |r| r.launches_per_s,
    },
    Column {
        title: "P50_US",
        width: 7,
        narrow: true,
        key: |r| r.launch_p50_p99.map_or(-1.0, |q| q.0),
    },
    Column {
        title: "P99_US",
        width: 7,
        narrow: true,
        key: |r| r.launch_p50_p99.map_or(-1.0, |q| q.1),
    },
    Column {
        title: "WAIT/L_MS",
        width: 9,
        narrow: true,
        key: |r| r.wait_per_launch.map_or(-1.0, |w| w.0),
    },
    Column {
        title: "xBASE",
        width: 6,
        narrow: true,
        key: |r| r.wait_per_launch.map_or(-1.0, |w| w.1),
    },
    Column {
        title: "COPY_MB/S",
        width: 10,
        narrow: false,
        key: |r| r.copy_bytes_per_s,
    },
    Column {
        title: "MEM_MIB",
        width: 8,
        narrow: false,
        key: |r| r.memory_bytes as f64,
    },
    Column {
        title: "GPU%",
        width: 5,
        narrow: true,
        key: |r| r.gpu_share,
    },
];
