//! Alert policies at work, over the entries the config file gives (`config::schedule`,
//! `config::quiet`): which detection settings are in force when ([`schedule`]), and which alerts
//! are kept from the sinks when ([`quiet`]).
pub mod quiet;
pub mod schedule;
