//! One file per command.
pub mod daemon;
pub mod incidents;
pub mod record;
pub mod run;
pub mod top;
pub mod trace;
