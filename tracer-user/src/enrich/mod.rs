//! Enrichment: what a call means beyond its record. Who the process is (identity), which kernel a
//! launch runs (kernel names), which device a call goes to (devices), device memory held, device time per stream, and what CUDA graphs run. Each
//! table is per process and lives in the process's registry entry (the registry sits above
//! this stage and runs it: `Process::enrich`). Pod
//! names (`pods`, fetched by `pods_api`) join a process's identity once the node's list has them.
pub mod devices;
pub mod gputime;
pub mod graphs;
pub mod kernels;
pub mod memory;
pub mod pods;
pub mod pods_api;

use std::sync::Arc;

use gputime::BatchEstimate;
use kernels::KernelName;

/// What enrichment learned of one call.
pub struct Enrichment {
    /// The kernel a launch runs, or a lookup named, when known.
    pub kernel: Option<Arc<KernelName>>,
    /// What a wait or a poll closed (device time).
    pub batch: Option<BatchEstimate>,
    /// Made on a capturing stream: recorded into a graph, ran nothing.
    pub captured: bool,
    /// A graph launch of known composition: the kernels it ran.
    pub graph_runs: Option<graphs::Composition>,
}
