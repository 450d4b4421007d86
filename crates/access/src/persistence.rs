//! The access context's adapters: its tables in PostgreSQL, and its issuance limiter bound to
//! the shared rate budgets.

use ratebudget::{Decision, Key, Limit, Scope, Spend, Spender, Take};
use sqlx::PgPool;
use uuid::Uuid;

use crate::{
    AccessRepository, AuthenticatedNode, BoxError, Domain, DomainId, DomainName, IssuanceLimitError,
    IssuancePolicy, Limiter, Node, NodeId, RepositoryError, TokenHash,
};

/// The PostgreSQL channel a deleted Node is announced on, with its id as the payload (`*` when
/// the whole table was truncated). Migration 0032's trigger sends it, so every way a Node's row
/// goes (this adapter, or an operator's own SQL) reaches every replica's credential cache.
pub const NODE_REVOKED_CHANNEL: &str = "plexsphere_node_revoked";

/// What one issuance costs, in tokens of its Domain's bucket.
const ISSUANCE_COST: f64 = 1.0;

/// Domains and Nodes in `plexsphere.domains` and `plexsphere.nodes`.
#[derive(Clone, Debug)]
pub struct PgAccessRepository {
    pool: PgPool,
}

impl PgAccessRepository {
    /// A repository on `pool`, which must have the workspace's migrations applied.
    pub fn new(pool: PgPool) -> PgAccessRepository {
        PgAccessRepository { pool }
    }
}

fn unavailable(error: impl std::error::Error + Send + Sync + 'static) -> RepositoryError {
    RepositoryError(Box::new(error))
}

#[async_trait::async_trait]
impl AccessRepository for PgAccessRepository {
    #[tracing::instrument(level = "debug", skip_all, fields(domain = %domain.id))]
    async fn insert_domain(&self, domain: &Domain) -> Result<(), RepositoryError> {
        let policy = domain.issuance_policy;
        sqlx::query(
            "INSERT INTO plexsphere.domains (id, name, issuance_per_second, issuance_burst)
             VALUES ($1, $2, $3, $4)",
        )
        .bind(domain.id.as_uuid())
        .bind(domain.name.as_str())
        .bind(policy.map(|policy| policy.per_second()))
        .bind(policy.map(|policy| policy.burst()))
        .execute(&self.pool)
        .await
        .map_err(unavailable)?;
        Ok(())
    }

    #[tracing::instrument(level = "debug", skip_all, fields(domain = %id))]
    async fn find_domain(&self, id: DomainId) -> Result<Option<Domain>, RepositoryError> {
        let row: Option<(Uuid, String, Option<f64>, Option<f64>)> = sqlx::query_as(
            "SELECT id, name, issuance_per_second, issuance_burst
             FROM plexsphere.domains
             WHERE id = $1",
        )
        .bind(id.as_uuid())
        .fetch_optional(&self.pool)
        .await
        .map_err(unavailable)?;
        let Some((id, name, per_second, burst)) = row else {
            return Ok(None);
        };
        // The table's CHECKs mirror these rules, so a row failing them means the two have
        // drifted apart; that is the store failing to answer, not a Domain to hand out.
        let name = DomainName::parse(name).map_err(unavailable)?;
        let issuance_policy = match (per_second, burst) {
            (None, None) => None,
            (Some(per_second), Some(burst)) => {
                Some(IssuancePolicy::new(per_second, burst).map_err(unavailable)?)
            }
            _ => return Err(RepositoryError("domain row holds half an issuance policy".into())),
        };
        Ok(Some(Domain { id: id.into(), name, issuance_policy }))
    }

    #[tracing::instrument(level = "debug", skip_all, fields(node = %node.id, domain = %node.domain_id))]
    async fn insert_node(&self, node: &Node, token_hash: &TokenHash) -> Result<(), RepositoryError> {
        sqlx::query(
            "INSERT INTO plexsphere.nodes (id, domain_id, name, token_hash)
             VALUES ($1, $2, $3, $4)",
        )
        .bind(node.id.as_uuid())
        .bind(node.domain_id.as_uuid())
        .bind(node.name.as_str())
        .bind(&token_hash.as_bytes()[..])
        .execute(&self.pool)
        .await
        .map_err(unavailable)?;
        Ok(())
    }

    #[tracing::instrument(level = "debug", skip_all, fields(%domain, %node))]
    async fn delete_node(&self, domain: DomainId, node: NodeId) -> Result<bool, RepositoryError> {
        // The trigger of migration 0032 announces the deletion when this commits.
        let deleted = sqlx::query(
            "DELETE FROM plexsphere.nodes
             WHERE id = $1
               AND domain_id = $2",
        )
        .bind(node.as_uuid())
        .bind(domain.as_uuid())
        .execute(&self.pool)
        .await
        .map_err(unavailable)?;
        Ok(deleted.rows_affected() == 1)
    }

    // The hash is not the token, but it is what authenticates: it stays out of the span too.
    #[tracing::instrument(level = "debug", skip_all)]
    async fn find_node_by_token(
        &self,
        token_hash: &TokenHash,
    ) -> Result<Option<AuthenticatedNode>, RepositoryError> {
        let row: Option<(Uuid, Uuid)> = sqlx::query_as(
            "SELECT id, domain_id
             FROM plexsphere.nodes
             WHERE token_hash = $1",
        )
        .bind(&token_hash.as_bytes()[..])
        .fetch_optional(&self.pool)
        .await
        .map_err(unavailable)?;
        Ok(row.map(|(node_id, domain_id)| AuthenticatedNode {
            node_id: node_id.into(),
            domain_id: domain_id.into(),
        }))
    }
}

/// The issuance [`Limiter`] on the shared rate budgets: one bucket per Domain under
/// [`Scope::AccessIssuanceDomain`], one token per issuance.
#[derive(Clone, Debug)]
pub struct RateBudgetIssuanceLimiter {
    spender: Spender,
    default_limit: Limit,
}

impl RateBudgetIssuanceLimiter {
    /// A limiter spending through `spender`, sizing the buckets of Domains without a policy
    /// of their own with `default_limit`.
    pub fn new(spender: Spender, default_limit: Limit) -> RateBudgetIssuanceLimiter {
        RateBudgetIssuanceLimiter { spender, default_limit }
    }
}

#[async_trait::async_trait]
impl Limiter for RateBudgetIssuanceLimiter {
    #[tracing::instrument(level = "debug", skip_all, fields(%domain))]
    async fn spend_issuance(
        &self,
        domain: DomainId,
        policy: Option<IssuancePolicy>,
    ) -> Result<(), IssuanceLimitError> {
        // Every failure below is "could not answer": a policy the store's rules refuse (the
        // table's CHECK keeps one from being stored), a zero id, or the store itself. None of
        // them may tell a caller it hit a cap.
        let unavailable = |error: BoxError| IssuanceLimitError::Unavailable(error);
        let limit = match policy {
            Some(policy) => {
                Limit::new(policy.per_second(), policy.burst()).map_err(|e| unavailable(e.into()))?
            }
            None => self.default_limit,
        };
        let key = Key::from(domain.as_uuid());
        let take =
            Take::Single(Spend { scope: Scope::AccessIssuanceDomain, key, cost: ISSUANCE_COST, limit });
        match self.spender.spend(take).await.map_err(|e| unavailable(e.into()))? {
            Decision::Granted(_) => Ok(()),
            Decision::Refused(refusal) => {
                Err(IssuanceLimitError::RateLimited { retry_after: refusal.retry_after })
            }
            // An issuance costs one and every policy's burst is at least one.
            Decision::InsufficientCapacity(never) => Err(unavailable(never.into())),
        }
    }
}
