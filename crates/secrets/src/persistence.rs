//! The adapters binding the secrets context's ports to PostgreSQL: the secret store on
//! `plexsphere.secrets`, and the read limiter on the shared rate budgets.
//!
//! This is the only module of the context that names `sqlx` or `ratebudget`.

use ratebudget::{Decision, Key, PairBudget, Refusal, Scope, Spender, Which};
use sqlx::PgPool;

use crate::{
    DomainId, Limiter, ReadLimitError, Reader, RepositoryError, SecretName, SecretRepository, SecretValue,
};

/// What one read costs from each of its two budgets.
const READ_COST: f64 = 1.0;

const PUT: &str = "\
INSERT INTO plexsphere.secrets (domain_id, name, value, updated_at)
VALUES ($1, $2, $3, now())
ON CONFLICT (domain_id, name) DO UPDATE
SET value = EXCLUDED.value,
    updated_at = EXCLUDED.updated_at";

const GET: &str = "\
SELECT value
FROM plexsphere.secrets
WHERE domain_id = $1
  AND name = $2";

/// The secret store on `plexsphere.secrets`.
#[derive(Clone, Debug)]
pub struct PgSecretRepository {
    pool: PgPool,
}

impl PgSecretRepository {
    /// A store on `pool`, which must have the workspace's migrations applied.
    pub fn new(pool: PgPool) -> PgSecretRepository {
        PgSecretRepository { pool }
    }
}

#[async_trait::async_trait]
impl SecretRepository for PgSecretRepository {
    #[tracing::instrument(level = "debug", skip_all, fields(%domain, name = %name))]
    async fn put(
        &self,
        domain: DomainId,
        name: &SecretName,
        value: &SecretValue,
    ) -> Result<(), RepositoryError> {
        sqlx::query(PUT)
            .bind(domain.as_uuid())
            .bind(name.as_str())
            .bind(value.expose())
            .execute(&self.pool)
            .await
            .map_err(|error| RepositoryError(error.into()))?;
        Ok(())
    }

    #[tracing::instrument(level = "debug", skip_all, fields(%domain, name = %name))]
    async fn get(&self, domain: DomainId, name: &SecretName) -> Result<Option<SecretValue>, RepositoryError> {
        let stored: Option<String> = sqlx::query_scalar(GET)
            .bind(domain.as_uuid())
            .bind(name.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(|error| RepositoryError(error.into()))?;
        // The table's CHECK holds the value rule, so a stored value that fails it means the
        // table is not what this build expects: the store is broken, the secret is not absent.
        stored.map(SecretValue::new).transpose().map_err(|invalid| RepositoryError(invalid.into()))
    }
}

/// The read limiter on the shared rate budgets: one read costs one token from the Node's
/// `secret_read_node` bucket and one from its Domain's `secret_read_domain` bucket.
///
/// Both are taken in one two-budget take, all-or-nothing (docs/adr/0002). Two separate takes
/// would make a refusal cost the other budget: a Domain at its cap would still drain the
/// Node's bucket for reads it never got, and a Node at its own cap would still spend its
/// Domain's budget, starving the Domain's other Nodes. A refund after the fact could be
/// skipped by a crash or a timeout between the two calls.
///
/// Both budgets are sized by the policies the spender's budgets give for the reader's Domain,
/// asked on every read. `now` is read from the spender's clock on every call, so tests drive
/// refills with a [`ratebudget::ManualClock`]. Every error is [`ReadLimitError::Unavailable`],
/// validation errors included: they mean this adapter was handed a zero id, and must never
/// read as a refusal. So is a read that no bucket could ever cover (a burst below one read),
/// which is misconfiguration rather than a cap reached.
#[derive(Clone, Debug)]
pub struct RateBudgetReadLimiter(PairBudget);

impl RateBudgetReadLimiter {
    /// A limiter spending through `spender`.
    pub fn new(spender: Spender) -> RateBudgetReadLimiter {
        // The Node's budget goes first, so `Which::First` names the Node.
        RateBudgetReadLimiter(spender.pair(Scope::SecretReadNode, Scope::SecretReadDomain))
    }
}

#[async_trait::async_trait]
impl Limiter for RateBudgetReadLimiter {
    #[tracing::instrument(level = "debug", skip_all, fields(node = %reader.node, domain = %reader.domain))]
    async fn spend_read(&self, reader: Reader) -> Result<(), ReadLimitError> {
        let domain = Key::from(reader.domain.as_uuid());
        let decision = self.0.spend(reader.node.as_uuid().into(), domain, domain, READ_COST).await;
        match decision.map_err(|error| ReadLimitError::Unavailable(error.into()))? {
            Decision::Granted(_) => Ok(()),
            Decision::Refused(Refusal { which: Which::First, retry_after, .. }) => {
                Err(ReadLimitError::NodeRateLimited { retry_after })
            }
            Decision::Refused(Refusal { which: Which::Second, retry_after, .. }) => {
                Err(ReadLimitError::DomainRateLimited { retry_after })
            }
            Decision::InsufficientCapacity(never) => Err(ReadLimitError::Unavailable(never.into())),
        }
    }
}
