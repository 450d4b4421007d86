//! Operator routes for rate-budget rules: write under `If-Match`, read, list, history,
//! rollback, delete, and usage.
//!
//! A rule is JSON in and out; its `ETag` is its version in quotes. Writing through this
//! replica reloads this replica's snapshot before answering, so the writer's next request here
//! is decided by what it wrote; the other replicas hear of it by notification.

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::auth::Operator;
use super::error::ApiError;
use super::error::{set_etag, unknown_rule};
use super::extract::PathParams;
use super::fields::Fields;
use super::state::AppState;

/// A rule as the API shows it.
#[derive(Serialize)]
pub(super) struct RuleBody {
    rule_id: String,
    #[serde(flatten)]
    spec: SpecBody,
    version: i64,
    created_by: String,
    updated_at: DateTime<Utc>,
}

/// A rule's content as the API shows it: this project's own rules have a `scope`, other
/// services' an `api`.
#[derive(Serialize)]
pub(super) struct SpecBody {
    service: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    api: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    scope: Option<&'static str>,
    selector: Value,
    /// How it matches a request: `selector` (its attributes among the request's), or
    /// `descriptor_path` (a file's path, entry by entry, to the descriptor's full depth).
    matching: &'static str,
    /// A file's rule: its path and what its file says (`null` for any other rule).
    #[serde(skip_serializing_if = "Option::is_none")]
    descriptor: Option<Value>,
    /// Where it came from: `api` (written by `PUT`), or the file it was applied from.
    source: String,
    /// `null` for a file's rule that never spends (unlimited, no limit, 0 a unit).
    rate: Option<f64>,
    per_ms: Option<u32>,
    burst: Option<f64>,
    algorithm: &'static str,
    mode: &'static str,
    fail_mode: &'static str,
    priority: i32,
    /// `WHEN_COVERED`, or `ALWAYS`: costs charged whatever the bucket holds (docs/adr/0040).
    charge: &'static str,
}

pub(super) fn selector_json(selector: rules::Selector) -> Value {
    match selector {
        rules::Selector::AllDomains => Value::Object(Map::new()),
        rules::Selector::Tier(tier) => serde_json::json!({ "tier": tier.as_str() }),
        rules::Selector::Domain(domain) => serde_json::json!({ "domain": domain }),
    }
}

/// A rule's selector as the API shows it: `{}`, `{"tier": ...}`, `{"domain": ...}`, or a
/// service's attributes.
pub(super) fn target_selector_json(target: &rules::Target) -> Value {
    match target {
        rules::Target::Own { selector, .. } => selector_json(*selector),
        rules::Target::Service { selector, .. } => Value::Object(
            selector
                .pairs()
                .iter()
                .map(|(attribute, pattern)| (attribute.to_string(), Value::from(pattern.as_str())))
                .collect(),
        ),
        rules::Target::Descriptor(_) => Value::Object(Map::new()),
    }
}

/// A file rule's path and what its file says, as the API shows them.
fn descriptor_json(rule: &rules::DescriptorRule) -> Value {
    let path: Vec<Value> = rule
        .path
        .iter()
        .map(|entry| {
            let mut level = Map::new();
            level.insert("key".into(), Value::from(&*entry.key));
            if let Some(value) = &entry.value {
                level.insert("value".into(), Value::from(&**value));
            }
            if entry.share_threshold {
                level.insert("share_threshold".into(), Value::Bool(true));
            }
            Value::Object(level)
        })
        .collect();
    let limit = match rule.limit {
        rules::PathLimit::PerUnit { requests_per_unit, unit } => {
            serde_json::json!({ "requests_per_unit": requests_per_unit, "unit": unit.as_str() })
        }
        rules::PathLimit::Unlimited => serde_json::json!({ "unlimited": true }),
        rules::PathLimit::Unset => Value::Null,
    };
    serde_json::json!({
        "path": path,
        "stats_key": rule.stats_key(),
        "rate_limit": limit,
        "name": rule.name,
        "replaces": rule.replaces,
        "shadow_mode": rule.shadow_mode,
        "quota_mode": rule.quota_mode,
        "detailed_metric": rule.detailed_metric,
        "value_to_metric": rule.value_to_metric,
    })
}

pub(super) fn spec_body(spec: &rules::RuleSpec) -> SpecBody {
    let target = spec.target();
    SpecBody {
        service: target.service().to_owned(),
        api: match target {
            rules::Target::Service { api, .. } => Some(api.as_str().to_owned()),
            rules::Target::Own { .. } | rules::Target::Descriptor(_) => None,
        },
        scope: spec.scope().map(ratebudget::Scope::as_str),
        selector: target_selector_json(target),
        matching: if spec.descriptor().is_some() { "descriptor_path" } else { "selector" },
        descriptor: spec.descriptor().map(descriptor_json),
        source: spec.descriptor().map_or_else(|| "api".to_owned(), |rule| rule.source.clone()),
        rate: spec.spends().then_some(spec.rate()),
        per_ms: spec.spends().then_some(spec.per_ms()),
        burst: spec.spends().then_some(spec.burst()),
        algorithm: spec.algorithm().as_str(),
        mode: spec.mode().as_str(),
        fail_mode: spec.fail_mode().as_str(),
        priority: spec.priority(),
        charge: spec.charge().as_str(),
    }
}

pub(super) fn rule_body(rule: &rules::Rule) -> RuleBody {
    RuleBody {
        rule_id: rule.id.to_string(),
        spec: spec_body(&rule.spec),
        version: rule.version.get(),
        created_by: rule.created_by.as_str().to_owned(),
        updated_at: rule.updated_at,
    }
}

/// A rule with `status`, and its version as the `ETag`.
fn rule_response(status: StatusCode, rule: &rules::Rule) -> Response {
    let mut response = (status, Json(rule_body(rule))).into_response();
    set_etag(&mut response, rule.version);
    response
}

/// The answer to a write (which reloaded this replica's rules, so that it governs its next
/// decision): 201 for a rule that did not exist before, 200 otherwise.
fn written(put: &rules::Put) -> Response {
    let status = if matches!(put, rules::Put::Created(_)) { StatusCode::CREATED } else { StatusCode::OK };
    rule_response(status, put.rule())
}

fn required<T>(value: Option<T>, name: &'static str) -> Result<T, ApiError> {
    value.ok_or_else(|| ApiError::bad_request(format!("invalid {name}: required")))
}

/// A rule's content from a `PUT` body: `rate` and `burst` required; `per_ms`, `algorithm`,
/// `mode`, `fail_mode`, `priority` and `charge` defaulted; `service` defaulted to `plexsphere`, whose
/// rules require `scope` and `selector` (`{}`, a tier or a Domain), where another service's
/// take `api` (defaulted to `*`) and require `selector` (a flat object of strings).
fn parse_rule(body: Result<Bytes, BytesRejection>) -> Result<rules::RuleSpec, ApiError> {
    let mut fields = Fields::parse(body)?;
    let service = fields.string("service")?.filter(|service| service != rules::OWN_SERVICE);
    let (service, scope, selector) = match service {
        None => {
            if fields.0.contains_key("api") {
                return Err(ApiError::bad_request(
                    "invalid api: plexsphere's own rules name a scope; only another service's rules name an api",
                ));
            }
            let scope = required(fields.string("scope")?, "scope")?;
            (None, scope, required(fields.selector()?, "selector")?)
        }
        Some(service) => {
            if fields.0.contains_key("scope") {
                return Err(ApiError::bad_request(
                    "invalid scope: only plexsphere's own rules name a scope; another service's rules name an api",
                ));
            }
            let api = fields.string("api")?;
            let shape = "a flat object of string values, such as {} or {\"tenant\": \"contoso\"}";
            let selector = required(fields.selector_pairs(shape)?, "selector")?;
            (Some(rules::ServiceDraft { service, api, selector }), String::new(), rules::Selector::AllDomains)
        }
    };
    let draft = rules::RuleDraft {
        service,
        scope,
        selector,
        rate: required(fields.number("rate")?, "rate")?,
        per_ms: fields.integer("per_ms")?,
        burst: required(fields.number("burst")?, "burst")?,
        algorithm: fields.string("algorithm")?,
        mode: fields.string("mode")?,
        fail_mode: fields.string("fail_mode")?,
        priority: fields.integer("priority")?,
        charge: fields.string("charge")?,
    };
    fields.finish()?;
    Ok(draft.validate()?)
}

/// The version `If-Match` names, if the request sent one.
fn if_match(headers: &HeaderMap) -> Result<Option<rules::Version>, ApiError> {
    let Some(value) = headers.get(header::IF_MATCH) else {
        return Ok(None);
    };
    let text = value.to_str().map_err(|_| ApiError::bad_request("invalid If-Match: not text"))?;
    rules::Version::from_etag(text)
        .map(Some)
        .map_err(|invalid| ApiError::bad_request(format!("invalid If-Match: {}", invalid.reason)))
}

fn rule_id(raw: String) -> Result<rules::RuleId, ApiError> {
    Ok(rules::RuleId::parse(raw)?)
}

/// `PUT /v1/rules/{rule_id}`: creates the rule (201), or with `If-Match: "<version>"`
/// replaces that version of it (200).
pub(super) async fn put_rule(
    operator: Operator,
    State(state): State<AppState>,
    PathParams(id): PathParams<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let id = rule_id(id)?;
    let spec = parse_rule(body)?;
    let if_match = if_match(&headers)?;
    let put = state
        .bounded("writing a rule", state.operations.put_rule(operator.0, &id, &spec, if_match))
        .await??;
    Ok(written(&put))
}

/// `GET /v1/rules/{rule_id}`
pub(super) async fn get_rule(
    _: Operator,
    State(state): State<AppState>,
    PathParams(id): PathParams<String>,
) -> Result<Response, ApiError> {
    let id = rule_id(id)?;
    let rule = state.bounded("reading a rule", state.rules.get(&id)).await??.ok_or_else(unknown_rule)?;
    Ok(rule_response(StatusCode::OK, &rule))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ListQuery {
    scope: Option<String>,
    service: Option<String>,
}

/// `GET /v1/rules?scope=...&service=...`: every rule, or every rule of one scope or one
/// service, by id.
pub(super) async fn list_rules(
    _: Operator,
    State(state): State<AppState>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<Vec<RuleBody>>, ApiError> {
    let Query(query) = query.map_err(|rejection| ApiError::bad_request(rejection.body_text()))?;
    let scope = query
        .scope
        .map(|scope| scope.parse::<ratebudget::Scope>())
        .transpose()
        .map_err(|error| ApiError::bad_request(format!("invalid scope: {error}")))?;
    let service = query.service.map(|service| rules::Service::parse(&service)).transpose()?;
    let rules = state
        .bounded("listing rules", state.rules.list(scope, service.as_ref().map(rules::Service::as_str)))
        .await??;
    Ok(Json(rules.iter().map(rule_body).collect()))
}

#[derive(Serialize)]
pub(super) struct VersionBody {
    version: i64,
    change: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    rolled_back_to: Option<i64>,
    #[serde(flatten)]
    spec: SpecBody,
    created_by: String,
    created_at: DateTime<Utc>,
    revision: i64,
}

/// `GET /v1/rules/{rule_id}/history`: every version, oldest first, with who made it and when.
pub(super) async fn rule_history(
    _: Operator,
    State(state): State<AppState>,
    PathParams(id): PathParams<String>,
) -> Result<Json<Vec<VersionBody>>, ApiError> {
    let id = rule_id(id)?;
    let versions = state
        .bounded("reading a rule's history", state.rules.history(&id))
        .await??
        .ok_or_else(unknown_rule)?;
    let body = versions
        .iter()
        .map(|version| VersionBody {
            version: version.version.get(),
            change: version.change.as_str(),
            rolled_back_to: match version.change {
                rules::Change::RolledBack { to } => Some(to.get()),
                _ => None,
            },
            spec: spec_body(&version.spec),
            created_by: version.created_by.as_str().to_owned(),
            created_at: version.created_at,
            revision: version.revision,
        })
        .collect();
    Ok(Json(body))
}

/// `POST /v1/rules/{rule_id}/rollback` `{"version"}`: writes a new version with that
/// version's content (201 when it recreates a deleted rule, else 200); `If-Match` optional.
pub(super) async fn rollback_rule(
    operator: Operator,
    State(state): State<AppState>,
    PathParams(id): PathParams<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let id = rule_id(id)?;
    let mut fields = Fields::parse(body)?;
    let to = rules::Version::new(required(fields.integer("version")?, "version")?)?;
    fields.finish()?;
    let if_match = if_match(&headers)?;
    let put = state
        .bounded("rolling back a rule", state.operations.rollback_rule(operator.0, &id, to, if_match))
        .await??;
    Ok(written(&put))
}

/// `DELETE /v1/rules/{rule_id}` with `If-Match`: 204.
pub(super) async fn delete_rule(
    operator: Operator,
    State(state): State<AppState>,
    PathParams(id): PathParams<String>,
    headers: HeaderMap,
) -> Result<StatusCode, ApiError> {
    let id = rule_id(id)?;
    let Some(if_match) = if_match(&headers)? else {
        // Read only to say which version to name: the deletion itself is conditional.
        let rule = state.bounded("reading a rule", state.rules.get(&id)).await??.ok_or_else(unknown_rule)?;
        return Err(rules::WriteError::PreconditionRequired { current: rule.version }.into());
    };
    state.bounded("deleting a rule", state.operations.delete_rule(operator.0, &id, if_match)).await??;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct UsageQuery {
    since: Option<DateTime<Utc>>,
}

#[derive(Serialize)]
pub(super) struct UsageBody {
    minute: DateTime<Utc>,
    granted: u64,
    refused: u64,
    shadow_refused: u64,
}

/// How far back `GET /v1/rules/{rule_id}/usage` looks when no `since` is given.
const USAGE_LOOKBACK: chrono::TimeDelta = chrono::TimeDelta::hours(1);

/// `GET /v1/rules/{rule_id}/usage?since=<RFC 3339>`: decisions per minute, summed over every
/// replica, from `since` (an hour ago by the replicas' clock, by default) on.
pub(super) async fn rule_usage(
    _: Operator,
    State(state): State<AppState>,
    PathParams(id): PathParams<String>,
    query: Result<Query<UsageQuery>, QueryRejection>,
) -> Result<Json<Vec<UsageBody>>, ApiError> {
    let id = rule_id(id)?;
    let Query(query) = query.map_err(|rejection| ApiError::bad_request(rejection.body_text()))?;
    let since = query.since.unwrap_or_else(|| state.decision_clock.now() - USAGE_LOOKBACK);
    let minutes = state
        .bounded("reading a rule's usage", state.rules.usage(&id, since))
        .await??
        .ok_or_else(unknown_rule)?;
    let body = minutes
        .into_iter()
        .map(|minute| UsageBody {
            minute: minute.minute,
            granted: minute.granted,
            refused: minute.refused,
            shadow_refused: minute.shadow_refused,
        })
        .collect();
    Ok(Json(body))
}
