//! The access context: Domains, Node enrolment and Node credentials.
//!
//! A Domain is the tenant Nodes belong to, in one of four service [`Tier`]s (which decide
//! which rate-budget templates govern it; the rules themselves live outside this context).
//! Enrolling a Node issues it a bearer [`NodeToken`], and every later request authenticates
//! with that token.
//!
//! Invariants:
//! - A token is shown once, in the [`Enrolment`] that issues it, and is stored only as its
//!   SHA-256 [`TokenHash`]; nothing that reads the store can present a Node's credential.
//! - Every enrolment spends one issuance from its Domain's budget before a credential exists.
//!   An enrolment into an unknown Domain spends nothing.
//! - Every change of a Domain's tier (and every Domain created with a tier other than the
//!   default) counts as one revision of the [`TierDirectory`], and is announced on
//!   [`TIER_CHANNEL`], so whoever keeps the tiers in memory hears of it or sees that it
//!   missed it.
//! - A revoked Node's credential stops authenticating on every replica: deleting a Node
//!   announces it on [`NODE_REVOKED_CHANNEL`], and replicas drop it from their caches.
//! - A refused issuance ([`EnrolError::IssuanceRateLimited`]) and a limiter or store that could
//!   not answer ([`EnrolError::Unavailable`]) are different errors, and neither is ever
//!   reported as the other.
//!
//! Only the persistence adapters ([`PgAccessRepository`], [`RateBudgetIssuanceLimiter`]) name
//! SQL or the rate-budget store; the model, ports and service build and test without a
//! database.

mod credentials;
mod error;
mod model;
mod persistence;
mod ports;
mod service;

pub use credentials::{CredentialCache, Lookup};
pub use error::{
    AuthError, BoxError, CreateDomainError, EnrolError, InsertDomainError, IssuanceLimitError,
    RepositoryError, RevokeError,
};
pub use model::{
    is_invisible, AuthenticatedNode, Domain, DomainId, DomainName, Enrolment, InvalidInput, NewDomain, Node,
    NodeId, NodeName, NodeToken, Tier, TierDirectory, TokenHash, INVISIBLE,
};
pub use persistence::{PgAccessRepository, RateBudgetIssuanceLimiter, NODE_REVOKED_CHANNEL, TIER_CHANNEL};
pub use ports::{AccessRepository, Limiter};
#[cfg(feature = "mocks")]
pub use ports::{MockAccessRepository, MockLimiter};
pub use service::AccessService;
