//! Operator routes: Domains, Node enrolment, secret writes and reading a budget.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};

use super::auth::Operator;
use super::error::unknown_domain;
use super::{parse_json, parse_uuid, ApiError, AppState, PathParams, NO_STORE, OPERATOR_BODY_LIMIT};

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
        let name = access::DomainName::parse(self.name)?;
        let issuance_policy = match (self.issuance_per_second, self.issuance_burst) {
            (None, None) => None,
            (Some(per_second), Some(burst)) => {
                // The policy sizes a rate budget, so the store's rules apply as well as the
                // access context's (an hour to refill at most, arithmetic that stays finite);
                // the table's CHECK holds the same comparisons, so a policy that passes here
                // is stored.
                ratebudget::Limit::new(per_second, burst).map_err(|invalid| {
                    ApiError::bad_request(format!("invalid issuance_{}: {}", invalid.field, invalid.reason))
                })?;
                Some(access::IssuancePolicy::new(per_second, burst).map_err(|invalid| {
                    ApiError::bad_request(format!("invalid issuance_{}: {}", invalid.field, invalid.reason))
                })?)
            }
            _ => {
                return Err(ApiError::bad_request(
                    "issuance_per_second and issuance_burst go together: give both or neither",
                ))
            }
        };
        Ok(access::NewDomain { name, issuance_policy })
    }
}

/// `POST /v1/domains`
pub(super) async fn create_domain(
    _: Operator,
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let new_domain = parse_json::<CreateDomain>(body, OPERATOR_BODY_LIMIT)?.try_into_domain()?;
    let domain = state.bounded("creating a domain", state.access.create_domain(new_domain)).await??;
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
pub(super) struct EnrolNode {
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
pub(super) async fn enrol_node(
    _: Operator,
    State(state): State<AppState>,
    PathParams(domain_id): PathParams<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let domain_id = parse_uuid(&domain_id, "domain_id")?;
    let request: EnrolNode = parse_json(body, OPERATOR_BODY_LIMIT)?;
    let name = access::NodeName::parse(request.name)?;
    let enrolment =
        state.bounded("enrolling a node", state.access.enrol_node(domain_id.into(), name)).await??;
    let body = EnrolmentBody {
        id: enrolment.node.id.as_uuid(),
        domain_id: enrolment.node.domain_id.as_uuid(),
        name: enrolment.node.name.as_str().to_owned(),
        token: enrolment.token.expose().to_owned(),
    };
    Ok((StatusCode::CREATED, NO_STORE, Json(body)).into_response())
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
    PathParams((domain_id, name)): PathParams<(String, String)>,
    body: Result<Bytes, BytesRejection>,
) -> Result<StatusCode, ApiError> {
    let domain_id = parse_uuid(&domain_id, "domain_id")?;
    let name = secrets::SecretName::parse(name)?;
    let request: PutSecret = parse_json(body, OPERATOR_BODY_LIMIT)?;
    let value = secrets::SecretValue::new(request.value)?;
    // Domains belong to the access context; the secrets context trusts its caller to have
    // checked, so a secret never lands under a Domain that does not exist.
    let domain = state.bounded("looking up a domain", state.access.find_domain(domain_id.into())).await??;
    if domain.is_none() {
        return Err(unknown_domain(domain_id));
    }
    state.bounded("writing a secret", state.secrets.write(domain_id.into(), name, value)).await??;
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
    PathParams(key): PathParams<String>,
) -> Result<Json<Vec<BucketBody>>, ApiError> {
    let key = parse_uuid(&key, "key")?;
    let buckets = state.bounded("reading budgets", state.budgets.buckets(key.into())).await??;
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
