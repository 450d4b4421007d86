//! How every failure reaches a client: a status, a JSON body `{"error", "code"}`, and
//! `Retry-After` on a refusal.
//!
//! A budget or database that cannot answer is a 500 whose cause goes to the log, never to the
//! client, and never a 429: a 429 would tell a whole fleet to back off from a cap none of them
//! reached.

use std::time::Duration;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

/// A request that did not succeed, as the client will see it.
#[derive(Debug)]
pub enum ApiError {
    /// 400: malformed JSON, uuid or field.
    BadRequest(String),
    /// 401: a missing or wrong bearer token.
    Unauthorized,
    /// 404: an unknown route, Domain or secret.
    NotFound {
        /// The machine-readable code.
        code: &'static str,
        /// What was not found.
        message: String,
    },
    /// 413: a body over the configured limit.
    PayloadTooLarge {
        /// The limit, in bytes.
        limit: usize,
    },
    /// 429: a budget refused the request.
    RateLimited {
        /// Which budget refused, as a machine-readable code.
        code: &'static str,
        /// The same for people.
        message: &'static str,
        /// How long until the refused cost could be covered.
        retry_after: Duration,
    },
    /// 500: a budget or the database could not answer; the cause is already logged.
    Internal,
}

impl ApiError {
    /// Logs `error` with its whole source chain and answers a generic 500.
    pub fn internal(context: &'static str, error: &(dyn std::error::Error + 'static)) -> ApiError {
        let mut chain = error.to_string();
        let mut source = error.source();
        while let Some(cause) = source {
            chain.push_str(": ");
            chain.push_str(&cause.to_string());
            source = cause.source();
        }
        tracing::error!(error = %chain, "{context}");
        ApiError::Internal
    }
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: &'a str,
    code: &'a str,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code, message) = match &self {
            ApiError::BadRequest(message) => (StatusCode::BAD_REQUEST, "bad_request", message.clone()),
            ApiError::Unauthorized => {
                (StatusCode::UNAUTHORIZED, "unauthorized", "missing or invalid bearer token".to_owned())
            }
            ApiError::NotFound { code, message } => (StatusCode::NOT_FOUND, *code, message.clone()),
            ApiError::PayloadTooLarge { limit } => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                format!("the body is larger than the limit of {limit} bytes"),
            ),
            ApiError::RateLimited { code, message, .. } => {
                (StatusCode::TOO_MANY_REQUESTS, *code, (*message).to_owned())
            }
            ApiError::Internal => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "the service could not answer; try again".to_owned(),
            ),
        };
        let mut response = (status, Json(ErrorBody { error: &message, code })).into_response();
        if status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if let ApiError::RateLimited { retry_after, .. } = self {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(retry_after_seconds(retry_after)));
        }
        response
    }
}

/// `Retry-After` in whole seconds, rounded up, and at least 1: a client told 0 would retry at
/// once into the same refusal.
pub fn retry_after_seconds(retry_after: Duration) -> u64 {
    let whole = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
    whole.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_rounds_up_to_whole_seconds_and_is_never_zero() {
        assert_eq!(retry_after_seconds(Duration::ZERO), 1);
        assert_eq!(retry_after_seconds(Duration::from_millis(100)), 1);
        assert_eq!(retry_after_seconds(Duration::from_secs(1)), 1);
        assert_eq!(retry_after_seconds(Duration::from_millis(1001)), 2);
        assert_eq!(retry_after_seconds(Duration::from_secs_f64(2.5)), 3);
    }
}
