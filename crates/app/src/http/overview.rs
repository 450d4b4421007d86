//! What the operator page (`/ui`) reads, as two operator routes any client may call:
//! `GET /v1/status`, this replica's view of the deployment (its rules snapshot, the leader,
//! its decisions by outcome), and `GET /v1/fill/{key}`, a Domain's or a Node's buckets now
//! and over the last minutes.
//!
//! Both need the operator token like every operator route; the page itself holds no data
//! (docs/adr/0027).

use axum::extract::State;
use axum::Json;
use chrono::{DateTime, Utc};
use serde::Serialize;

use super::auth::Operator;
use super::error::unknown_domain;
use super::error::ApiError;
use super::extract::{parse_uuid, PathParams};
use super::state::AppState;
use crate::observation::fill::FillHistory;

#[derive(Serialize)]
pub(super) struct StatusBody {
    rules: RulesBody,
    leader: LeaderBody,
    decisions: Vec<DecisionCount>,
    precheck_buckets: u64,
    store_failing: bool,
    /// The buckets this replica holds a lease of (docs/adr/0034), most held first.
    leased: Vec<LeasedBody>,
}

#[derive(Serialize)]
struct LeasedBody {
    budget: &'static str,
    key: uuid::Uuid,
    /// Tokens leased and not granted yet.
    held: f64,
}

#[derive(Serialize)]
struct RulesBody {
    loaded: bool,
    snapshot_version: i64,
    snapshot_age_seconds: f64,
    tiers_version: i64,
}

#[derive(Serialize)]
struct LeaderBody {
    this_replica: bool,
    /// Whether the database said who holds the lock; `holder` is `null` with this `true` when
    /// nobody leads.
    holder_known: bool,
    holder: Option<HolderBody>,
}

#[derive(Serialize)]
struct HolderBody {
    pid: i32,
    client_addr: Option<String>,
    session_started_at: Option<DateTime<Utc>>,
}

#[derive(Serialize)]
struct DecisionCount {
    scope: &'static str,
    outcome: &'static str,
    count: u64,
}

/// `GET /v1/status`: this replica's rules snapshot, who leads, and the decisions it counted
/// since it started, by scope and outcome (the counter `/metrics` exposes).
///
/// The leader's session is asked of the database; when the database does not answer, the rest
/// still does (`holder_known: false`): the page is most wanted during an outage.
pub(super) async fn status(_: Operator, State(state): State<AppState>) -> Json<StatusBody> {
    let reading = state.rule_budgets.reading();
    let holder = match state.bounded("looking up the leader", state.leader.holder()).await {
        Ok(Ok(holder)) => Some(holder),
        Ok(Err(error)) => {
            tracing::warn!(error = %ratebudget::cause_chain(&error), "cannot look up the leader's session");
            None
        }
        Err(_) => None,
    };
    let decisions = state
        .metrics
        .decision_counts()
        .into_iter()
        .map(|(scope, outcome, count)| DecisionCount {
            scope: scope.as_str(),
            outcome: outcome.as_str(),
            count,
        })
        .collect();
    Json(StatusBody {
        rules: RulesBody {
            loaded: state.rule_budgets.loaded(),
            snapshot_version: reading.snapshot_version,
            snapshot_age_seconds: reading.snapshot_age_seconds,
            tiers_version: reading.tiers_version,
        },
        leader: LeaderBody {
            this_replica: state.metrics.leading(),
            holder_known: holder.is_some(),
            holder: holder.flatten().map(|session| HolderBody {
                pid: session.pid,
                client_addr: session.client_addr,
                session_started_at: session.session_started_at,
            }),
        },
        decisions,
        precheck_buckets: reading.precheck_buckets,
        store_failing: state.guard.store_failing(),
        leased: leased(&state.guard),
    })
}

/// The buckets `guard` holds leases of, the most held first, at most the page's worth.
fn leased(guard: &ratebudget::Guard) -> Vec<LeasedBody> {
    let mut leased = guard.leased_buckets();
    leased.sort_by(|a, b| b.2.total_cmp(&a.2));
    leased
        .into_iter()
        .take(50)
        .map(|(budget, key, held)| LeasedBody { budget: budget.as_str(), key: key.as_uuid(), held })
        .collect()
}

#[derive(Serialize)]
pub(super) struct FillBody {
    key: uuid::Uuid,
    kind: &'static str,
    name: String,
    domain_id: uuid::Uuid,
    domain_name: String,
    tier: &'static str,
    rules_revision: i64,
    now: DateTime<Utc>,
    slot_seconds: u64,
    window_seconds: u64,
    buckets: Vec<BucketFill>,
}

#[derive(Serialize)]
struct BucketFill {
    scope: &'static str,
    algorithm: &'static str,
    per_second: f64,
    burst: f64,
    /// The level now, from the shared table refilled to now (`null` for a GCRA budget, which
    /// has no bucket).
    tokens: Option<f64>,
    /// Whether the table holds a row; an absent bucket is full.
    stored: bool,
    history: Vec<SlotBody>,
}

#[derive(Serialize)]
struct SlotBody {
    at: DateTime<Utc>,
    tokens: f64,
    min_tokens: f64,
    granted: u32,
    refused: u32,
    shadow_refused: u32,
}

/// `GET /v1/fill/{key}`: every bucket of one Domain or Node, with its level now (everyone's
/// spending, from the shared table) and the levels this replica's own decisions left in it
/// over the last ten minutes, in ten-second slots.
pub(super) async fn fill(
    _: Operator,
    State(state): State<AppState>,
    PathParams(key): PathParams<String>,
) -> Result<Json<FillBody>, ApiError> {
    let key = parse_uuid(&key, "key")?;
    let (kind, name, domain) =
        match state.bounded("looking up a domain", state.access.find_domain(key.into())).await?? {
            Some(domain) => ("domain", domain.name.as_str().to_owned(), domain),
            None => {
                let node = state
                    .bounded("looking up a node", state.access.find_node(key.into()))
                    .await??
                    .ok_or_else(|| ApiError::NotFound {
                        code: "unknown_key",
                        message: format!("no domain or node {key}"),
                    })?;
                let domain_id = node.domain_id.as_uuid();
                let domain = state
                    .bounded("looking up a domain", state.access.find_domain(node.domain_id))
                    .await??
                    .ok_or_else(|| unknown_domain(domain_id))?;
                ("node", node.name.as_str().to_owned(), domain)
            }
        };
    let (rules_revision, explained) = state.rule_budgets.explain(domain.id.as_uuid(), domain.tier)?;
    let stored = state.bounded("reading budgets", state.store.buckets(key.into())).await??;
    let now = state.decision_clock.now();
    let buckets = explained
        .into_iter()
        .filter(|explained| explained.scope.is_per_domain() == (kind == "domain"))
        .map(|explained| {
            let (scope, limit) = (explained.scope, explained.policy.limit);
            let row = stored.iter().find(|bucket| bucket.name == scope.name());
            let (algorithm, tokens) = match explained.policy.algorithm {
                ratebudget::Algorithm::TokenBucket => {
                    let level = row.map_or(limit.burst(), |row| {
                        limit
                            .level(ratebudget::Fill { tokens: row.tokens, refilled_at: row.refilled_at }, now)
                    });
                    (explained.policy.algorithm.as_str(), Some(level))
                }
                ratebudget::Algorithm::Gcra => (explained.policy.algorithm.as_str(), None),
            };
            let history = state
                .fill
                .read(scope, key.into(), now)
                .into_iter()
                .map(|slot| SlotBody {
                    at: slot.at,
                    tokens: slot.tokens,
                    min_tokens: slot.min_tokens,
                    granted: slot.granted,
                    refused: slot.refused,
                    shadow_refused: slot.shadow_refused,
                })
                .collect();
            BucketFill {
                scope: scope.as_str(),
                algorithm,
                per_second: limit.per_second(),
                burst: limit.burst(),
                tokens,
                stored: row.is_some(),
                history,
            }
        })
        .collect();
    Ok(Json(FillBody {
        key,
        kind,
        name,
        domain_id: domain.id.as_uuid(),
        domain_name: domain.name.as_str().to_owned(),
        tier: domain.tier.as_str(),
        rules_revision,
        now,
        slot_seconds: FillHistory::SLOT.as_secs(),
        window_seconds: FillHistory::window().as_secs(),
        buckets,
    }))
}
