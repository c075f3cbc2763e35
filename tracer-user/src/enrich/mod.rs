//! Enrichment: what a call means beyond its record. Who the process is (identity), which kernel a
//! launch runs (kernel names), device memory held, and the GPU-time estimate per stream. Each
//! table is per process and lives in the process's registry entry (the registry sits above
//! this stage and runs it: `Process::enrich`). Pod
//! names (`pods`, fetched by `pods_api`) join a process's identity once the node's list has them.
pub mod gputime;
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
    /// What a wait closed (GPU-time estimate).
    pub batch: Option<BatchEstimate>,
}
