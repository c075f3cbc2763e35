//! One file per command.
pub mod run;
pub mod trace;
