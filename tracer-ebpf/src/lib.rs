// The programs live in the `tracer` binary target (src/main.rs), built for bpfel-unknown-none by
// tracer-user's build script. This empty library lets tracer-user name the crate as a
// build-dependency, so cargo rebuilds the programs when this crate changes.
#![no_std]
