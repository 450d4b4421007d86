//! What can go wrong when a batch is offered: a quota refused it, or something could not
//! answer.
//!
//! The two are kept apart all the way up. A refusal carries how long to wait and becomes a
//! 429; "could not answer" carries its cause and becomes a 500. Turning an outage into a
//! refusal would tell a whole fleet of Nodes to back off from a quota none of them reached.

use std::time::Duration;

/// A cause that the context passes along without inspecting it.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Which of the two quotas a batch spends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Quota {
    /// The sending Node's own quota (`ingest_node`).
    Node,
    /// The quota shared by every Node of the sender's Domain (`ingest_domain`).
    Domain,
}

impl std::fmt::Display for Quota {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Quota::Node => "node",
            Quota::Domain => "domain",
        })
    }
}

/// Why [`crate::IngestService::accept`] did not accept a batch.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    /// The batch is empty. It would cost nothing, so storing it would let a Node write rows
    /// without limit; nothing was stored.
    #[error("empty batch")]
    EmptyBatch,
    /// A quota cannot cover the batch now; nothing was stored and nothing was spent.
    #[error("{quota} ingest quota exceeded")]
    QuotaExceeded {
        /// The quota that refused.
        quota: Quota,
        /// How long until that quota could cover this batch.
        retry_after: Duration,
    },
    /// The batch is larger than a quota ever holds, so no wait would admit it; nothing was
    /// stored and nothing was spent.
    #[error("batch larger than the {quota} ingest quota of {burst} bytes")]
    LargerThanQuota {
        /// The quota it exceeds.
        quota: Quota,
        /// The most that quota ever holds, in bytes.
        burst: u64,
    },
    /// The quotas could not be evaluated or the batch store did not answer. Not a refusal.
    #[error("ingest could not answer")]
    Unavailable(#[source] BoxError),
}

/// What the [`crate::Limiter`] port answers when it does not grant a spend.
#[derive(Debug, thiserror::Error)]
pub enum QuotaError {
    /// A quota cannot cover the bytes now; neither quota was debited.
    #[error("{quota} ingest quota exceeded")]
    Exceeded {
        /// The quota that refused.
        quota: Quota,
        /// How long until that quota could cover the bytes.
        retry_after: Duration,
    },
    /// The bytes exceed what a quota ever holds; neither quota was debited.
    #[error("bytes larger than the {quota} ingest quota of {burst}")]
    LargerThanQuota {
        /// The quota they exceed.
        quota: Quota,
        /// The most that quota ever holds, in bytes.
        burst: u64,
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
            QuotaError::Exceeded { quota, retry_after } => IngestError::QuotaExceeded { quota, retry_after },
            QuotaError::LargerThanQuota { quota, burst } => IngestError::LargerThanQuota { quota, burst },
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
