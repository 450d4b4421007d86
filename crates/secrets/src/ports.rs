//! What the secrets context needs from outside: a read limiter and a secret store.

use crate::{DomainId, ReadLimitError, Reader, RepositoryError, SecretName, SecretValue};

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

/// Where secrets are kept, keyed by Domain and name.
#[cfg_attr(test, mockall::automock)]
#[async_trait::async_trait]
pub trait SecretRepository: Send + Sync {
    /// Stores `value` as `domain`'s secret `name`, replacing any value it had.
    ///
    /// # Errors
    /// [`RepositoryError`] when the store could not answer. The adapter MUST accept every
    /// valid [`SecretName`] and [`SecretValue`], so an error always means the store failed,
    /// never that the input was bad.
    async fn put(
        &self,
        domain: DomainId,
        name: &SecretName,
        value: &SecretValue,
    ) -> Result<(), RepositoryError>;

    /// The value of `domain`'s secret `name`; `None` when `domain` holds no secret of that
    /// name.
    ///
    /// The adapter MUST look only under `domain`: a secret of the same name under another
    /// Domain is `None`.
    ///
    /// # Errors
    /// [`RepositoryError`] when the store could not answer. The adapter MUST NOT report an
    /// absent secret as an error, nor an error as an absent secret.
    async fn get(&self, domain: DomainId, name: &SecretName) -> Result<Option<SecretValue>, RepositoryError>;
}
