//! The decide API over HTTP: `POST /v1/decide` (the request and answer of Envoy's rate limit
//! service protocol, as JSON) and `GET /v1/snapshot` (a service's compiled rules, for a load
//! balancer). Both need a decide token (`PLEXSPHERE_DECIDE_TOKENS`; the snapshot takes an
//! operator's too), and are off while no decide token is configured. A decide token asks only
//! for the services it names (every service but plexsphere's own when it names none): another
//! is 403, and plexsphere's own snapshot needs an operator's token. `POST /v1/decide/reset` is
//! an operator's: it forgets the bucket one descriptor is decided in.

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{FromRequestParts, Query, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};

use super::auth::{bearer, Operator};
use super::error::ApiError;
use super::extract::{read_body, OPERATOR_BODY_LIMIT};
use super::rule_routes::{rule_body, RuleBody};
use super::state::AppState;
use rules::Services;
use service::decide::{Answer, Descriptor, Entry, Override, Request, Status, Unit};

/// A caller with a decide token, and the services it may ask for; extracting it answers 404
/// while the decide API is off, and 401 for anyone without one.
pub(super) struct DecideCaller(Services);

impl FromRequestParts<AppState> for DecideCaller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        if state.decide_tokens.is_empty() {
            return Err(decide_off());
        }
        // A 401 spends from the client address's failure budget (throttle.rs), as any other.
        let (name, services) =
            bearer(parts).and_then(|token| state.decide_tokens.find(token)).ok_or(ApiError::Unauthorized)?;
        tracing::Span::current().record("operator", tracing::field::display(&name));
        Ok(DecideCaller(services))
    }
}

fn decide_off() -> ApiError {
    ApiError::NotFound {
        code: "decide_off",
        message: "the decide API is off: the service sets no PLEXSPHERE_DECIDE_TOKENS".into(),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RequestBody {
    domain: String,
    #[serde(default)]
    descriptors: Vec<DescriptorBody>,
    #[serde(default)]
    hits_addend: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DescriptorBody {
    entries: Vec<EntryBody>,
    #[serde(default)]
    hits_addend: Option<u64>,
    #[serde(default)]
    limit: Option<LimitOverrideBody>,
}

/// Envoy's `RateLimitOverride` as JSON: `{"requests_per_unit", "unit": "SECOND" ... "YEAR"}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitOverrideBody {
    requests_per_unit: u32,
    unit: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EntryBody {
    key: String,
    value: String,
}

#[derive(Serialize)]
pub(super) struct AnswerBody {
    overall_code: &'static str,
    statuses: Vec<StatusBody>,
    response_headers_to_add: Vec<HeaderBody>,
}

#[derive(Serialize)]
struct StatusBody {
    code: &'static str,
    current_limit: Option<LimitBody>,
    limit_remaining: Option<u32>,
    duration_until_reset_ms: Option<u64>,
    rule_id: Option<String>,
}

#[derive(Serialize)]
struct LimitBody {
    name: String,
    requests_per_unit: u32,
    unit: &'static str,
}

#[derive(Serialize)]
struct HeaderBody {
    key: &'static str,
    value: String,
}

fn status_body(status: &Status) -> StatusBody {
    StatusBody {
        code: status.code.as_str(),
        rule_id: status.current_limit.as_ref().map(|limit| limit.rule_id.clone()),
        current_limit: status.current_limit.as_ref().map(|limit| LimitBody {
            name: limit.rule_id.clone(),
            requests_per_unit: limit.requests_per_unit,
            unit: limit.unit.as_str(),
        }),
        limit_remaining: status.limit_remaining,
        duration_until_reset_ms: status
            .until_reset
            .map(|until| until.as_millis().try_into().unwrap_or(u64::MAX)),
    }
}

fn answer_body(answer: Answer) -> AnswerBody {
    AnswerBody {
        overall_code: answer.overall.as_str(),
        statuses: answer.statuses.iter().map(status_body).collect(),
        response_headers_to_add: answer
            .headers
            .into_iter()
            .map(|(key, value)| HeaderBody { key, value })
            .collect(),
    }
}

/// `POST /v1/decide`: Envoy's `RateLimitRequest` as JSON (`domain`, `descriptors` of `entries`,
/// `hits_addend`), answered with its `RateLimitResponse` as JSON, 200 whether or not it is
/// over the limit; 400 for a request malformed as a message (no domain, a descriptor without
/// entries), 403 for a service the token does not name, 500 when a rule that fails closed
/// could not be decided.
pub(super) async fn decide(
    DecideCaller(services): DecideCaller,
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<AnswerBody>, ApiError> {
    let body = read_body(body, OPERATOR_BODY_LIMIT)?;
    let parsed: RequestBody = serde_json::from_slice(&body)
        .map_err(|error| ApiError::bad_request(format!("malformed decide request: {error}")))?;
    let request = Request {
        service: parsed.domain,
        descriptors: parsed
            .descriptors
            .into_iter()
            .map(|descriptor| Descriptor {
                entries: descriptor
                    .entries
                    .into_iter()
                    .map(|entry| Entry { key: entry.key, value: entry.value })
                    .collect(),
                hits_addend: descriptor.hits_addend,
                // An override in a unit Envoy does not name is no override, as over gRPC: the
                // rules decide, rather than an error Envoy would admit.
                limit: descriptor.limit.and_then(|limit| {
                    Some(Override {
                        requests_per_unit: limit.requests_per_unit,
                        unit: Unit::parse(&limit.unit)?,
                    })
                }),
            })
            .collect(),
        hits_addend: parsed.hits_addend,
    };
    let answer = state.bounded("deciding", state.decide.decide(&services, &request)).await??;
    Ok(Json(answer_body(answer)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SnapshotQuery {
    service: String,
}

#[derive(Serialize)]
struct SnapshotBody {
    service: String,
    revision: i64,
    precedence: &'static str,
    rules: Vec<RuleBody>,
}

/// `GET /v1/snapshot?service=S`: the service's rules as this replica decides by them, with the
/// snapshot's revision as the `ETag`; `If-None-Match` naming it answers 304.
pub(super) async fn snapshot(
    State(state): State<AppState>,
    headers: HeaderMap,
    query: Result<Query<SnapshotQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(crate::edge::tokens::bearer_token);
    // An operator sees every service's rules, its own among them; a decide caller only those
    // of the services it decides for.
    let services = match presented {
        Some(token) if state.operator_tokens.find(token).is_some() => None,
        Some(token) => Some(state.decide_tokens.find(token).ok_or(ApiError::Unauthorized)?.1),
        None => return Err(ApiError::Unauthorized),
    };
    let Query(query) = query.map_err(|rejection| ApiError::bad_request(rejection.body_text()))?;
    let service = rules::Service::parse(&query.service)?;
    if services.is_some_and(|services| !services.permits(service.as_str())) {
        return Err(ApiError::Forbidden {
            message: format!("this decide token does not decide for service {service}; plexsphere's own rules need an operator token"),
        });
    }
    let compiled = state.rule_budgets.compiled_rules()?;
    let revision = compiled.snapshot.revision();
    let etag = format!("\"{revision}\"");
    let tag = HeaderValue::from_str(&etag).map_err(ApiError::internal)?;
    let unchanged = headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .any(|candidate| candidate.trim() == etag || candidate.trim() == "*");
    if unchanged {
        return Ok((StatusCode::NOT_MODIFIED, [(header::ETAG, tag)]).into_response());
    }
    let body = SnapshotBody {
        service: service.as_str().to_owned(),
        revision,
        precedence: "for a request's api and attributes (descriptor entries, general to specific): among the rules whose api is the request's or \"*\" and whose selector pairs are all among its attributes, the one naming the latest attribute wins, then one naming it with an exact value over \"*\", then a named api over \"*\", then the higher priority, then the smaller rule_id; the winner's bucket is keyed by the attributes it names (\"*\": one bucket per value) and by its api unless that is \"*\"",
        rules: compiled.snapshot.service_rules(service.as_str()).into_iter().map(rule_body).collect(),
    };
    Ok((StatusCode::OK, [(header::ETAG, tag)], Json(body)).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ResetBody {
    domain: String,
    entries: Vec<EntryBody>,
}

#[derive(Serialize)]
pub(super) struct ServiceResetBody {
    existed: bool,
    rule_id: String,
}

/// `POST /v1/decide/reset` `{"domain", "entries": [{"key", "value"}, ...]}`: forgets the bucket
/// that descriptor is decided in, by the rule that governs it now, on every replica (audited);
/// 404 `ungoverned` when no rule governs it.
pub(super) async fn reset(
    Operator(actor): Operator,
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<ServiceResetBody>, ApiError> {
    let body = read_body(body, OPERATOR_BODY_LIMIT)?;
    let parsed: ResetBody = serde_json::from_slice(&body)
        .map_err(|error| ApiError::bad_request(format!("malformed reset request: {error}")))?;
    if parsed.domain.is_empty() || parsed.entries.is_empty() {
        return Err(ApiError::bad_request("a reset names a domain and at least one entry"));
    }
    let entries: Vec<Entry> =
        parsed.entries.into_iter().map(|entry| Entry { key: entry.key, value: entry.value }).collect();
    let reset = state
        .bounded(
            "resetting a service's bucket",
            state.operations.reset_service_bucket(actor, &parsed.domain, &entries),
        )
        .await??;
    Ok(Json(ServiceResetBody { existed: reset.existed, rule_id: reset.rule_id.to_string() }))
}
