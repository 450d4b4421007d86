//! The access context's adapters: its tables in PostgreSQL, and its issuance limiter bound to
//! the shared rate budgets.

use std::sync::Arc;

use ratebudget::{Budget, Clock, Key, Scope, Store};
use sqlx::PgPool;
use uuid::Uuid;

use crate::{
    AccessRepository, AuthenticatedNode, Domain, DomainId, DomainName, IssuanceLimitError, IssuancePolicy,
    Limiter, Node, RepositoryError, TokenHash,
};

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
    store: Store,
    clock: Arc<dyn Clock>,
    default_budget: Budget,
}

impl RateBudgetIssuanceLimiter {
    /// A limiter on `store`, deciding at `clock`'s now, sizing the buckets of Domains without
    /// a policy of their own with `default_budget`.
    pub fn new(store: Store, clock: Arc<dyn Clock>, default_budget: Budget) -> RateBudgetIssuanceLimiter {
        RateBudgetIssuanceLimiter { store, clock, default_budget }
    }
}

#[async_trait::async_trait]
impl Limiter for RateBudgetIssuanceLimiter {
    async fn spend_issuance(
        &self,
        domain: DomainId,
        policy: Option<IssuancePolicy>,
    ) -> Result<(), IssuanceLimitError> {
        let budget = policy
            .map(|policy| Budget { per_second: policy.per_second(), burst: policy.burst() })
            .unwrap_or(self.default_budget);
        let granted = self
            .store
            .take(
                Scope::AccessIssuanceDomain,
                Key::from(domain.as_uuid()),
                ISSUANCE_COST,
                budget,
                self.clock.now(),
            )
            .await
            // Every store error is "could not answer", validation errors included: an unusable
            // budget is misconfiguration, and must not tell callers they hit a cap.
            .map_err(|error| IssuanceLimitError::Unavailable(Box::new(error)))?;
        if granted {
            return Ok(());
        }
        Err(IssuanceLimitError::RateLimited { retry_after: budget.retry_after(ISSUANCE_COST) })
    }
}
