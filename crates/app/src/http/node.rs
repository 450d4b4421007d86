//! Node routes: secret reads and telemetry ingest, each spending two budgets.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

use super::auth::NodeCaller;
use super::{read_body, ApiError, AppState};

#[derive(Serialize)]
struct SecretBody<'a> {
    name: &'a str,
    value: &'a str,
}

/// `GET /v1/secrets/{name}`: a secret of the calling Node's own Domain.
pub(super) async fn read_secret(
    NodeCaller(node): NodeCaller,
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let name = secrets::SecretName::parse(name).map_err(|error| ApiError::BadRequest(error.to_string()))?;
    let reader =
        secrets::Reader { node: node.node_id.as_uuid().into(), domain: node.domain_id.as_uuid().into() };
    let secret =
        state.bounded("reading a secret", state.secrets.read(reader, &name)).await?.map_err(|error| {
            match error {
                secrets::ReadError::NotFound => ApiError::NotFound {
                    code: "unknown_secret",
                    message: format!("no secret {:?}", name.as_str()),
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
                error @ secrets::ReadError::Unavailable(_) => ApiError::internal("reading a secret", &error),
            }
        })?;
    Ok(Json(SecretBody { name: secret.name.as_str(), value: secret.value.expose() }).into_response())
}

#[derive(Serialize)]
struct AcceptedBody {
    id: uuid::Uuid,
    bytes: usize,
}

/// `POST /v1/ingest`: one telemetry batch; the body, whatever its content type, is the batch
/// and its length as received is what it costs.
pub(super) async fn ingest(
    NodeCaller(node): NodeCaller,
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let payload = read_body(body, state.ingest_max_batch_bytes)?;
    let sender =
        ingest::Sender { node: node.node_id.as_uuid().into(), domain: node.domain_id.as_uuid().into() };
    let id = state.bounded("ingesting a batch", state.ingest.accept(sender, &payload)).await?.map_err(
        |error| match error {
            ingest::IngestError::NodeQuotaExceeded { retry_after } => ApiError::RateLimited {
                code: "node_ingest_quota_exceeded",
                message: "this node's ingest quota is spent",
                retry_after,
            },
            ingest::IngestError::DomainQuotaExceeded { retry_after } => ApiError::RateLimited {
                code: "domain_ingest_quota_exceeded",
                message: "this domain's ingest quota is spent",
                retry_after,
            },
            error @ ingest::IngestError::Unavailable(_) => ApiError::internal("ingesting a batch", &error),
        },
    )?;
    Ok((StatusCode::ACCEPTED, Json(AcceptedBody { id: id.as_uuid(), bytes: payload.len() })).into_response())
}
