//! What the secrets context needs from outside: a read limiter and a secret store.

use crate::{
    DomainId, KeyId, ReadLimitError, Reader, RepositoryError, Sealed, SecretName, SecretRef, StoredSecret,
    StoredValue,
};

/// The read budgets every Node's secret reads are admitted through.
#[cfg_attr(test, mockall::automock)]
#[async_trait::async_trait]
pub trait Limiter: Send + Sync {
    /// Spends one read from `reader.node`'s budget and one from `reader.domain`'s, both or
    /// neither.
    ///
    /// # Errors
    /// - [`ReadLimitError::NodeRateLimited`] when the Node's budget cannot cover the read. The
    ///   adapter MUST then have spent nothing from either budget, and `retry_after` MUST be how
    ///   long an empty bucket of the Node's budget needs to cover one read.
    /// - [`ReadLimitError::DomainRateLimited`] when the Domain's budget cannot cover it, with
    ///   the same MUSTs for the Domain's budget. When both are short, the adapter MAY report
    ///   either.
    /// - [`ReadLimitError::Unavailable`] when the budgets could not be evaluated (the store
    ///   did not answer, or the adapter is misconfigured). The adapter MUST NOT report that as
    ///   a refusal, and MUST NOT report a refusal as it.
    async fn spend_read(&self, reader: Reader) -> Result<(), ReadLimitError>;
}

/// Where secrets are kept, keyed by Domain and name. The store only ever sees values sealed
/// (or, for rows written before sealing, in plain text as they were written).
#[cfg_attr(test, mockall::automock)]
#[async_trait::async_trait]
pub trait SecretRepository: Send + Sync {
    /// Stores `sealed` as `domain`'s secret `name`, replacing any value it had.
    ///
    /// # Errors
    /// [`RepositoryError`] when the store could not answer. The adapter MUST accept every
    /// valid [`SecretName`] and every value the keyring seals, so an error always means the
    /// store failed, never that the input was bad.
    async fn put(&self, domain: DomainId, name: &SecretName, sealed: &Sealed) -> Result<(), RepositoryError>;

    /// The stored value of `domain`'s secret `name`; `None` when `domain` holds no secret of
    /// that name.
    ///
    /// The adapter MUST look only under `domain`: a secret of the same name under another
    /// Domain is `None`.
    ///
    /// # Errors
    /// [`RepositoryError`] when the store could not answer or holds a row this build cannot
    /// read. The adapter MUST NOT report an absent secret as an error, nor an error as an
    /// absent secret.
    async fn get(&self, domain: DomainId, name: &SecretName) -> Result<Option<StoredValue>, RepositoryError>;

    /// Up to `limit` secrets not sealed under `key` (sealed under another key, or in plain
    /// text), in (Domain, name) order, starting after `after` when it is given.
    ///
    /// # Errors
    /// [`RepositoryError`] when the store could not answer.
    async fn not_sealed_under<'a>(
        &self,
        key: &KeyId,
        after: Option<&'a SecretRef>,
        limit: usize,
    ) -> Result<Vec<StoredSecret>, RepositoryError>;

    /// Replaces `stored`'s value with `sealed`, only if the store still holds exactly
    /// `stored.value` for it; `false` when a write replaced it meanwhile (that write sealed it
    /// afresh) or it was deleted.
    ///
    /// # Errors
    /// [`RepositoryError`] when the store could not answer.
    async fn replace(&self, stored: &StoredSecret, sealed: &Sealed) -> Result<bool, RepositoryError>;
}
