//! What the eBPF programs say through aya-log (rare conditions only: orphan returns, replaced
//! entry state, argument reads that failed), shown on stderr as `cudatrace: ebpf LEVEL: ...` (through `crate::logging`, event `ebpf`).
//! A traced program can make those conditions happen at will, so at most [`LINES_PER_SECOND`]
//! lines a second are printed and the rest are counted in one line.
use std::{
    sync::Mutex,
    time::{Duration, Instant},
};

/// Lines printed per second at most.
pub const LINES_PER_SECOND: u32 = 20;

/// `--log-level`: the most detailed level the eBPF programs report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogLevel {
    /// Nothing.
    Off,
    /// Errors only.
    Error,
    /// Rare conditions worth knowing (the default).
    #[default]
    Warn,
    /// Informational.
    Info,
    /// Everything, process exits included.
    Debug,
}

impl LogLevel {
    /// The value of aya-log's `AYA_LOG_LEVEL` global (0 disables every level).
    pub fn aya(self) -> u8 {
        match self {
            LogLevel::Off => 0,
            LogLevel::Error => 1,
            LogLevel::Warn => 2,
            LogLevel::Info => 3,
            LogLevel::Debug => 4,
        }
    }

    /// The `log` crate's filter of the same level.
    pub fn filter(self) -> log::LevelFilter {
        match self {
            LogLevel::Off => log::LevelFilter::Off,
            LogLevel::Error => log::LevelFilter::Error,
            LogLevel::Warn => log::LevelFilter::Warn,
            LogLevel::Info => log::LevelFilter::Info,
            LogLevel::Debug => log::LevelFilter::Debug,
        }
    }
}

/// Lines printed in the current second, and lines held back since the last summary.
struct Budget {
    second: Instant,
    printed: u32,
    suppressed: u64,
}

/// Prints the programs' records on stderr, bounded in rate.
pub struct StderrLog {
    level: log::LevelFilter,
    budget: Mutex<Budget>,
}

impl StderrLog {
    /// A logger showing records up to `level`.
    pub fn new(level: LogLevel) -> StderrLog {
        StderrLog {
            level: level.filter(),
            budget: Mutex::new(Budget {
                second: Instant::now(),
                printed: 0,
                suppressed: 0,
            }),
        }
    }
}

impl log::Log for StderrLog {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= self.level
    }

    fn log(&self, record: &log::Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let mut b = self.budget.lock().unwrap_or_else(|e| e.into_inner());
        if b.second.elapsed() >= Duration::from_secs(1) {
            if b.suppressed > 0 {
                log::warn!(
                    target: "cudatrace::ebpf",
                    held_back = b.suppressed;
                    "cudatrace: ebpf: {} more lines held back (at most {LINES_PER_SECOND} a second)",
                    b.suppressed
                );
            }
            *b = Budget {
                second: Instant::now(),
                printed: 0,
                suppressed: 0,
            };
        }
        if b.printed >= LINES_PER_SECOND {
            b.suppressed += 1;
            return;
        }
        b.printed += 1;
        let level = record.level().as_str().to_ascii_lowercase();
        // Shown at warn whatever the program's level: `--log-level` chose what reaches here.
        log::warn!(
            target: "cudatrace::ebpf",
            ebpf_level = level.as_str();
            "cudatrace: ebpf {level}: {}",
            record.args()
        );
    }

    fn flush(&self) {}
}

#[cfg(test)]
mod tests {
    use log::Log as _;

    use super::*;

    #[test]
    fn levels_filter_and_map_to_aya() {
        let log = StderrLog::new(LogLevel::Warn);
        let warn = log::Metadata::builder().level(log::Level::Warn).build();
        let debug = log::Metadata::builder().level(log::Level::Debug).build();
        assert!(log.enabled(&warn) && !log.enabled(&debug));
        assert!(StderrLog::new(LogLevel::Debug).enabled(&debug));
        assert_eq!(
            (
                LogLevel::Off.aya(),
                LogLevel::Warn.aya(),
                LogLevel::Debug.aya()
            ),
            (0, 2, 4)
        );
    }

    #[test]
    fn a_flood_is_cut_to_the_budget() {
        let log = StderrLog::new(LogLevel::Warn);
        for _ in 0..1000 {
            log.log(
                &log::Record::builder()
                    .level(log::Level::Warn)
                    .args(format_args!("x"))
                    .build(),
            );
        }
        let b = log.budget.lock().unwrap();
        assert_eq!(
            (b.printed, b.suppressed),
            (LINES_PER_SECOND, 1000 - u64::from(LINES_PER_SECOND))
        );
    }
}
