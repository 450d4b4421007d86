//! The access context's errors: refusals, and failures to answer, kept apart.

use std::time::Duration;

use crate::{DomainId, NodeId};

/// Any error from below a port, kept as the source of an `Unavailable` variant.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The access store could not answer: the question was not decided either way.
#[derive(Debug, thiserror::Error)]
#[error("access store could not answer")]
pub struct RepositoryError(#[source] pub BoxError);

/// What spending one issuance from a Domain's budget can fail with.
#[derive(Debug, thiserror::Error)]
pub enum IssuanceLimitError {
    /// The Domain's issuance budget does not cover another credential yet.
    #[error("node credential issuance rate limited")]
    RateLimited {
        /// How long until the budget covers one issuance.
        retry_after: Duration,
    },
    /// The limiter could not evaluate the budget. This is not a refusal.
    #[error("issuance limiter could not answer")]
    Unavailable(#[source] BoxError),
}

/// Why a Domain was not created.
#[derive(Debug, thiserror::Error)]
pub enum CreateDomainError {
    /// Another Domain has this name; names are unique. Nothing was stored.
    #[error("a domain named {name:?} exists already: {existing}")]
    NameTaken {
        /// The name asked for.
        name: String,
        /// The Domain that has it.
        existing: DomainId,
    },
    /// The access store could not answer; the Domain may or may not have been stored.
    #[error("domain could not be created")]
    Unavailable(#[source] BoxError),
}

/// Why a Domain was not stored.
#[derive(Debug, thiserror::Error)]
pub enum InsertDomainError {
    /// Another Domain has the name; nothing was stored.
    #[error("the domain name is taken by {existing}")]
    NameTaken {
        /// The Domain that has it.
        existing: DomainId,
    },
    /// The store could not answer; the Domain may or may not have been stored.
    #[error(transparent)]
    Unavailable(#[from] RepositoryError),
}

/// Why a Node was not enrolled.
#[derive(Debug, thiserror::Error)]
pub enum EnrolError {
    /// No Domain has this id. Nothing was spent from any budget.
    #[error("unknown domain {0}")]
    UnknownDomain(DomainId),
    /// The Domain's issuance budget does not cover another credential yet.
    #[error("node credential issuance rate limited")]
    IssuanceRateLimited {
        /// How long until the budget covers one issuance.
        retry_after: Duration,
    },
    /// The access store or the issuance limiter could not answer. This is not a refusal.
    #[error("enrolment could not be completed")]
    Unavailable(#[source] BoxError),
}

/// Why a Node was not revoked.
#[derive(Debug, thiserror::Error)]
pub enum RevokeError {
    /// The Domain has no such Node (never enrolled, revoked already, or in another Domain).
    #[error("no node {node} in domain {domain}")]
    UnknownNode {
        /// The Domain asked for.
        domain: DomainId,
        /// The Node asked for.
        node: NodeId,
    },
    /// The access store could not answer; the Node may or may not have been revoked.
    #[error("node could not be revoked")]
    Unavailable(#[source] BoxError),
}

/// Why a presented token does not authenticate a Node.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// The text is not shaped like a Node token; no lookup was made.
    #[error("malformed node token")]
    MalformedToken,
    /// The token is well formed but was never issued.
    #[error("unknown node token")]
    UnknownToken,
    /// The access store could not answer, so the token was neither accepted nor rejected.
    #[error("authentication could not be completed")]
    Unavailable(#[source] BoxError),
}

impl From<RepositoryError> for CreateDomainError {
    fn from(error: RepositoryError) -> Self {
        CreateDomainError::Unavailable(Box::new(error))
    }
}

impl From<RepositoryError> for EnrolError {
    fn from(error: RepositoryError) -> Self {
        EnrolError::Unavailable(Box::new(error))
    }
}

impl From<IssuanceLimitError> for EnrolError {
    fn from(error: IssuanceLimitError) -> Self {
        match error {
            IssuanceLimitError::RateLimited { retry_after } => {
                EnrolError::IssuanceRateLimited { retry_after }
            }
            unavailable @ IssuanceLimitError::Unavailable(_) => {
                EnrolError::Unavailable(Box::new(unavailable))
            }
        }
    }
}

impl From<RepositoryError> for AuthError {
    fn from(error: RepositoryError) -> Self {
        AuthError::Unavailable(Box::new(error))
    }
}
