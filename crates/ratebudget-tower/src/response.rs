//! The answers the layer gives instead of the service's: a refusal, a request it cannot
//! price or key, a budget that could not be decided.
//!
//! Over HTTP each is a JSON body `{"error", "code"}`, the `plexsphere` binary's error shape,
//! with the status saying what happened. A gRPC request (`content-type: application/grpc…`)
//! gets a trailers-only gRPC response instead (HTTP 200 carrying `grpc-status` and
//! `grpc-message`), since a gRPC client reads the status there and not in the HTTP status.
//! `Retry-After` and the `RateLimit` fields are sent either way.

use std::borrow::Cow;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderValue, Response, StatusCode};
use http_body_util::Full;

use crate::{retry_after_seconds, Reading};

/// An answer given instead of the service's: a status, a machine-readable code and a message
/// for people; for a refusal, also when to retry and the refused bucket's fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    status: StatusCode,
    code: &'static str,
    message: Cow<'static, str>,
    retry_after: Option<Duration>,
    fields: Option<Reading>,
}

impl Rejection {
    /// An answer of `status`, with `code` for programs and `message` for people.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<Cow<'static, str>>) -> Rejection {
        Rejection { status, code, message: message.into(), retry_after: None, fields: None }
    }

    /// A 429 of `code` and `message`, retried after `retry_after`, reporting `fields`.
    pub(crate) fn refusal(
        code: &'static str,
        message: &'static str,
        retry_after: Duration,
        fields: Option<Reading>,
    ) -> Rejection {
        Rejection { retry_after: Some(retry_after), fields, ..Rejection::new(TOO_MANY, code, message) }
    }

    /// The 500 of a budget that could not be decided; the cause goes to the log, not here.
    pub(crate) fn undecided() -> Rejection {
        Rejection::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "the service could not answer; try again",
        )
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The machine-readable code.
    pub fn code(&self) -> &'static str {
        self.code
    }

    /// The message for people.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The response: JSON over HTTP, a trailers-only gRPC status for a gRPC request.
    pub(crate) fn into_response(self, grpc: bool) -> Response<Full<Bytes>> {
        let mut response = if grpc { self.grpc() } else { self.json() };
        let headers = response.headers_mut();
        if let Some(retry_after) = self.retry_after {
            headers.insert(RETRY_AFTER, HeaderValue::from(retry_after_seconds(retry_after)));
        }
        if let Some(fields) = self.fields {
            fields.set_on(headers);
        }
        response
    }

    fn json(&self) -> Response<Full<Bytes>> {
        #[derive(serde::Serialize)]
        struct ErrorBody<'a> {
            error: &'a str,
            code: &'a str,
        }
        let body = serde_json::to_vec(&ErrorBody { error: &self.message, code: self.code })
            .expect("two strings always serialise");
        let mut response = Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = self.status;
        response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        response
    }

    fn grpc(&self) -> Response<Full<Bytes>> {
        let mut response = Response::new(Full::new(Bytes::new()));
        let headers: &mut HeaderMap = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        headers.insert("grpc-status", HeaderValue::from(grpc_status(self.status)));
        // Percent-encoded as the gRPC HTTP/2 mapping asks, so any message is a valid value.
        if let Ok(message) = HeaderValue::from_str(&percent_encode(&self.message)) {
            headers.insert("grpc-message", message);
        }
        response
    }
}

const TOO_MANY: StatusCode = StatusCode::TOO_MANY_REQUESTS;

/// Whether `headers` are a gRPC request's.
pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.starts_with("application/grpc"))
}

/// The gRPC status code that says what `status` says.
fn grpc_status(status: StatusCode) -> u16 {
    match status {
        // RESOURCE_EXHAUSTED: "some resource has been exhausted, perhaps a per-user quota".
        StatusCode::TOO_MANY_REQUESTS | StatusCode::PAYLOAD_TOO_LARGE => 8,
        // UNAVAILABLE: transient, worth retrying; what a store that cannot answer is.
        StatusCode::INTERNAL_SERVER_ERROR => 14,
        StatusCode::UNAUTHORIZED => 16,
        StatusCode::FORBIDDEN => 7,
        status if status.is_client_error() => 3,
        _ => 2,
    }
}

/// `text` with every byte outside printable ASCII, and `%` itself, as `%XX`.
fn percent_encode(text: &str) -> String {
    let mut encoded = String::with_capacity(text.len());
    for byte in text.bytes() {
        if (b' '..=b'~').contains(&byte) && byte != b'%' {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt as _;

    use super::*;

    #[tokio::test]
    async fn a_refusal_is_json_with_retry_after_and_the_fields() {
        let fields = Reading { policy: "uploads", quota: 10, window: 5, remaining: 0, reset: 3 };
        let response =
            Rejection::refusal("rate_limited", "too many", Duration::from_millis(1_200), Some(fields))
                .into_response(false);
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(response.headers()[RETRY_AFTER], "2");
        assert_eq!(response.headers()["ratelimit"], "\"uploads\";r=0;t=3");
        assert_eq!(response.headers()[CONTENT_TYPE], "application/json");
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, r#"{"error":"too many","code":"rate_limited"}"#);
    }

    #[test]
    fn a_grpc_request_gets_a_grpc_status_with_a_percent_encoded_message() {
        let response =
            Rejection::new(StatusCode::BAD_REQUEST, "missing_key", "100% wrong: é").into_response(true);
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()["grpc-status"], "3");
        assert_eq!(response.headers()["grpc-message"], "100%25 wrong: %C3%A9");
        assert_eq!(grpc_status(StatusCode::TOO_MANY_REQUESTS), 8);
        assert_eq!(grpc_status(StatusCode::INTERNAL_SERVER_ERROR), 14);
    }
}
