//! Where results go: stdout (events for `trace`, alert changes for `run`), the HTTP alert sinks
//! (webhook, Alertmanager), OTLP (spans of slow calls), the Prometheus metrics server, the
//! incident archive, `record`'s timeline file and `top`'s screen.
pub mod alerting;
pub mod alertmanager;
pub mod archive;
pub mod client;
pub mod files;
pub mod group;
pub mod http;
pub mod metrics;
pub mod mitigate;
pub mod otlp;
pub mod stdout;
pub mod timeline;
pub mod top;
