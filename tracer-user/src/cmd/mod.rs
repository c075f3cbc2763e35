//! One file per command.
pub mod record;
pub mod run;
pub mod trace;
