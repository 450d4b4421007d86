//! The quota allocator's store ([`service::quota::QuotaStore`]): one call of
//! `plexsphere.quota_assign` a report of a bucket (the migration `20261205100000` holds the
//! accounting and says why it is exact), on the same statements as the API's; and the
//! operator's listing of a service's buckets, in one statement.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use ratebudget::{BoxError, Key, Statements};
use service::quota::{Allotment, Allotted, QuotaBucket, QuotaHolder, QuotaStore, ShareRequest};
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
     FROM plexsphere.quota_assign($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20)";

/// A service's buckets, each with its holders (a bucket without one: a row of NULL share
/// columns). Every share is counted at one instant, the database's clock as
/// `plexsphere.quota_assign` reads it; `clock_timestamp()` in a subquery of its own is
/// evaluated once, not once a row.
const BUCKETS: &str = "SELECT b.key, b.rule_id, b.rate, b.burst, b.pool, b.pool_at,
       s.holder, s.replica, s.demand,
       s.tokens_per_fill::double precision / s.fill_seconds, s.burst,
       plexsphere.quota_counted_rate(s, counted.at), plexsphere.quota_counted_burst(s, counted.at),
       s.sent_at, s.expires_at, s.closed_at IS NOT NULL
FROM plexsphere.quota_buckets b
CROSS JOIN (SELECT clock_timestamp() AS at) counted
LEFT JOIN plexsphere.quota_shares s ON s.key = b.key
WHERE b.service = $1
ORDER BY b.rule_id, b.key, s.replica, s.holder";

/// A row of [`BUCKETS`]: the bucket's columns, then its holder's (all NULL without one).
type BucketRow = (
    Uuid,
    String,
    f64,
    f64,
    f64,
    DateTime<Utc>,
    Option<Uuid>,
    Option<String>,
    Option<f64>,
    Option<f64>,
    Option<f64>,
    Option<f64>,
    Option<f64>,
    Option<DateTime<Utc>>,
    Option<DateTime<Utc>>,
    Option<bool>,
);

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
            .bind(request.holder.holder)
            .bind(request.holder.stream)
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
            .bind(request.holder.unsure)
            .bind(request.holder.builds_full)
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

    async fn close(&self, stream: Uuid) -> Result<(), BoxError> {
        sqlx::query("SELECT plexsphere.quota_close($1)").bind(stream).execute(&self.statements).await?;
        Ok(())
    }

    async fn sweep(&self) -> Result<u64, BoxError> {
        let deleted: i64 =
            sqlx::query_scalar("SELECT plexsphere.quota_sweep()").fetch_one(&self.statements).await?;
        Ok(u64::try_from(deleted).unwrap_or(0))
    }

    async fn buckets(&self, service: &str) -> Result<Vec<QuotaBucket>, BoxError> {
        let rows: Vec<BucketRow> = sqlx::query_as(BUCKETS).bind(service).fetch_all(&self.statements).await?;
        let mut buckets: Vec<QuotaBucket> = Vec::new();
        for row in rows {
            let (key, rule_id, rate, burst, pool, pool_at, holder, replica, demand) =
                (row.0, row.1, row.2, row.3, row.4, row.5, row.6, row.7, row.8);
            let (assigned_rate, max_tokens, counted_rate, counted_burst) = (row.9, row.10, row.11, row.12);
            let (sent_at, expires_at, closed) = (row.13, row.14, row.15);
            // Rows come ordered by bucket: a holder belongs to the last bucket when its key is.
            if buckets.last().is_none_or(|last| last.key.as_uuid() != key) {
                let holders = Vec::new();
                buckets.push(QuotaBucket {
                    key: Key::from(key),
                    rule_id,
                    rate,
                    burst,
                    pool,
                    pool_at,
                    holders,
                });
            }
            let (Some(holder), Some(replica), Some(bucket)) = (holder, replica, buckets.last_mut()) else {
                continue;
            };
            bucket.holders.push(QuotaHolder {
                holder,
                replica,
                demand,
                rate: assigned_rate.unwrap_or(0.0),
                max_tokens: max_tokens.unwrap_or(0.0),
                counted_rate: counted_rate.unwrap_or(0.0),
                counted_burst: counted_burst.unwrap_or(0.0),
                sent_at,
                expires_at,
                closed: closed.unwrap_or(false),
            });
        }
        Ok(buckets)
    }
}
