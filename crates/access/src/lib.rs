//! The access context: Domains, Node enrolment and Node credentials.
//!
//! A Domain is the tenant Nodes belong to; it may carry its own [`IssuancePolicy`], the rate
//! at which credentials may be issued in it. Enrolling a Node issues it a bearer
//! [`NodeToken`], and every later request authenticates with that token.
//!
//! Invariants:
//! - A token is shown once, in the [`Enrolment`] that issues it, and is stored only as its
//!   SHA-256 [`TokenHash`]; nothing that reads the store can present a Node's credential.
//! - Every enrolment spends one issuance from its Domain's budget, sized from the Domain's own
//!   policy or else the process-wide default, before a credential exists. An enrolment into an
//!   unknown Domain spends nothing.
//! - A revoked Node's credential stops authenticating on every replica: deleting a Node
//!   announces it on [`NODE_REVOKED_CHANNEL`], and replicas drop it from their caches.
//! - A refused issuance ([`EnrolError::IssuanceRateLimited`]) and a limiter or store that could
//!   not answer ([`EnrolError::Unavailable`]) are different errors, and neither is ever
//!   reported as the other.
//!
//! Only the persistence adapters ([`PgAccessRepository`], [`RateBudgetIssuanceLimiter`]) name
//! SQL or the rate-budget store; the model, ports and service build and test without a
//! database.

mod error;
mod model;
mod persistence;
mod ports;
mod service;

pub use error::{
    AuthError, BoxError, CreateDomainError, EnrolError, IssuanceLimitError, RepositoryError, RevokeError,
};
pub use model::{
    is_invisible, AuthenticatedNode, Domain, DomainId, DomainName, Enrolment, InvalidInput, IssuancePolicy,
    NewDomain, Node, NodeId, NodeName, NodeToken, TokenHash, INVISIBLE,
};
pub use persistence::{PgAccessRepository, RateBudgetIssuanceLimiter, NODE_REVOKED_CHANNEL};
pub use ports::{AccessRepository, Limiter};
pub use service::AccessService;
