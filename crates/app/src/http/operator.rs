//! Operator routes: Domains (with their tiers and the limits that govern them), Node
//! enrolment and revocation, secret writes, reading a budget and the audit log. Every action
//! that changes something is recorded in the audit log, in the acting operator's name, once it
//! succeeded.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

use super::auth::Operator;
use super::bodies;
use super::error::unknown_domain;
use super::error::ApiError;
use super::extract::{parse_uuid, read_body, PathParams, NO_STORE, OPERATOR_BODY_LIMIT};
use super::fields::Fields;
use super::state::AppState;

#[derive(Serialize)]
pub(super) struct DomainBody {
    id: uuid::Uuid,
    name: String,
    tier: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    issuance_per_second: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    issuance_burst: Option<f64>,
}

fn domain_body(domain: &access::Domain) -> DomainBody {
    DomainBody {
        id: domain.id.as_uuid(),
        name: domain.name.as_str().to_owned(),
        tier: domain.tier.as_str(),
        issuance_per_second: None,
        issuance_burst: None,
    }
}

/// A Domain's tier from its text, a 400 naming `tier` otherwise.
fn tier(text: &str) -> Result<access::Tier, ApiError> {
    Ok(access::Tier::parse(text)?)
}

/// `POST /v1/domains` `{"name", "tier"?, "issuance_per_second"?, "issuance_burst"?}`: a Domain,
/// and its own issuance budget as its override rule ([`service::Operations::create_domain`]).
pub(super) async fn create_domain(
    Operator(actor): Operator,
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let request = bodies::new_domain(&read_body(body, OPERATOR_BODY_LIMIT)?)?;
    let new =
        service::operations::NewDomain { name: request.name, tier: request.tier, issuance: request.issuance };
    let created = state.bounded("creating a domain", state.operations.create_domain(actor, new)).await??;
    let body = DomainBody {
        issuance_per_second: created.issuance.as_ref().map(|spec| spec.limit().per_second()),
        issuance_burst: created.issuance.as_ref().map(|spec| spec.burst()),
        ..domain_body(&created.domain)
    };
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

/// `PATCH /v1/domains/{domain_id}` `{"tier"}`: moves the Domain to another tier, whose
/// templates govern it from then on (on every replica within a second).
pub(super) async fn patch_domain(
    Operator(actor): Operator,
    State(state): State<AppState>,
    PathParams(domain_id): PathParams<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<DomainBody>, ApiError> {
    let domain_id = parse_uuid(&domain_id, "domain_id")?;
    let mut fields = Fields::parse(body)?;
    let tier = tier(&fields.string("tier")?.ok_or_else(|| ApiError::bad_request("invalid tier: required"))?)?;
    fields.finish()?;
    let domain =
        state.bounded("setting a domain's tier", state.operations.set_tier(actor, domain_id, tier)).await??;
    Ok(Json(domain_body(&domain)))
}

#[derive(Serialize)]
pub(super) struct LimitsBody {
    domain_id: uuid::Uuid,
    tier: &'static str,
    rules_revision: i64,
    limits: Vec<LimitBody>,
}

#[derive(Serialize)]
struct LimitBody {
    scope: &'static str,
    per_second: f64,
    burst: f64,
    algorithm: &'static str,
    mode: &'static str,
    fail_mode: &'static str,
    governed_by: GovernedBy,
    outranked: Vec<RuleRank>,
}

/// The level that governs a scope, and the rule there that won (none for a knob default).
#[derive(Serialize)]
struct GovernedBy {
    level: &'static str,
    #[serde(flatten)]
    rule: Option<RuleFields>,
}

/// A rule that lost to the one governing, and the level it was at.
#[derive(Serialize)]
struct RuleRank {
    #[serde(flatten)]
    rule: RuleFields,
    level: &'static str,
}

/// What names a rule and ranks it at its level. It carries no level of its own: flattened
/// into [`GovernedBy`], a second `level` key made the object invalid for strict parsers.
#[derive(Serialize)]
struct RuleFields {
    rule_id: String,
    priority: i32,
    version: i64,
}

fn rule_fields(rule: &rules::Rule) -> RuleFields {
    RuleFields { rule_id: rule.id.to_string(), priority: rule.spec.priority(), version: rule.version.get() }
}

/// `GET /v1/domains/{domain_id}/limits`: what governs each scope for the Domain on this
/// replica now, and why: the level and rule that won (or the knob default), and the rules it
/// outranked.
pub(super) async fn domain_limits(
    _: Operator,
    State(state): State<AppState>,
    PathParams(domain_id): PathParams<String>,
) -> Result<Json<LimitsBody>, ApiError> {
    let domain_id = parse_uuid(&domain_id, "domain_id")?;
    let domain = state
        .bounded("looking up a domain", state.access.find_domain(domain_id.into()))
        .await??
        .ok_or_else(|| unknown_domain(domain_id))?;
    let (rules_revision, explained) = state.rule_budgets.explain(domain_id, domain.tier)?;
    let limits = explained
        .into_iter()
        .map(|explained| {
            let enforcement = explained.policy.enforcement;
            LimitBody {
                scope: explained.scope.as_str(),
                per_second: explained.policy.limit.per_second(),
                burst: explained.policy.limit.burst(),
                algorithm: explained.policy.algorithm.as_str(),
                mode: enforcement.mode.as_str(),
                fail_mode: enforcement.fail_mode.as_str(),
                governed_by: match &explained.governed_by {
                    Some((level, rule)) => {
                        GovernedBy { level: level.as_str(), rule: Some(rule_fields(rule)) }
                    }
                    None => GovernedBy { level: "knob_default", rule: None },
                },
                outranked: explained
                    .outranked
                    .iter()
                    .map(|(level, rule)| RuleRank { rule: rule_fields(rule), level: level.as_str() })
                    .collect(),
            }
        })
        .collect();
    Ok(Json(LimitsBody { domain_id, tier: domain.tier.as_str(), rules_revision, limits }))
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
    Operator(actor): Operator,
    State(state): State<AppState>,
    PathParams(domain_id): PathParams<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let domain_id = parse_uuid(&domain_id, "domain_id")?;
    let name = bodies::node_name(&read_body(body, OPERATOR_BODY_LIMIT)?)?;
    let enrolment =
        state.bounded("enrolling a node", state.operations.enrol_node(actor, domain_id, name)).await??;
    let body = EnrolmentBody {
        id: enrolment.node.id.as_uuid(),
        domain_id: enrolment.node.domain_id.as_uuid(),
        name: enrolment.node.name.as_str().to_owned(),
        token: enrolment.token.expose().to_owned(),
    };
    Ok((StatusCode::CREATED, NO_STORE, Json(body)).into_response())
}

/// `DELETE /v1/domains/{domain_id}/nodes/{node_id}`: the Node's token stops authenticating,
/// here at once and on every other replica as soon as the database's announcement reaches it.
pub(super) async fn revoke_node(
    Operator(actor): Operator,
    State(state): State<AppState>,
    PathParams((domain_id, node_id)): PathParams<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let domain_id = parse_uuid(&domain_id, "domain_id")?;
    let node_id = parse_uuid(&node_id, "node_id")?;
    let revoked =
        state.bounded("revoking a node", state.operations.revoke_node(actor, domain_id, node_id)).await?;
    // Revoked (whether or not its audit entry could be written): this replica stops trusting
    // the token at once; the others when the announcement reaches them.
    if !matches!(revoked, Err(service::OperationError::Revoke(_) | service::OperationError::Access(_))) {
        state.credentials.revoke(node_id.into());
    }
    revoked?;
    Ok(StatusCode::NO_CONTENT)
}

/// `PUT /v1/domains/{domain_id}/secrets/{name}`
pub(super) async fn put_secret(
    Operator(actor): Operator,
    State(state): State<AppState>,
    PathParams((domain_id, name)): PathParams<(String, String)>,
    body: Result<Bytes, BytesRejection>,
) -> Result<StatusCode, ApiError> {
    let domain_id = parse_uuid(&domain_id, "domain_id")?;
    let name = secrets::SecretName::parse(name)?;
    let value = bodies::secret_value(&read_body(body, OPERATOR_BODY_LIMIT)?)?;
    state
        .bounded(
            "writing a secret",
            state.operations.put_secret(actor, &state.secrets, domain_id, name, value),
        )
        .await??;
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
    let shown = state.bounded("reading budgets", state.operations.show_budgets(key)).await??;
    let body = shown
        .buckets
        .into_iter()
        .map(|bucket| BucketBody {
            scope: bucket.name.as_str(),
            tokens: bucket.tokens,
            refilled_at: bucket.refilled_at,
        })
        .collect();
    Ok(Json(body))
}

#[derive(Serialize)]
pub(super) struct ResetBody {
    existed: bool,
}

/// `DELETE /v1/budgets/{scope}/{key}`: forgets one bucket, so the next take on any replica
/// mints it full ([`service::Operations::reset_budget`]); an id of the other kind than the
/// scope's is a 400 and resets nothing.
pub(super) async fn reset_budget(
    Operator(actor): Operator,
    State(state): State<AppState>,
    PathParams((scope, key)): PathParams<(String, String)>,
) -> Result<Json<ResetBody>, ApiError> {
    let scope: ratebudget::Scope = scope.parse().map_err(ApiError::bad_request)?;
    let key = parse_uuid(&key, "key")?;
    let reset =
        state.bounded("resetting a budget", state.operations.reset_budget(actor, scope, key)).await??;
    Ok(Json(ResetBody { existed: reset.existed }))
}

#[derive(Serialize)]
pub(super) struct AuditEntryBody {
    id: i64,
    actor: String,
    action: &'static str,
    at: chrono::DateTime<chrono::Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    domain_id: Option<uuid::Uuid>,
    #[serde(skip_serializing_if = "Option::is_none")]
    node_id: Option<uuid::Uuid>,
    #[serde(skip_serializing_if = "Option::is_none")]
    secret_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rule_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rule_version: Option<i64>,
}

/// `GET /v1/audit?before=<id>&limit=<n>`: the audit log, newest first.
pub(super) async fn read_audit(
    _: Operator,
    State(state): State<AppState>,
    uri: Uri,
) -> Result<Json<Vec<AuditEntryBody>>, ApiError> {
    let page = bodies::audit_page(uri.query())?;
    let entries = state.bounded("reading the audit log", state.audit.read(page)).await??;
    let body = entries
        .into_iter()
        .map(|entry| AuditEntryBody {
            id: entry.id,
            actor: entry.actor.as_str().to_owned(),
            action: entry.action.as_str(),
            at: entry.at,
            domain_id: entry.subject.domain_id,
            node_id: entry.subject.node_id,
            secret_name: entry.subject.secret_name,
            rule_id: entry.subject.rule_id,
            rule_version: entry.subject.rule_version,
        })
        .collect();
    Ok(Json(body))
}
