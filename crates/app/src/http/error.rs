//! How every failure reaches a client: a status, a JSON body `{"error", "code"}`, and
//! `Retry-After` on a refusal; and how it reaches the log, once.
//!
//! Context errors become [`ApiError`]s through `From` impls, so a handler says `?` and the
//! mapping lives here, in one place. A budget or database that cannot answer is a 500 whose
//! cause chain goes to the log (inside the request's span, so the line names the route, the
//! request id and the caller), never to the client, and never a 429: a 429 would tell a whole
//! fleet to back off from a cap none of them reached.

use std::time::Duration;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use ratebudget::cause_chain;
use serde::Serialize;

/// Any cause kept for the log.
pub(super) type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A request that did not succeed, as the client will see it.
#[derive(Debug)]
pub enum ApiError {
    /// 400: malformed JSON, uuid, field or batch.
    BadRequest {
        /// The machine-readable code (`bad_request`, `empty_batch`).
        code: &'static str,
        /// What was wrong, for people.
        message: String,
    },
    /// 401: a missing or wrong bearer token.
    Unauthorized,
    /// 403: a valid token that may not do this (a decide token asking for a service it does
    /// not name).
    Forbidden {
        /// What it may not do, for people.
        message: String,
    },
    /// 404: an unknown route, Domain or secret.
    NotFound {
        /// The machine-readable code.
        code: &'static str,
        /// What was not found.
        message: String,
    },
    /// 409: the request conflicts with what exists (a Domain name in use).
    Conflict {
        /// The machine-readable code.
        code: &'static str,
        /// What conflicts, for people.
        message: String,
    },
    /// 408: the body did not arrive within `PLEXSPHERE_HTTP_BODY_TIMEOUT_MS`.
    BodyTimeout {
        /// The body's deadline.
        after: Duration,
    },
    /// 413: a body over a limit.
    PayloadTooLarge {
        /// The machine-readable code (`payload_too_large`, `batch_larger_than_quota`).
        code: &'static str,
        /// The limit, in bytes.
        limit: u64,
    },
    /// 412: a change named a version (`If-Match`) the rule is not at.
    PreconditionFailed {
        /// What is wrong, for people.
        message: String,
        /// The rule's version now, sent as its `ETag` so the client can read it again.
        current: Option<rules::Version>,
    },
    /// 428: a change to an existing rule named no version (`If-Match`).
    PreconditionRequired {
        /// What is wrong, for people.
        message: String,
        /// The rule's version now, sent as its `ETag`.
        current: rules::Version,
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
    /// 500: the database did not answer within the request's database time.
    DatabaseTimeout {
        /// What the request was doing.
        during: &'static str,
        /// The request's database time.
        after: Duration,
    },
    /// 500: a budget or the database could not answer.
    Internal(BoxError),
}

impl ApiError {
    /// A 400 with the generic `bad_request` code.
    pub fn bad_request(message: impl std::fmt::Display) -> ApiError {
        ApiError::BadRequest { code: "bad_request", message: message.to_string() }
    }

    /// A 500 caused by `error`, whose source chain the log will show.
    pub fn internal(error: impl std::error::Error + Send + Sync + 'static) -> ApiError {
        ApiError::Internal(Box::new(error))
    }

    /// The status this error answers with.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest { .. } => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden { .. } => StatusCode::FORBIDDEN,
            ApiError::NotFound { .. } => StatusCode::NOT_FOUND,
            ApiError::Conflict { .. } => StatusCode::CONFLICT,
            ApiError::BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            ApiError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::PreconditionFailed { .. } => StatusCode::PRECONDITION_FAILED,
            ApiError::PreconditionRequired { .. } => StatusCode::PRECONDITION_REQUIRED,
            ApiError::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::DatabaseTimeout { .. } | ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// The body of every error response, built here and nowhere else.
#[derive(Serialize)]
struct ErrorBody<'a> {
    /// For people.
    error: &'a str,
    /// For programs.
    code: &'a str,
}

/// A JSON error response with `status`; the one way an error body is written.
pub fn error_response(status: StatusCode, code: &str, message: &str) -> Response {
    (status, Json(ErrorBody { error: message, code })).into_response()
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let (code, message): (&str, String) = match &self {
            ApiError::BadRequest { code, message } => (code, message.clone()),
            ApiError::Unauthorized => ("unauthorized", "missing or invalid bearer token".to_owned()),
            ApiError::Forbidden { message } => ("forbidden", message.clone()),
            ApiError::NotFound { code, message } => (code, message.clone()),
            ApiError::Conflict { code, message } => (code, message.clone()),
            ApiError::BodyTimeout { after } => {
                ("request_timeout", format!("the body did not arrive within {} ms", after.as_millis()))
            }
            ApiError::PayloadTooLarge { code, limit } => {
                (code, format!("the body is larger than the limit of {limit} bytes"))
            }
            ApiError::PreconditionFailed { message, .. } => ("precondition_failed", message.clone()),
            ApiError::PreconditionRequired { message, .. } => ("precondition_required", message.clone()),
            ApiError::RateLimited { code, message, .. } => (code, (*message).to_owned()),
            ApiError::DatabaseTimeout { during, after } => {
                tracing::error!(
                    during,
                    timeout_ms = after.as_millis() as u64,
                    "request failed: the database did not answer in time"
                );
                ("internal", "the service could not answer; try again".to_owned())
            }
            ApiError::Internal(cause) => {
                tracing::error!(error = %cause_chain(cause.as_ref()), "request failed");
                ("internal", "the service could not answer; try again".to_owned())
            }
        };
        let mut response = error_response(status, code, &message);
        if status == StatusCode::REQUEST_TIMEOUT {
            // The rest of the body may still be on its way: the connection cannot be reused.
            response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        if status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if let ApiError::RateLimited { retry_after, .. } = self {
            response.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from(ratebudget_tower::retry_after_seconds(retry_after)),
            );
        }
        let current = match self {
            ApiError::PreconditionFailed { current, .. } => current,
            ApiError::PreconditionRequired { current, .. } => Some(current),
            _ => None,
        };
        if let Some(current) = current {
            set_etag(&mut response, current);
        }
        response
    }
}

/// The answer to a handler that panicked: a 500 like any other, with the panic's message
/// logged once inside the request's span (route, request id, caller).
///
/// The message goes to the log, never to the client. Every value that could hold a token or a
/// secret (`NodeToken`, `SecretValue`, keys) prints `<redacted>` in `Debug`, so a panic message
/// built from them cannot carry one either.
// CatchPanicLayer hands the payload over by value; the signature is its, not a choice.
#[allow(clippy::needless_pass_by_value)]
pub fn panic_response(panic: Box<dyn std::any::Any + Send + 'static>) -> Response {
    let message = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&'static str>().copied())
        .unwrap_or("a panic whose payload is not text");
    tracing::error!(panic = message, "request failed: the handler panicked");
    error_response(StatusCode::INTERNAL_SERVER_ERROR, "internal", "the service could not answer; try again")
}

/// Sets `ETag` to `version`'s entity tag.
pub(super) fn set_etag(response: &mut Response, version: rules::Version) {
    // A number in quotes is always a valid header value.
    if let Ok(tag) = HeaderValue::from_str(&version.etag()) {
        response.headers_mut().insert(header::ETAG, tag);
    }
}

impl From<secrets::ReadError> for ApiError {
    fn from(error: secrets::ReadError) -> Self {
        match error {
            secrets::ReadError::NotFound => ApiError::NotFound {
                code: "unknown_secret",
                message: "no such secret in this node's domain".into(),
            },
            secrets::ReadError::NodeRateLimited { retry_after } => ApiError::RateLimited {
                code: "node_secret_read_rate_limited",
                message: "this node's secret-read budget is spent",
                retry_after,
            },
            secrets::ReadError::DomainRateLimited { retry_after } => ApiError::RateLimited {
                code: "domain_secret_read_rate_limited",
                message: "this domain's secret-read budget is spent",
                retry_after,
            },
            unavailable @ secrets::ReadError::Unavailable(_) => ApiError::internal(unavailable),
            // The cause names the key id, never a key or a value.
            unreadable @ secrets::ReadError::Unreadable(_) => ApiError::internal(unreadable),
        }
    }
}

impl From<secrets::WriteError> for ApiError {
    fn from(error: secrets::WriteError) -> Self {
        ApiError::internal(error)
    }
}

impl From<ingest::IngestError> for ApiError {
    fn from(error: ingest::IngestError) -> Self {
        use ingest::{IngestError, Quota};
        match error {
            IngestError::EmptyBatch => ApiError::BadRequest {
                code: "empty_batch",
                message: "a batch must hold at least one byte".into(),
            },
            IngestError::QuotaExceeded { quota: Quota::Node, retry_after } => ApiError::RateLimited {
                code: "node_ingest_quota_exceeded",
                message: "this node's ingest quota is spent",
                retry_after,
            },
            IngestError::QuotaExceeded { quota: Quota::Domain, retry_after } => ApiError::RateLimited {
                code: "domain_ingest_quota_exceeded",
                message: "this domain's ingest quota is spent",
                retry_after,
            },
            IngestError::LargerThanQuota { burst, .. } => {
                ApiError::PayloadTooLarge { code: "batch_larger_than_quota", limit: burst }
            }
            unavailable @ IngestError::Unavailable(_) => ApiError::internal(unavailable),
        }
    }
}

impl From<access::EnrolError> for ApiError {
    fn from(error: access::EnrolError) -> Self {
        match error {
            access::EnrolError::UnknownDomain(id) => unknown_domain(id.as_uuid()),
            access::EnrolError::IssuanceRateLimited { retry_after } => ApiError::RateLimited {
                code: "issuance_rate_limited",
                message: "the domain's credential issuance budget is spent",
                retry_after,
            },
            unavailable @ access::EnrolError::Unavailable(_) => ApiError::internal(unavailable),
        }
    }
}

impl From<access::CreateDomainError> for ApiError {
    fn from(error: access::CreateDomainError) -> Self {
        match error {
            access::CreateDomainError::NameTaken { name, existing } => ApiError::Conflict {
                code: "domain_name_taken",
                message: format!("a domain named {name:?} exists already: {existing}"),
            },
            unavailable @ access::CreateDomainError::Unavailable(_) => ApiError::internal(unavailable),
        }
    }
}

impl From<access::RepositoryError> for ApiError {
    fn from(error: access::RepositoryError) -> Self {
        ApiError::internal(error)
    }
}

impl From<access::AuthError> for ApiError {
    fn from(error: access::AuthError) -> Self {
        match error {
            access::AuthError::MalformedToken | access::AuthError::UnknownToken => ApiError::Unauthorized,
            unavailable @ access::AuthError::Unavailable(_) => ApiError::internal(unavailable),
        }
    }
}

impl From<access::RevokeError> for ApiError {
    fn from(error: access::RevokeError) -> Self {
        match error {
            access::RevokeError::UnknownNode { domain, node } => ApiError::NotFound {
                code: "unknown_node",
                message: format!("no node {node} in domain {domain}"),
            },
            unavailable @ access::RevokeError::Unavailable(_) => ApiError::internal(unavailable),
        }
    }
}

impl From<audit::AuditLogError> for ApiError {
    fn from(error: audit::AuditLogError) -> Self {
        ApiError::internal(error)
    }
}

impl From<audit::InvalidInput> for ApiError {
    fn from(error: audit::InvalidInput) -> Self {
        ApiError::bad_request(error)
    }
}

impl From<access::InvalidInput> for ApiError {
    fn from(error: access::InvalidInput) -> Self {
        ApiError::bad_request(error)
    }
}

impl From<secrets::InvalidInput> for ApiError {
    fn from(error: secrets::InvalidInput) -> Self {
        ApiError::bad_request(error)
    }
}

impl From<ratebudget::Error> for ApiError {
    fn from(error: ratebudget::Error) -> Self {
        ApiError::internal(error)
    }
}

impl From<rules::InvalidRule> for ApiError {
    fn from(error: rules::InvalidRule) -> Self {
        ApiError::bad_request(error)
    }
}

impl From<rules::RepositoryError> for ApiError {
    fn from(error: rules::RepositoryError) -> Self {
        ApiError::internal(error)
    }
}

impl From<rules::WriteError> for ApiError {
    fn from(error: rules::WriteError) -> Self {
        use rules::WriteError;
        match error {
            WriteError::PreconditionRequired { current } => ApiError::PreconditionRequired {
                message: format!(
                    "the rule exists at version {current}; to replace or delete it, send If-Match: {}",
                    current.etag()
                ),
                current,
            },
            WriteError::PreconditionFailed { current: Some(current) } => ApiError::PreconditionFailed {
                message: format!(
                    "the rule is at version {current}, not the one If-Match named; read it again and retry"
                ),
                current: Some(current),
            },
            WriteError::PreconditionFailed { current: None } => ApiError::PreconditionFailed {
                message: "the rule does not exist, so it is at no version If-Match can name".into(),
                current: None,
            },
            WriteError::UnknownRule => unknown_rule(),
            WriteError::UnknownVersion(version) => ApiError::NotFound {
                code: "unknown_rule_version",
                message: format!("the rule has no version {version}"),
            },
            deletion @ WriteError::DeletionVersion(_) => {
                ApiError::bad_request(format!("invalid version: {deletion}"))
            }
            unavailable @ WriteError::Unavailable(_) => ApiError::internal(unavailable),
        }
    }
}

impl From<service::NotLoaded> for ApiError {
    fn from(error: service::NotLoaded) -> Self {
        ApiError::internal(error)
    }
}

impl From<service::quota::QuotaError> for ApiError {
    fn from(error: service::quota::QuotaError) -> Self {
        use service::quota::QuotaError;
        match error {
            forbidden @ QuotaError::Forbidden { .. } => {
                ApiError::Forbidden { message: forbidden.to_string() }
            }
            QuotaError::NotLoaded(not_loaded) => not_loaded.into(),
            store @ QuotaError::Store(_) => ApiError::internal(store),
        }
    }
}

impl From<crate::edge::database_time::OutOfDatabaseTime> for ApiError {
    fn from(out_of_time: crate::edge::database_time::OutOfDatabaseTime) -> Self {
        ApiError::DatabaseTimeout { during: out_of_time.during, after: out_of_time.after }
    }
}

impl From<service::DecideError> for ApiError {
    fn from(error: service::DecideError) -> Self {
        use service::DecideError;
        match error {
            invalid @ DecideError::Invalid { .. } => ApiError::bad_request(invalid),
            forbidden @ DecideError::Forbidden { .. } => {
                ApiError::Forbidden { message: forbidden.to_string() }
            }
            DecideError::NotLoaded(not_loaded) => not_loaded.into(),
            undecided @ DecideError::Undecided(_) => ApiError::internal(undecided),
        }
    }
}

/// Each operation's failure as its context's own error answers it.
impl From<service::OperationError> for ApiError {
    fn from(error: service::OperationError) -> Self {
        use service::OperationError;
        match error {
            OperationError::UnknownDomain(id) => unknown_domain(id),
            ungoverned @ OperationError::Ungoverned { .. } => {
                ApiError::NotFound { code: "ungoverned", message: ungoverned.to_string() }
            }
            OperationError::NotLoaded(not_loaded) => not_loaded.into(),
            wrong @ OperationError::WrongHolder { .. } => {
                ApiError::BadRequest { code: "wrong_holder", message: wrong.to_string() }
            }
            invalid @ OperationError::Invalid { .. } => ApiError::bad_request(invalid),
            actor @ OperationError::Actor(_) => ApiError::internal(actor),
            OperationError::CreateDomain(error) => error.into(),
            OperationError::Access(error) => error.into(),
            OperationError::Enrol(error) => error.into(),
            OperationError::Revoke(error) => error.into(),
            OperationError::SecretWrite(error) => error.into(),
            rekey @ OperationError::Rekey { .. } => ApiError::internal(rekey),
            OperationError::RuleWrite(error) => error.into(),
            OperationError::Rules(error) => error.into(),
            store @ OperationError::Store(_) => ApiError::internal(store),
            OperationError::Audit(error) => error.into(),
        }
    }
}

/// The 404 for a rule id that names no rule.
pub(super) fn unknown_rule() -> ApiError {
    ApiError::NotFound { code: "unknown_rule", message: "no such rule".into() }
}

/// The 404 for a Domain id that names no Domain.
pub(super) fn unknown_domain(id: uuid::Uuid) -> ApiError {
    ApiError::NotFound { code: "unknown_domain", message: format!("no domain {id}") }
}
