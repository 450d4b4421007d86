//! The quota allocator's store ([`service::quota::QuotaStore`]): one call of
//! `plexsphere.quota_assign` a report of a bucket (the migration `20261205100000` holds the
//! accounting and says why it is exact), on the same statements as the API's.

use async_trait::async_trait;
use ratebudget::{BoxError, Statements};
use service::quota::{Allotment, Allotted, QuotaStore, ShareRequest};
use uuid::Uuid;

/// The allocator's tables, through `statements`.
#[derive(Clone, Debug)]
pub struct PgQuotaStore {
    statements: Statements,
}

impl PgQuotaStore {
    /// The store on `statements`.
    pub fn new(statements: Statements) -> PgQuotaStore {
        PgQuotaStore { statements }
    }
}

const ASSIGN: &str = "SELECT decision, max_tokens, tokens_per_fill, prior_rate, prior_burst \
     FROM plexsphere.quota_assign($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)";

#[async_trait]
impl QuotaStore for PgQuotaStore {
    async fn assign(&self, request: &ShareRequest) -> Result<Allotted, BoxError> {
        let settings = request.settings;
        let budget = &request.budget;
        let (requests, elapsed) = match request.usage {
            Some(usage) => (usage.allowed.saturating_add(usage.denied), usage.elapsed.as_secs_f64()),
            None => (0, 0.0),
        };
        // An abandon leaves the share's numbers NULL.
        type Row = (String, Option<i64>, Option<i64>, Option<f64>, Option<f64>);
        let (decision, max_tokens, tokens_per_fill, prior_rate, prior_burst): Row = sqlx::query_as(ASSIGN)
            .bind(budget.key.as_uuid())
            .bind(&request.service)
            .bind(&budget.rule_id)
            .bind(budget.rate)
            .bind(budget.burst)
            .bind(request.holder)
            .bind(&request.replica)
            .bind(request.usage.is_some())
            .bind(i64::try_from(requests).unwrap_or(i64::MAX))
            .bind(elapsed)
            .bind(i32::try_from(budget.fill_seconds).unwrap_or(i32::MAX))
            .bind(i32::try_from(settings.ttl.as_secs()).unwrap_or(i32::MAX))
            .bind(settings.max_round_trip.as_secs_f64())
            .bind(settings.reserve)
            .bind(settings.headroom)
            .bind(settings.burst_share)
            .bind(settings.idle_after.as_secs_f64())
            .fetch_one(&self.statements)
            .await?;
        let whole = |value: Option<i64>| u32::try_from(value.unwrap_or(0).max(0)).unwrap_or(u32::MAX);
        let decision = match decision.as_str() {
            "token_bucket" => Allotment::TokenBucket {
                max_tokens: whole(max_tokens),
                tokens_per_fill: whole(tokens_per_fill),
            },
            "deny" => Allotment::Deny,
            "abandon" => Allotment::Abandon,
            other => return Err(format!("quota_assign answered an unknown decision {other:?}").into()),
        };
        Ok(Allotted {
            decision,
            prior_rate: prior_rate.unwrap_or(0.0),
            prior_burst: prior_burst.unwrap_or(0.0),
        })
    }

    async fn close(&self, holder: Uuid) -> Result<(), BoxError> {
        sqlx::query("SELECT plexsphere.quota_close($1)").bind(holder).execute(&self.statements).await?;
        Ok(())
    }
}
