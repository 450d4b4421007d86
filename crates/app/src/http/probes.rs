//! Probes, metrics and the answers for unknown routes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;
use sqlx::PgPool;

use super::{error_response, ApiError, AppState};

/// `GET /healthz`: the process answers. It does not ask the database, so an orchestrator does
/// not restart every replica during a database outage that a restart cannot fix.
pub(super) async fn healthz() -> Json<serde_json::Value> {
    Json(json!({ "status": "ok" }))
}

/// Whether the database answered, as of the last probe: `/readyz` is unauthenticated, so
/// it must not be a way to make every request cost a round trip. A probe is made at most once
/// a [`Readiness::FRESH_FOR`]; callers meanwhile (and while it runs) get its answer.
#[derive(Clone)]
pub struct Readiness {
    pool: PgPool,
    timeout: Duration,
    last: Arc<tokio::sync::Mutex<Option<Probe>>>,
}

/// When the database was last probed, and what it answered.
type Probe = (Instant, Result<(), String>);

impl Readiness {
    /// How long a probe's answer is served before the next probe.
    pub const FRESH_FOR: Duration = Duration::from_secs(1);

    /// Probes `pool`, each probe bounded by `timeout`.
    pub fn new(pool: PgPool, timeout: Duration) -> Readiness {
        Readiness { pool, timeout, last: Arc::default() }
    }

    /// `Ok` when the database answered the last probe, made now if the last is stale.
    ///
    /// # Errors
    /// Why the database did not answer, as text for the log.
    pub async fn check(&self) -> Result<(), String> {
        // One prober at a time; the others wait for its answer rather than probe too.
        let mut last = self.last.lock().await;
        if let Some((at, answer)) = &*last {
            if at.elapsed() < Self::FRESH_FOR {
                return answer.clone();
            }
        }
        // A standby (or a primary demoted to one) answers, but every write fails: a replica
        // talking to it decides nothing, and must not be sent traffic until it reaches a
        // writable primary again (after a failover).
        let probe = sqlx::query_scalar::<_, bool>(
            "SELECT NOT pg_is_in_recovery() AND current_setting('transaction_read_only') = 'off'",
        )
        .fetch_one(&self.pool);
        let answer = match tokio::time::timeout(self.timeout, probe).await {
            Ok(Ok(true)) => Ok(()),
            Ok(Ok(false)) => Err("the database is read-only (a standby, or in recovery)".to_owned()),
            Ok(Err(error)) => Err(error.to_string()),
            Err(_) => Err("the database did not answer in time".to_owned()),
        };
        *last = Some((Instant::now(), answer.clone()));
        answer
    }
}

/// `GET /readyz`: 200 only when a writable primary answers in time (as of a probe at most a
/// second old), this replica's clock is within its bound of the database's, and its rules and tiers
/// are loaded (it does not decide otherwise), so a load balancer sends traffic elsewhere while
/// any of them fails.
pub(super) async fn readyz(State(state): State<AppState>) -> Response {
    if let Err(untrusted) = state.clock.check() {
        tracing::warn!(cause = %untrusted, "not ready: the clock cannot be trusted");
        return error_response(StatusCode::SERVICE_UNAVAILABLE, "not_ready", "the clock cannot be trusted");
    }
    if !state.rule_budgets.loaded() {
        tracing::warn!("not ready: the rate-budget rules and Domain tiers are not loaded yet");
        return error_response(StatusCode::SERVICE_UNAVAILABLE, "not_ready", "the rules are not loaded yet");
    }
    match state.readiness.check().await {
        Ok(()) => Json(json!({ "status": "ready" })).into_response(),
        Err(cause) => not_ready(&cause),
    }
}

fn not_ready(cause: &str) -> Response {
    tracing::warn!(cause, "not ready: the database does not answer");
    error_response(StatusCode::SERVICE_UNAVAILABLE, "not_ready", "the database does not answer")
}

/// `GET /metrics`: the OpenMetrics text Prometheus scrapes.
pub(super) async fn metrics(State(state): State<AppState>) -> Response {
    let content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8";
    ([(header::CONTENT_TYPE, content_type)], state.metrics.render()).into_response()
}

pub(super) async fn not_found() -> ApiError {
    ApiError::NotFound { code: "not_found", message: "no such route".into() }
}

pub(super) async fn method_not_allowed() -> Response {
    error_response(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", "method not allowed on this route")
}
