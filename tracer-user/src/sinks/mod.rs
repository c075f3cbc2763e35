//! Where results go: stdout (events for `trace`, alert changes for `run`), the HTTP alert sinks
//! (webhook, Alertmanager) and the Prometheus metrics server.
pub mod alertmanager;
pub mod http;
pub mod metrics;
pub mod stdout;
