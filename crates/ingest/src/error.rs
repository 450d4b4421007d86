//! What can go wrong when a batch is offered: a quota refused it, or something could not
//! answer.
//!
//! The two are kept apart all the way up. A refusal carries how long to wait and becomes a
//! 429; "could not answer" carries its cause and becomes a 500. Turning an outage into a
//! refusal would tell a whole fleet of Nodes to back off from a quota none of them reached.

use std::time::Duration;

/// A cause that the context passes along without inspecting it.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why [`crate::IngestService::accept`] did not accept a batch.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    /// The sending Node has spent its ingest quota; nothing was stored.
    #[error("node ingest quota exceeded")]
    NodeQuotaExceeded {
        /// How long until the Node's quota could cover this batch.
        retry_after: Duration,
    },
    /// The sender's Domain has spent its ingest quota; nothing was stored.
    #[error("domain ingest quota exceeded")]
    DomainQuotaExceeded {
        /// How long until the Domain's quota could cover this batch.
        retry_after: Duration,
    },
    /// The quotas could not be evaluated or the batch store did not answer. Not a refusal.
    #[error("ingest could not answer")]
    Unavailable(#[source] BoxError),
}

/// What the [`crate::Limiter`] port answers when it does not grant a spend.
#[derive(Debug, thiserror::Error)]
pub enum QuotaError {
    /// The Node's `ingest_node` quota cannot cover the bytes; neither quota was debited.
    #[error("node ingest quota exceeded")]
    NodeQuotaExceeded {
        /// How long until the Node's quota could cover the bytes.
        retry_after: Duration,
    },
    /// The Domain's `ingest_domain` quota cannot cover the bytes; neither quota was debited.
    #[error("domain ingest quota exceeded")]
    DomainQuotaExceeded {
        /// How long until the Domain's quota could cover the bytes.
        retry_after: Duration,
    },
    /// The quotas could not be evaluated. Not a refusal.
    #[error("ingest quota could not answer")]
    Unavailable(#[source] BoxError),
}

/// The [`crate::BatchRepository`] port could not store a batch.
#[derive(Debug, thiserror::Error)]
#[error("batch store could not answer")]
pub struct RepositoryError(#[source] pub BoxError);

impl From<QuotaError> for IngestError {
    fn from(error: QuotaError) -> Self {
        match error {
            QuotaError::NodeQuotaExceeded { retry_after } => IngestError::NodeQuotaExceeded { retry_after },
            QuotaError::DomainQuotaExceeded { retry_after } => {
                IngestError::DomainQuotaExceeded { retry_after }
            }
            // The whole error becomes the source, so the chain names the quota as what failed.
            unavailable @ QuotaError::Unavailable(_) => IngestError::Unavailable(Box::new(unavailable)),
        }
    }
}

impl From<RepositoryError> for IngestError {
    fn from(error: RepositoryError) -> Self {
        IngestError::Unavailable(Box::new(error))
    }
}
