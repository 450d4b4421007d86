//! Logs: one subscriber, one format, set up once by `main`.
//!
//! Level meanings, written down once (as Materialize does): ERROR is a request or loop that
//! failed and someone should look at it (a 500, a sweep that could not run); WARN is a
//! degradation the service rides out by itself (a lost leader session, a fallback decision);
//! INFO is a change of state an operator wants in the log (leadership, serving, stopping);
//! DEBUG is per request. Every request's lines carry its span: route, request id, and the
//! Node and Domain once known. No field ever holds a token or a secret value. A failure is
//! written with its causes on one line by `ratebudget::cause_chain`, the one way every crate
//! writes one.

/// Installs the process's subscriber: human-readable lines on stderr, filtered by `RUST_LOG`
/// (default `info`).
pub fn init() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
}
