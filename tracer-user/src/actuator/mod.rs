//! The actuator: the small separate process that writes cgroups for `[mitigate]`, the only part
//! of cudatrace with that privilege (the tracer gave it up). It listens on a Unix socket, takes
//! one JSON request per line from cudatrace (its peer's uid checked), journals each cap before it
//! writes it, undoes it when asked, at its deadline, when cudatrace's connection ends (a cap is
//! never held by nobody), at its own stop, and at its next start when it was killed holding one.
pub mod cgroup;
pub mod client;
pub mod journal;
pub mod server;
pub mod target;

use serde::{Deserialize, Serialize};

/// A request line is read up to this many bytes.
pub const MAX_LINE: usize = 4096;
/// Caps held at once, at most.
pub const MAX_HOLDS: usize = 256;
/// Connections served at once, at most.
pub const MAX_CONNECTIONS: usize = 16;
/// Seconds a cap is held at most, whatever a request says.
pub const MAX_HOLD_S: u64 = 86_400;

/// One request, one JSON object per line.
#[derive(Clone, Debug, Deserialize, PartialEq, Serialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Cap the CPU of the cgroup that process `pid` is in.
    Cap {
        /// The verdict it answers: its undo names the same key.
        key: String,
        /// The aggressor.
        pid: u32,
        /// Its command name as the verdict read it (a reused pid with another name is refused).
        comm: String,
        /// Its start time as the verdict read it (`/proc/PID/stat` field 22, clock ticks since
        /// boot): a pid reused since, whatever its name, is refused.
        start_time: u64,
        /// `QUOTA PERIOD`, microseconds.
        cpu_max: String,
        /// Seconds to hold it at most.
        hold_s: u64,
    },
    /// Undo every cap this connection took for `key`.
    Undo {
        /// The verdict's key.
        key: String,
    },
}

/// The answer to one request.
#[derive(Clone, Debug, Deserialize, PartialEq, Serialize)]
pub struct Reply {
    /// Whether it was done.
    pub ok: bool,
    /// What was done, or why not.
    pub detail: String,
}
