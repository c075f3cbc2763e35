//! One file per command.
pub mod actuator;
pub mod backtest;
pub mod breaker;
pub mod census;
pub mod daemon;
pub mod explain;
pub mod incidents;
pub mod prepare_state;
pub mod record;
pub mod review;
pub mod run;
pub mod sites;
pub mod top;
pub mod trace;

use std::time::Duration;

/// A tick every `period`, the first a period from now; a late tick delays the next ones rather
/// than bunching them (the detection window, `top`'s screen).
pub fn every(period: Duration) -> tokio::time::Interval {
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick
}
