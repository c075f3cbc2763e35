//! The probe stage: finding libcuda files (`discover`), resolving their entry points
//! (`symbols`), checking the privileges (`caps`), building the in-kernel filter (`filter`), and
//! loading and attaching the eBPF programs with typed handles to their maps (`loader`), and
//! showing what the programs log (`ebpf_log`); `batch` reads a whole map in few system calls.
pub mod allow;
pub mod batch;
pub mod bpf_maps;
pub mod breaker;
pub mod btf;
pub mod caps;
pub mod census;
pub mod discovery;
pub mod ebpf_log;
pub mod error;
pub mod filter;
pub mod guard;
pub mod harm;
pub mod kernels;
pub mod kmsg;
pub mod library;
pub mod loader;
mod loader_hooks;
pub mod multi;
pub mod opens;
pub mod proc_maps;
pub mod run_as;
pub mod sandbox;
pub mod scope;
pub mod session;
pub mod sites;
pub mod slots;
pub mod symbols;
pub mod windows;
