//! What handlers take from a request besides their state: path parameters and uuids with a
//! JSON 400, and a body within its limit (413) and deadline (408).

use axum::extract::{FromRequestParts, Path};
use axum::http::request::Parts;
use axum::http::HeaderName;

use super::deadline;
use super::error::ApiError;

/// The largest JSON body an operator route reads: a 64 KiB secret, JSON-escaped, fits.
pub(super) const OPERATOR_BODY_LIMIT: usize = 512 * 1024;

/// The header of every response that carries a token or a secret value: no cache, shared or
/// private, may keep a copy (RFC 9111, section 5.2.2.5).
pub(super) const NO_STORE: [(HeaderName, &str); 1] = [(axum::http::header::CACHE_CONTROL, "no-store")];

/// A path's parameters, with a JSON 400 (instead of axum's plain-text rejection) when they do
/// not decode, such as a segment that is not valid percent-encoded UTF-8.
pub(super) struct PathParams<T>(pub(super) T);

impl<T, S> FromRequestParts<S> for PathParams<T>
where
    T: serde::de::DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(params)) => Ok(PathParams(params)),
            Err(rejection) => {
                Err(ApiError::bad_request(format!("unreadable path: {}", rejection.body_text())))
            }
        }
    }
}

/// Parses a uuid from a path segment, or answers 400 naming the segment.
pub(super) fn parse_uuid(segment: &str, what: &str) -> Result<uuid::Uuid, ApiError> {
    uuid::Uuid::parse_str(segment)
        .map_err(|_| ApiError::bad_request(format!("{what} is not a uuid: {segment:?}")))
}

/// The body as received, or 413 for one over `limit` and 400 for one that could not be read.
pub(super) fn read_body(
    body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
    limit: usize,
) -> Result<axum::body::Bytes, ApiError> {
    body.map_err(|rejection| {
        if let Some(after) = deadline::body_deadline_in(&rejection) {
            ApiError::BodyTimeout { after }
        } else if rejection.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::PayloadTooLarge { code: "payload_too_large", limit: limit as u64 }
        } else {
            ApiError::bad_request(format!("unreadable body: {rejection}"))
        }
    })
}
