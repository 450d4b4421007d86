//! The errors of the secrets context: what its ports report and what its service returns.

use std::time::Duration;

use crate::{OpenError, SecretRef};

/// Any error from outside the context, kept as the source of an `Unavailable` variant.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why the read limiter did not admit a read.
///
/// The two refusals and [`ReadLimitError::Unavailable`] are different outcomes: a refusal
/// means a budget was evaluated and found short (HTTP 429), `Unavailable` means no budget was
/// evaluated (HTTP 500). Reporting an outage as a refusal would tell a whole fleet to back
/// off from a cap none of them reached.
#[derive(Debug, thiserror::Error)]
pub enum ReadLimitError {
    /// The reading Node's own budget cannot cover the read; nothing was spent.
    #[error("node secret-read rate limited")]
    NodeRateLimited {
        /// How long until an empty bucket of this budget covers one read.
        retry_after: Duration,
    },
    /// The reading Node's Domain's budget cannot cover the read; nothing was spent.
    #[error("domain secret-read rate limited")]
    DomainRateLimited {
        /// How long until an empty bucket of this budget covers one read.
        retry_after: Duration,
    },
    /// The budgets could not be evaluated; this is not a refusal.
    #[error("secret-read limiter could not answer")]
    Unavailable(#[source] BoxError),
}

/// The secret store could not answer.
#[derive(Debug, thiserror::Error)]
#[error("secret store could not answer")]
pub struct RepositoryError(#[source] pub BoxError);

/// Why a write failed.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// The secret store could not answer; the secret may or may not have been written.
    #[error("secret could not be written")]
    Unavailable(#[source] BoxError),
}

/// Why a read returned no secret.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The reader's Domain holds no secret of that name. A secret of that name in another
    /// Domain is not found either, by design.
    #[error("secret not found")]
    NotFound,
    /// The reading Node's own budget cannot cover the read.
    #[error("node secret-read rate limited")]
    NodeRateLimited {
        /// How long until an empty bucket of this budget covers one read.
        retry_after: Duration,
    },
    /// The reading Node's Domain's budget cannot cover the read.
    #[error("domain secret-read rate limited")]
    DomainRateLimited {
        /// How long until an empty bucket of this budget covers one read.
        retry_after: Duration,
    },
    /// The limiter or the secret store could not answer; this is not a refusal.
    #[error("secret could not be read")]
    Unavailable(#[source] BoxError),
    /// The stored value did not open: its key is not in the keyring, or it was altered or
    /// copied from another row. The store answered; what it holds is not this secret.
    #[error("secret could not be opened")]
    Unreadable(#[source] OpenError),
}

/// Why re-sealing stopped.
#[derive(Debug, thiserror::Error)]
pub enum RekeyError {
    /// A stored value did not open, so it cannot be re-sealed; nothing after it was touched.
    #[error("secret {name} of domain {domain} could not be opened", domain = .secret.domain, name = .secret.name)]
    Unreadable {
        /// Which secret.
        secret: SecretRef,
        /// Why it did not open.
        #[source]
        source: OpenError,
    },
    /// The secret store could not answer.
    #[error("secrets could not be re-sealed")]
    Unavailable(#[source] BoxError),
}
