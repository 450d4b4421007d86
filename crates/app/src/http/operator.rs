//! Operator routes: Domains, Node enrolment, secret writes and reading a budget.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};

use super::auth::Operator;
use super::{parse_json, parse_uuid, ApiError, AppState, OPERATOR_BODY_LIMIT};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CreateDomain {
    name: String,
    issuance_per_second: Option<f64>,
    issuance_burst: Option<f64>,
}

#[derive(Serialize)]
struct DomainBody {
    id: uuid::Uuid,
    name: String,
    issuance_per_second: Option<f64>,
    issuance_burst: Option<f64>,
}

impl CreateDomain {
    fn try_into_domain(self) -> Result<access::NewDomain, ApiError> {
        let name = access::DomainName::parse(self.name).map_err(bad_input)?;
        let issuance_policy = match (self.issuance_per_second, self.issuance_burst) {
            (None, None) => None,
            (Some(per_second), Some(burst)) => {
                Some(access::IssuancePolicy::new(per_second, burst).map_err(bad_input)?)
            }
            _ => {
                return Err(ApiError::BadRequest(
                    "issuance_per_second and issuance_burst go together: give both or neither".into(),
                ))
            }
        };
        Ok(access::NewDomain { name, issuance_policy })
    }
}

fn bad_input(error: impl std::fmt::Display) -> ApiError {
    ApiError::BadRequest(error.to_string())
}

fn unknown_domain(id: uuid::Uuid) -> ApiError {
    ApiError::NotFound { code: "unknown_domain", message: format!("no domain {id}") }
}

/// `POST /v1/domains`
pub(super) async fn create_domain(
    _: Operator,
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let new_domain = parse_json::<CreateDomain>(body, OPERATOR_BODY_LIMIT)?.try_into_domain()?;
    let domain = state
        .bounded("creating a domain", state.access.create_domain(new_domain))
        .await?
        .map_err(|error| ApiError::internal("creating a domain", &error))?;
    let body = DomainBody {
        id: domain.id.as_uuid(),
        name: domain.name.as_str().to_owned(),
        issuance_per_second: domain.issuance_policy.map(|policy| policy.per_second()),
        issuance_burst: domain.issuance_policy.map(|policy| policy.burst()),
    };
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct EnrollNode {
    name: String,
}

#[derive(Serialize)]
struct EnrolmentBody {
    id: uuid::Uuid,
    domain_id: uuid::Uuid,
    name: String,
    /// Returned once; only its hash is stored.
    token: String,
}

/// `POST /v1/domains/{domain_id}/nodes`
pub(super) async fn enroll_node(
    _: Operator,
    State(state): State<AppState>,
    Path(domain_id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let domain_id = parse_uuid(&domain_id, "domain_id")?;
    let request: EnrollNode = parse_json(body, OPERATOR_BODY_LIMIT)?;
    let name = access::NodeName::parse(request.name).map_err(bad_input)?;
    let enrolment = state
        .bounded("enrolling a node", state.access.enroll_node(domain_id.into(), name))
        .await?
        .map_err(|error| match error {
            access::EnrolError::UnknownDomain(_) => unknown_domain(domain_id),
            access::EnrolError::IssuanceRateLimited { retry_after } => ApiError::RateLimited {
                code: "issuance_rate_limited",
                message: "the domain's credential issuance budget is spent",
                retry_after,
            },
            error @ access::EnrolError::Unavailable(_) => ApiError::internal("enrolling a node", &error),
        })?;
    let body = EnrolmentBody {
        id: enrolment.node.id.as_uuid(),
        domain_id: enrolment.node.domain_id.as_uuid(),
        name: enrolment.node.name.as_str().to_owned(),
        token: enrolment.token.expose().to_owned(),
    };
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PutSecret {
    value: String,
}

/// `PUT /v1/domains/{domain_id}/secrets/{name}`
pub(super) async fn put_secret(
    _: Operator,
    State(state): State<AppState>,
    Path((domain_id, name)): Path<(String, String)>,
    body: Result<Bytes, BytesRejection>,
) -> Result<StatusCode, ApiError> {
    let domain_id = parse_uuid(&domain_id, "domain_id")?;
    let name = secrets::SecretName::parse(name).map_err(bad_input)?;
    let request: PutSecret = parse_json(body, OPERATOR_BODY_LIMIT)?;
    let value = secrets::SecretValue::new(request.value).map_err(bad_input)?;
    // Domains belong to the access context; the secrets context trusts its caller to have
    // checked, so a secret never lands under a Domain that does not exist.
    let domain = state
        .bounded("looking up a domain", state.access.find_domain(domain_id.into()))
        .await?
        .map_err(|error| ApiError::internal("looking up a domain", &error))?;
    if domain.is_none() {
        return Err(unknown_domain(domain_id));
    }
    state
        .bounded("writing a secret", state.secrets.write(domain_id.into(), name, value))
        .await?
        .map_err(|error| ApiError::internal("writing a secret", &error))?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Serialize)]
pub(super) struct BucketBody {
    scope: &'static str,
    tokens: f64,
    refilled_at: chrono::DateTime<chrono::Utc>,
}

/// `GET /v1/budgets/{key}`: every scope's bucket of one Node or Domain, as stored.
pub(super) async fn show_budgets(
    _: Operator,
    State(state): State<AppState>,
    Path(key): Path<String>,
) -> Result<Json<Vec<BucketBody>>, ApiError> {
    let key = parse_uuid(&key, "key")?;
    let buckets = state
        .bounded("reading budgets", state.budgets.buckets(key.into()))
        .await?
        .map_err(|error| ApiError::internal("reading budgets", &error))?;
    let body = buckets
        .into_iter()
        .map(|bucket| BucketBody {
            scope: bucket.scope.as_str(),
            tokens: bucket.tokens,
            refilled_at: bucket.refilled_at,
        })
        .collect();
    Ok(Json(body))
}
