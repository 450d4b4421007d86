//! Probes, metrics and the answers for unknown routes.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::error::{error_response, ApiError};
use super::state::AppState;

/// `GET /healthz`: the process answers. It does not ask the database, so an orchestrator does
/// not restart every replica during a database outage that a restart cannot fix.
pub(super) async fn healthz() -> Json<serde_json::Value> {
    Json(json!({ "status": "ok" }))
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
