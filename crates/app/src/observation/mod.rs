//! What this replica tells about itself: the guard's observer (decisions by scope and rule,
//! usage, RateLimit readings), the fill history the operator page draws, the Prometheus
//! metrics, the optional OTLP export, and the logs.

pub mod fill;
pub mod logs;
pub mod metrics;
pub mod observer;
pub mod otlp;
pub mod quota_metrics;
