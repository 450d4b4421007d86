//! The access context's adapters: its tables in PostgreSQL, and its issuance limiter bound to
//! the shared rate budgets.

use ratebudget::Statements;
use ratebudget::{Decision, Key, Scope, SingleBudget, Spender};
use uuid::Uuid;

use crate::{
    AccessRepository, AuthenticatedNode, BoxError, Domain, DomainId, DomainName, InsertDomainError,
    IssuanceLimitError, Limiter, Node, NodeId, NodeName, RepositoryError, Tier, TierDirectory, TokenHash,
};

/// The PostgreSQL channel a deleted Node is announced on, with its id as the payload (`*` when
/// the whole table was truncated). Migration 0032's trigger sends it, so every way a Node's row
/// goes (this adapter, or an operator's own SQL) reaches every replica's credential cache.
pub const NODE_REVOKED_CHANNEL: &str = "plexsphere_node_revoked";

/// What one issuance costs, in tokens of its Domain's bucket.
const ISSUANCE_COST: f64 = 1.0;

/// The channel every tier change is announced on, at commit; the payload is the revision the
/// change made. A listener that reconnects must assume it missed some.
pub const TIER_CHANNEL: &str = "plexsphere_domain_tiers";

/// Stores a Domain; one stored with a tier other than the default counts as a tier change: the
/// revision moves and listeners are told, in the same statement. The bump waits for the insert
/// (it reads `inserted`), so concurrent writers lock the domain row before the revision row,
/// always in that order.
const INSERT_DOMAIN: &str = "\
WITH inserted AS (
    INSERT INTO plexsphere.domains (id, name, tier)
    VALUES ($1, $2, $3)
    RETURNING tier
),
bumped AS (
    UPDATE plexsphere.domain_tier_revision
    SET revision = revision + 1
    WHERE EXISTS (SELECT 1 FROM inserted WHERE tier <> $4)
    RETURNING revision
),
told AS (
    SELECT pg_notify($5, revision::text)
    FROM bumped
)
SELECT count(*) AS told
FROM told";

/// The constraint that keeps Domain names unique.
const DOMAIN_NAME_UNIQUE: &str = "domains_name_key";

const FIND_DOMAIN_BY_NAME: &str = "\
SELECT id
FROM plexsphere.domains
WHERE name = $1";

/// Whether `error` is the database refusing a row by the constraint `name`.
fn is_violation_of(error: &sqlx::Error, name: &str) -> bool {
    error.as_database_error().and_then(|database| database.constraint()) == Some(name)
}

const FIND_DOMAIN: &str = "\
SELECT id, name, tier
FROM plexsphere.domains
WHERE id = $1";

/// Sets a Domain's tier; a change of the directory's revision and a notification, in one
/// statement, only when the Domain exists.
const SET_TIER: &str = "\
WITH updated AS (
    UPDATE plexsphere.domains
    SET tier = $2
    WHERE id = $1
    RETURNING id, name, tier
),
bumped AS (
    UPDATE plexsphere.domain_tier_revision
    SET revision = revision + 1
    WHERE EXISTS (SELECT 1 FROM updated)
    RETURNING revision
),
told AS (
    SELECT pg_notify($3, revision::text)
    FROM bumped
)
SELECT updated.id, updated.name, updated.tier, (SELECT count(*) FROM told) AS told
FROM updated";

/// The revision and every Domain off the default tier, read in one statement so the two agree
/// (the partial index `domains_tier_idx` holds exactly these Domains).
const TIERS: &str = "\
SELECT revision.revision, domains.id, domains.tier
FROM plexsphere.domain_tier_revision AS revision
LEFT JOIN plexsphere.domains AS domains
    ON domains.tier <> $1";

const FIND_NODE: &str = "\
SELECT id, domain_id, name
FROM plexsphere.nodes
WHERE id = $1";

const TIER_REVISION: &str = "\
SELECT revision
FROM plexsphere.domain_tier_revision";

/// Domains and Nodes in `plexsphere.domains` and `plexsphere.nodes`.
#[derive(Clone, Debug)]
pub struct PgAccessRepository {
    pool: Statements,
}

impl PgAccessRepository {
    /// A repository on `pool`, which must have the workspace's migrations applied: a `PgPool` connected
    /// directly, or [`Statements`] for one behind a transaction pooler.
    pub fn new(pool: impl Into<Statements>) -> PgAccessRepository {
        PgAccessRepository { pool: pool.into() }
    }
}

fn unavailable(error: impl std::error::Error + Send + Sync + 'static) -> RepositoryError {
    RepositoryError(Box::new(error))
}

/// A Domain from its stored columns. The table's CHECKs mirror the model's rules, so a row
/// failing them means the two have drifted apart: the store failing to answer, not a Domain.
fn domain_from_row((id, name, tier): (Uuid, String, String)) -> Result<Domain, RepositoryError> {
    let name = DomainName::parse(name).map_err(unavailable)?;
    let tier = Tier::parse(&tier).map_err(unavailable)?;
    Ok(Domain { id: id.into(), name, tier })
}

#[async_trait::async_trait]
impl AccessRepository for PgAccessRepository {
    #[tracing::instrument(level = "debug", skip_all, fields(domain = %domain.id))]
    async fn insert_domain(&self, domain: &Domain) -> Result<(), InsertDomainError> {
        let inserted = sqlx::query(INSERT_DOMAIN)
            .bind(domain.id.as_uuid())
            .bind(domain.name.as_str())
            .bind(domain.tier.as_str())
            .bind(Tier::DEFAULT.as_str())
            .bind(TIER_CHANNEL)
            .execute(&self.pool)
            .await;
        match inserted {
            Ok(_) => Ok(()),
            Err(error) if is_violation_of(&error, DOMAIN_NAME_UNIQUE) => {
                // Which Domain has it, for the caller to name: read after the refusal, so a
                // Domain renamed or deleted meanwhile makes this the store failing to answer.
                let existing: Option<Uuid> = sqlx::query_scalar(FIND_DOMAIN_BY_NAME)
                    .bind(domain.name.as_str())
                    .fetch_optional(&self.pool)
                    .await
                    .map_err(unavailable)?;
                match existing {
                    Some(existing) => Err(InsertDomainError::NameTaken { existing: existing.into() }),
                    None => Err(unavailable(error).into()),
                }
            }
            Err(error) => Err(unavailable(error).into()),
        }
    }

    #[tracing::instrument(level = "debug", skip_all, fields(domain = %id))]
    async fn find_domain(&self, id: DomainId) -> Result<Option<Domain>, RepositoryError> {
        let row: Option<(Uuid, String, String)> = sqlx::query_as(FIND_DOMAIN)
            .bind(id.as_uuid())
            .fetch_optional(&self.pool)
            .await
            .map_err(unavailable)?;
        row.map(domain_from_row).transpose()
    }

    #[tracing::instrument(level = "debug", skip_all, fields(domain = %id, %tier))]
    async fn set_tier(&self, id: DomainId, tier: Tier) -> Result<Option<Domain>, RepositoryError> {
        let row: Option<(Uuid, String, String, i64)> = sqlx::query_as(SET_TIER)
            .bind(id.as_uuid())
            .bind(tier.as_str())
            .bind(TIER_CHANNEL)
            .fetch_optional(&self.pool)
            .await
            .map_err(unavailable)?;
        row.map(|(id, name, tier, _)| domain_from_row((id, name, tier))).transpose()
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn tiers(&self) -> Result<TierDirectory, RepositoryError> {
        let rows: Vec<(i64, Option<Uuid>, Option<String>)> = sqlx::query_as(TIERS)
            .bind(Tier::DEFAULT.as_str())
            .fetch_all(&self.pool)
            .await
            .map_err(unavailable)?;
        let revision = rows.first().map(|(revision, _, _)| *revision).ok_or_else(|| {
            RepositoryError("plexsphere.domain_tier_revision holds no row; migration 0055 adds it".into())
        })?;
        let mut tiers = Vec::with_capacity(rows.len());
        for (_, id, tier) in rows {
            if let (Some(id), Some(tier)) = (id, tier) {
                tiers.push((DomainId::from(id), Tier::parse(&tier).map_err(unavailable)?));
            }
        }
        Ok(TierDirectory { revision, tiers })
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn tier_revision(&self) -> Result<i64, RepositoryError> {
        sqlx::query_scalar(TIER_REVISION).fetch_one(&self.pool).await.map_err(unavailable)
    }

    #[tracing::instrument(level = "debug", skip_all, fields(node = %id))]
    async fn find_node(&self, id: NodeId) -> Result<Option<Node>, RepositoryError> {
        let row: Option<(Uuid, Uuid, String)> = sqlx::query_as(FIND_NODE)
            .bind(id.as_uuid())
            .fetch_optional(&self.pool)
            .await
            .map_err(unavailable)?;
        // The table's CHECK mirrors the model's rule, as for Domains: a name that does not
        // parse is the store failing to answer, not a Node.
        row.map(|(id, domain_id, name)| {
            Ok(Node {
                id: id.into(),
                domain_id: domain_id.into(),
                name: NodeName::parse(name).map_err(unavailable)?,
            })
        })
        .transpose()
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
/// [`Scope::AccessIssuanceDomain`], one token per issuance, sized by the policy the spender's
/// budgets give for the Domain.
#[derive(Clone, Debug)]
pub struct RateBudgetIssuanceLimiter(SingleBudget);

impl RateBudgetIssuanceLimiter {
    /// A limiter spending through `spender`.
    pub fn new(spender: Spender) -> RateBudgetIssuanceLimiter {
        RateBudgetIssuanceLimiter(spender.single(Scope::AccessIssuanceDomain))
    }
}

#[async_trait::async_trait]
impl Limiter for RateBudgetIssuanceLimiter {
    #[tracing::instrument(level = "debug", skip_all, fields(%domain))]
    async fn spend_issuance(&self, domain: DomainId) -> Result<(), IssuanceLimitError> {
        // Every failure below is "could not answer": no policy to be had, a zero id, or the
        // store itself. None of them may tell a caller it hit a cap.
        let unavailable = |error: BoxError| IssuanceLimitError::Unavailable(error);
        let key = Key::from(domain.as_uuid());
        match self.0.spend(key, key, ISSUANCE_COST).await.map_err(|e| unavailable(e.into()))? {
            Decision::Granted(_) => Ok(()),
            Decision::Refused(refusal) => {
                Err(IssuanceLimitError::RateLimited { retry_after: refusal.retry_after })
            }
            // An issuance costs one and every budget's burst is at least one.
            Decision::InsufficientCapacity(never) => Err(unavailable(never.into())),
        }
    }
}
