//! Node routes: secret reads and telemetry ingest, each spending two budgets.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

use super::auth::NodeCaller;
use super::error::ApiError;
use super::extract::{read_body, PathParams, NO_STORE};
use super::state::AppState;

#[derive(Serialize)]
struct SecretBody<'a> {
    name: &'a str,
    value: &'a str,
}

/// `GET /v1/secrets/{name}`: a secret of the calling Node's own Domain.
pub(super) async fn read_secret(
    NodeCaller(node): NodeCaller,
    State(state): State<AppState>,
    PathParams(name): PathParams<String>,
) -> Result<Response, ApiError> {
    let name = secrets::SecretName::parse(name)?;
    let reader =
        secrets::Reader { node: node.node_id.as_uuid().into(), domain: node.domain_id.as_uuid().into() };
    let secret = state.bounded("reading a secret", state.secrets.read(reader, &name)).await??;
    Ok((NO_STORE, Json(SecretBody { name: secret.name.as_str(), value: secret.value.expose() }))
        .into_response())
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
    let id = state.bounded("ingesting a batch", state.ingest.accept(sender, &payload)).await??;
    Ok((StatusCode::ACCEPTED, Json(AcceptedBody { id: id.as_uuid(), bytes: payload.len() })).into_response())
}
