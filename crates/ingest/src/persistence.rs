//! The adapters that bind ingest's ports to PostgreSQL: the batch table, and the shared rate
//! budgets as the two ingest quotas.
//!
//! This is the only module of the context that names `sqlx` or `ratebudget`.

use ratebudget::Statements;
use ratebudget::{Decision, Key, PairBudget, Scope, Spender, Which};

use crate::{BatchId, BatchRepository, Limiter, Quota, QuotaError, RepositoryError, Sender};

/// Batches in `plexsphere.ingest_batches`.
#[derive(Clone, Debug)]
pub struct PgBatchRepository {
    pool: Statements,
}

impl PgBatchRepository {
    /// A repository on `pool`, which must have the workspace's migrations applied: a `PgPool` connected
    /// directly, or [`Statements`] for one behind a transaction pooler.
    pub fn new(pool: impl Into<Statements>) -> PgBatchRepository {
        PgBatchRepository { pool: pool.into() }
    }
}

#[async_trait::async_trait]
impl BatchRepository for PgBatchRepository {
    #[tracing::instrument(level = "debug", skip_all, fields(id = ?id, node = %sender.node, domain = %sender.domain))]
    async fn insert(&self, id: BatchId, sender: Sender, payload: &[u8]) -> Result<(), RepositoryError> {
        // byte_count is written rather than derived so the batch list can be summed without
        // reading payloads; the table's CHECK keeps it equal to the payload's length.
        let byte_count = i64::try_from(payload.len()).map_err(|error| RepositoryError(Box::new(error)))?;
        // One statement on the pool runs in its own transaction, so it is committed when
        // execute returns. received_at is left to its default, the statement's timestamp.
        sqlx::query(
            "INSERT INTO plexsphere.ingest_batches (id, node_id, domain_id, byte_count, payload)
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(id.as_uuid())
        .bind(sender.node.as_uuid())
        .bind(sender.domain.as_uuid())
        .bind(byte_count)
        .bind(payload)
        .execute(&self.pool)
        .await
        .map_err(|error| RepositoryError(Box::new(error)))?;
        Ok(())
    }
}

/// The ingest quotas as two shared rate budgets: `ingest_node` keyed by the Node and
/// `ingest_domain` keyed by its Domain, each costing the batch's bytes.
///
/// Both are spent in one two-budget take, all-or-nothing (docs/adr/0002). Two single takes in
/// a row would either lose the Node's debit when the Domain refuses (the Node pays for a batch
/// that was never accepted) or need a refund that a crash or timeout between the two can
/// skip, and would cost a second round trip on every batch. Both are sized by the policies
/// the spender's budgets give for the sender's Domain, asked on every batch.
#[derive(Clone, Debug)]
pub struct RateBudgetQuotaLimiter {
    quotas: PairBudget,
}

impl RateBudgetQuotaLimiter {
    /// A limiter spending through `spender` (its budgets in bytes and bytes per second).
    pub fn new(spender: Spender) -> RateBudgetQuotaLimiter {
        RateBudgetQuotaLimiter { quotas: spender.pair(Scope::IngestNode, Scope::IngestDomain) }
    }
}

#[async_trait::async_trait]
impl Limiter for RateBudgetQuotaLimiter {
    #[tracing::instrument(level = "debug", skip_all, fields(node = %sender.node, domain = %sender.domain, bytes))]
    async fn spend_bytes(&self, sender: Sender, bytes: u64) -> Result<(), QuotaError> {
        // Exact up to 2^53 bytes, far beyond any batch a server accepts.
        let (node, domain, cost) =
            (Key::from(sender.node.as_uuid()), Key::from(sender.domain.as_uuid()), bytes as f64);
        // Any error, validation included, means the quotas were not evaluated: it must fail
        // closed as an outage, never read as a refusal.
        let decision = self
            .quotas
            .spend(node, domain, domain, cost)
            .await
            .map_err(|error| QuotaError::Unavailable(Box::new(error)))?;
        let quota = |which| if which == Which::First { Quota::Node } else { Quota::Domain };
        match decision {
            Decision::Granted(_) => Ok(()),
            Decision::Refused(refusal) => {
                Err(QuotaError::Exceeded { quota: quota(refusal.which), retry_after: refusal.retry_after })
            }
            // A burst is a whole number of bytes in any sane configuration; rounding down
            // reports a limit the batch really exceeds.
            Decision::InsufficientCapacity(never) => Err(QuotaError::LargerThanQuota {
                quota: quota(never.which),
                burst: never.burst.floor() as u64,
            }),
        }
    }
}
