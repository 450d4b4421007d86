//! The adapters binding the secrets context's ports to PostgreSQL: the secret store on
//! `plexsphere.secrets`, and the read limiter on the shared rate budgets.
//!
//! This is the only module of the context that names `sqlx` or `ratebudget`.

use ratebudget::Statements;
use ratebudget::{Decision, Key, PairBudget, Refusal, Scope, Spender, Which};

use uuid::Uuid;

use crate::{
    DomainId, KeyId, Limiter, ReadLimitError, Reader, RepositoryError, Sealed, SecretCache, SecretName,
    SecretRef, SecretRepository, SecretValue, StoredSecret, StoredValue,
};

/// The channel every change to a secret is announced on (migration 0010's trigger), with
/// `domain_id:name` as the payload, or `*` after a TRUNCATE.
pub const SECRET_CHANGED_CHANNEL: &str = "plexsphere_secret_changed";

/// What one read costs from each of its two budgets.
const READ_COST: f64 = 1.0;

/// Every write seals: the plain-text column is cleared, so a row written before sealing and
/// then overwritten holds no trace of its old value.
const PUT: &str = "\
INSERT INTO plexsphere.secrets (domain_id, name, value, key_id, nonce, ciphertext, updated_at)
VALUES ($1, $2, NULL, $3, $4, $5, now())
ON CONFLICT (domain_id, name) DO UPDATE
SET value = NULL,
    key_id = EXCLUDED.key_id,
    nonce = EXCLUDED.nonce,
    ciphertext = EXCLUDED.ciphertext,
    updated_at = EXCLUDED.updated_at";

const GET: &str = "\
SELECT value, key_id, nonce, ciphertext
FROM plexsphere.secrets
WHERE domain_id = $1
  AND name = $2";

/// Secrets not sealed under the key `$1` (plain-text rows have no key id), in primary-key
/// order after the cursor `($2, $3)` when one is given.
const NOT_SEALED_UNDER: &str = "\
SELECT domain_id, name, value, key_id, nonce, ciphertext
FROM plexsphere.secrets
WHERE key_id IS DISTINCT FROM $1
  AND ($2::uuid IS NULL OR (domain_id, name) > ($2, $3))
ORDER BY domain_id, name
LIMIT $4";

/// Compare-and-set on the nonce (unique to each sealing) or, for a plain-text row, the value:
/// a row a write replaced since it was read is left as that write made it.
const REPLACE: &str = "\
UPDATE plexsphere.secrets
SET value = NULL,
    key_id = $3,
    nonce = $4,
    ciphertext = $5
WHERE domain_id = $1
  AND name = $2
  AND nonce IS NOT DISTINCT FROM $6
  AND value IS NOT DISTINCT FROM $7";

/// A row of `plexsphere.secrets` as stored: the plain-text value, or the sealed columns.
type ValueColumns = (Option<String>, Option<String>, Option<Vec<u8>>, Option<Vec<u8>>);

/// The secret store on `plexsphere.secrets`.
#[derive(Clone, Debug)]
pub struct PgSecretRepository {
    pool: Statements,
}

impl PgSecretRepository {
    /// A store on `pool`, which must have the workspace's migrations applied: a `PgPool` connected
    /// directly, or [`Statements`] for one behind a transaction pooler.
    pub fn new(pool: impl Into<Statements>) -> PgSecretRepository {
        PgSecretRepository { pool: pool.into() }
    }
}

fn unavailable(error: impl Into<crate::BoxError>) -> RepositoryError {
    RepositoryError(error.into())
}

/// The value a row holds. The table's CHECKs hold the same rules, so a row failing them means
/// the table is not what this build expects: the store is broken, the secret is not absent.
fn stored_value((value, key_id, nonce, ciphertext): ValueColumns) -> Result<StoredValue, RepositoryError> {
    match (value, key_id, nonce, ciphertext) {
        (Some(value), None, None, None) => {
            Ok(StoredValue::Plaintext(SecretValue::new(value).map_err(unavailable)?))
        }
        (None, Some(key_id), Some(nonce), Some(ciphertext)) => {
            let key_id = KeyId::parse(&key_id).map_err(unavailable)?;
            Ok(StoredValue::Sealed(Sealed::new(key_id, &nonce, ciphertext).map_err(unavailable)?))
        }
        _ => Err(unavailable("secret row is neither sealed nor plain text")),
    }
}

#[async_trait::async_trait]
impl SecretRepository for PgSecretRepository {
    #[tracing::instrument(level = "debug", skip_all, fields(%domain, name = %name))]
    async fn put(&self, domain: DomainId, name: &SecretName, sealed: &Sealed) -> Result<(), RepositoryError> {
        sqlx::query(PUT)
            .bind(domain.as_uuid())
            .bind(name.as_str())
            .bind(sealed.key_id().as_str())
            .bind(&sealed.nonce()[..])
            .bind(sealed.ciphertext())
            .execute(&self.pool)
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    #[tracing::instrument(level = "debug", skip_all, fields(%domain, name = %name))]
    async fn get(&self, domain: DomainId, name: &SecretName) -> Result<Option<StoredValue>, RepositoryError> {
        let row: Option<ValueColumns> = sqlx::query_as(GET)
            .bind(domain.as_uuid())
            .bind(name.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(unavailable)?;
        row.map(stored_value).transpose()
    }

    #[tracing::instrument(level = "debug", skip_all, fields(key = %key, limit))]
    async fn not_sealed_under<'a>(
        &self,
        key: &KeyId,
        after: Option<&'a SecretRef>,
        limit: usize,
    ) -> Result<Vec<StoredSecret>, RepositoryError> {
        let rows: Vec<(Uuid, String, Option<String>, Option<String>, Option<Vec<u8>>, Option<Vec<u8>>)> =
            sqlx::query_as(NOT_SEALED_UNDER)
                .bind(key.as_str())
                .bind(after.map(|after| after.domain.as_uuid()))
                .bind(after.map(|after| after.name.as_str()))
                .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                .fetch_all(&self.pool)
                .await
                .map_err(unavailable)?;
        rows.into_iter()
            .map(|(domain, name, value, key_id, nonce, ciphertext)| {
                let name = SecretName::parse(name).map_err(unavailable)?;
                let value = stored_value((value, key_id, nonce, ciphertext))?;
                Ok(StoredSecret { secret: SecretRef { domain: domain.into(), name }, value })
            })
            .collect()
    }

    #[tracing::instrument(level = "debug", skip_all, fields(domain = %stored.secret.domain, name = %stored.secret.name))]
    async fn replace(&self, stored: &StoredSecret, sealed: &Sealed) -> Result<bool, RepositoryError> {
        let (expected_nonce, expected_value) = match &stored.value {
            StoredValue::Sealed(old) => (Some(&old.nonce()[..]), None),
            StoredValue::Plaintext(value) => (None, Some(value.expose())),
        };
        let replaced = sqlx::query(REPLACE)
            .bind(stored.secret.domain.as_uuid())
            .bind(stored.secret.name.as_str())
            .bind(sealed.key_id().as_str())
            .bind(&sealed.nonce()[..])
            .bind(sealed.ciphertext())
            .bind(expected_nonce)
            .bind(expected_value)
            .execute(&self.pool)
            .await
            .map_err(unavailable)?;
        Ok(replaced.rows_affected() == 1)
    }
}

/// A [`SecretRepository`] that answers reads from a [`SecretCache`] while nothing has changed,
/// and asks `inner` otherwise; writes go to `inner` and forget the secret here at once (other
/// replicas hear of it from the database).
#[derive(Clone, Debug)]
pub struct CachedSecretRepository<R> {
    inner: R,
    cache: SecretCache,
}

impl<R: SecretRepository> CachedSecretRepository<R> {
    /// `inner` behind `cache`.
    pub fn new(inner: R, cache: SecretCache) -> CachedSecretRepository<R> {
        CachedSecretRepository { inner, cache }
    }
}

#[async_trait::async_trait]
impl<R: SecretRepository> SecretRepository for CachedSecretRepository<R> {
    async fn put(&self, domain: DomainId, name: &SecretName, sealed: &Sealed) -> Result<(), RepositoryError> {
        let written = self.inner.put(domain, name, sealed).await;
        self.cache.forget(domain, name);
        written
    }

    async fn get(&self, domain: DomainId, name: &SecretName) -> Result<Option<StoredValue>, RepositoryError> {
        if let Some(known) = self.cache.get(domain, name) {
            return Ok(known);
        }
        let epoch = self.cache.epoch();
        let found = self.inner.get(domain, name).await?;
        self.cache.insert(epoch, domain, name.clone(), found.clone());
        Ok(found)
    }

    async fn not_sealed_under<'a>(
        &self,
        key: &KeyId,
        after: Option<&'a SecretRef>,
        limit: usize,
    ) -> Result<Vec<StoredSecret>, RepositoryError> {
        self.inner.not_sealed_under(key, after, limit).await
    }

    async fn replace(&self, stored: &StoredSecret, sealed: &Sealed) -> Result<bool, RepositoryError> {
        let replaced = self.inner.replace(stored, sealed).await;
        self.cache.forget(stored.secret.domain, &stored.secret.name);
        replaced
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
            // The Domain's (`Which::Second`): a pair has no other position.
            Decision::Refused(Refusal { retry_after, .. }) => {
                Err(ReadLimitError::DomainRateLimited { retry_after })
            }
            Decision::InsufficientCapacity(never) => Err(ReadLimitError::Unavailable(never.into())),
        }
    }
}
