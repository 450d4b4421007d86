//! What ingest needs from the outside: a quota to spend and a place to store batches.

use crate::{BatchId, QuotaError, RepositoryError, Sender};

/// The two ingest quotas a batch spends: the Node's and its Domain's.
#[cfg_attr(test, mockall::automock)]
#[async_trait::async_trait]
pub trait Limiter: Send + Sync {
    /// Spends `bytes` from the sender's Node quota (`ingest_node`) and its Domain quota
    /// (`ingest_domain`), all-or-nothing: both are debited or neither is.
    ///
    /// # Errors
    /// - [`QuotaError::Exceeded`] MUST be returned when a quota cannot cover `bytes` now,
    ///   naming that quota (either, when both cannot), and neither quota MUST have been
    ///   debited. `retry_after` MUST be how long until that quota covers `bytes` if nobody else
    ///   spends from it.
    /// - [`QuotaError::LargerThanQuota`] MUST be returned instead when `bytes` exceed what a
    ///   quota ever holds, so that no wait would admit them; nothing MUST have been debited.
    /// - [`QuotaError::Unavailable`] MUST be returned when the quotas could not be evaluated
    ///   (the store did not answer, or the quotas are misconfigured). It MUST NOT be reported
    ///   as a refusal, and a refusal MUST NOT be reported as it.
    async fn spend_bytes(&self, sender: Sender, bytes: u64) -> Result<(), QuotaError>;
}

/// Where accepted batches are kept.
#[cfg_attr(test, mockall::automock)]
#[async_trait::async_trait]
pub trait BatchRepository: Send + Sync {
    /// Stores the batch `id` sent by `sender`, with `payload` byte for byte, and commits it
    /// before returning. Its byte count is the payload's length and its receipt time is the
    /// store's own clock.
    ///
    /// # Errors
    /// - [`RepositoryError`] MUST be returned when the batch could not be committed, with the
    ///   cause as its source; on `Ok` the batch MUST be durable.
    async fn insert(&self, id: BatchId, sender: Sender, payload: &[u8]) -> Result<(), RepositoryError>;
}
