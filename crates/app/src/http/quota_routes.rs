//! `GET /v1/quota/buckets?service=S`: a service's RLQS buckets (Envoy's Rate Limit Quota
//! Service) as every replica counts them, for the operator page: each bucket's rule and pool,
//! and each holder's demand, the share it was last sent and what that share counts now.
//!
//! Shares live in the database, shared by every replica, so any replica answers for all of
//! them; it needs the operator token like every operator route.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::Json;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::auth::Operator;
use super::error::ApiError;
use super::state::AppState;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct BucketsQuery {
    service: Option<String>,
}

#[derive(Serialize)]
pub(super) struct BucketsBody {
    service: String,
    buckets: Vec<BucketBody>,
}

#[derive(Serialize)]
struct BucketBody {
    key: uuid::Uuid,
    rule_id: String,
    rate: f64,
    burst: f64,
    /// The pool's tokens when it was last counted (`pool_at`), not accrued to now.
    pool: f64,
    pool_at: DateTime<Utc>,
    holders: Vec<HolderBody>,
}

#[derive(Serialize)]
struct HolderBody {
    holder: uuid::Uuid,
    replica: String,
    /// Requests a second over its last report; `null` for a newcomer.
    demand: Option<f64>,
    /// The token bucket last sent: tokens a second and max_tokens (0: DENY_ALL or none).
    rate: f64,
    max_tokens: f64,
    /// What it counts against the rule now, older assignments it may still use included.
    counted_rate: f64,
    counted_burst: f64,
    sent_at: Option<DateTime<Utc>>,
    expires_at: Option<DateTime<Utc>>,
    closed: bool,
}

/// `GET /v1/quota/buckets?service=S`: `S`'s RLQS buckets by rule, with their holders.
pub(super) async fn buckets(
    _: Operator,
    State(state): State<AppState>,
    query: Result<Query<BucketsQuery>, QueryRejection>,
) -> Result<Json<BucketsBody>, ApiError> {
    let Query(query) = query.map_err(|rejection| ApiError::bad_request(rejection.body_text()))?;
    let service = query
        .service
        .filter(|service| !service.is_empty())
        .ok_or_else(|| ApiError::bad_request("invalid service: required"))?;
    let service = rules::Service::parse(&service)?;
    let listed = state.bounded("listing quota buckets", state.quota.buckets(service.as_str())).await??;
    let buckets = listed
        .into_iter()
        .map(|bucket| BucketBody {
            key: bucket.key.as_uuid(),
            rule_id: bucket.rule_id,
            rate: bucket.rate,
            burst: bucket.burst,
            pool: bucket.pool,
            pool_at: bucket.pool_at,
            holders: bucket
                .holders
                .into_iter()
                .map(|holder| HolderBody {
                    holder: holder.holder,
                    replica: holder.replica,
                    demand: holder.demand,
                    rate: holder.rate,
                    max_tokens: holder.max_tokens,
                    counted_rate: holder.counted_rate,
                    counted_burst: holder.counted_burst,
                    sent_at: holder.sent_at,
                    expires_at: holder.expires_at,
                    closed: holder.closed,
                })
                .collect(),
        })
        .collect();
    Ok(Json(BucketsBody { service: service.as_str().to_owned(), buckets }))
}
