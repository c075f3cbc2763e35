//! Enrichment: what a call means beyond its record. Who the process is (identity), which kernel a
//! launch runs (kernel names), device memory held, and the GPU-time estimate per stream. Each
//! table is per process and lives in the process's [`crate::registry::Process`] entry. Pod
//! names (`pods`, fetched by `pods_api`) join a process's identity once the node's list has them.
pub mod gputime;
pub mod identity;
pub mod kernels;
pub mod memory;
pub mod pods;
pub mod pods_api;

use std::sync::Arc;

use crate::{pipeline::decode::Event, registry::Process};
use gputime::BatchEstimate;
use kernels::KernelName;

/// What enrichment learned of one call.
pub struct Enrichment {
    /// The kernel a launch runs, or a lookup named, when known.
    pub kernel: Option<Arc<KernelName>>,
    /// What a wait closed (GPU-time estimate).
    pub batch: Option<BatchEstimate>,
}

/// Runs every enrichment of one call against its process's tables.
pub fn enrich(process: &mut Process, ev: &Event) -> Enrichment {
    process.memory.observe(ev);
    Enrichment {
        kernel: process.kernels.observe(ev),
        batch: process.streams.observe(ev),
    }
}
