//! What the access context needs from the outside: an issuance limiter and a store.

use crate::{
    AuthenticatedNode, Domain, DomainId, InsertDomainError, IssuanceLimitError, Node, NodeId,
    RepositoryError, Tier, TierDirectory, TokenHash,
};

/// Decides whether a Domain may issue another Node credential now.
#[cfg_attr(any(test, feature = "mocks"), mockall::automock)]
#[async_trait::async_trait]
pub trait Limiter: Send + Sync {
    /// Spends one issuance from `domain`'s budget, sized by whatever governs that Domain's
    /// issuance (the adapter's concern: rules and defaults live outside this context).
    ///
    /// # Errors
    /// - [`IssuanceLimitError::RateLimited`] MUST be returned when, and only when, the budget
    ///   was evaluated and does not cover one issuance; nothing MUST have been spent, and
    ///   `retry_after` MUST bound how long until it covers one.
    /// - [`IssuanceLimitError::Unavailable`] MUST be returned whenever the budget could not be
    ///   evaluated (the store did not answer, or the budget is unusable), carrying the cause.
    ///   It MUST NOT be reported as `RateLimited`, or an outage would tell callers to back off
    ///   from a cap none of them reached.
    async fn spend_issuance(&self, domain: DomainId) -> Result<(), IssuanceLimitError>;
}

/// Where Domains and Nodes are kept. Tokens are kept only as their hashes.
#[cfg_attr(any(test, feature = "mocks"), mockall::automock)]
#[async_trait::async_trait]
pub trait AccessRepository: Send + Sync {
    /// Stores a new Domain. Names are unique.
    ///
    /// # Errors
    /// [`InsertDomainError::NameTaken`] MUST be returned, with the Domain that has the name,
    /// when another Domain has it, and nothing stored; [`InsertDomainError::Unavailable`] MUST
    /// be returned when the Domain could not be stored for any other reason, carrying the
    /// cause. `Ok` MUST mean it is stored. A Domain stored with a tier other than
    /// [`Tier::DEFAULT`] counts as a tier change, as for [`AccessRepository::set_tier`].
    async fn insert_domain(&self, domain: &Domain) -> Result<(), InsertDomainError>;

    /// The Domain with this id, or `None` when there is none.
    ///
    /// # Errors
    /// [`RepositoryError`] MUST be returned when the store could not answer or holds a Domain
    /// that does not validate; a missing Domain MUST be `Ok(None)`, never an error.
    async fn find_domain(&self, id: DomainId) -> Result<Option<Domain>, RepositoryError>;

    /// Sets the tier of the Domain with this id and returns the Domain as it now is, or `None`
    /// when there is none (nothing is written then).
    ///
    /// # Errors
    /// [`RepositoryError`] MUST be returned when the store could not answer; the tier may or
    /// may not have been set. A tier that was set MUST count as a change of the
    /// [`TierDirectory`]'s revision, and every reader following the tiers MUST be told.
    async fn set_tier(&self, id: DomainId, tier: Tier) -> Result<Option<Domain>, RepositoryError>;

    /// Every Domain whose tier is not [`Tier::DEFAULT`], as of one revision.
    ///
    /// # Errors
    /// [`RepositoryError`] MUST be returned when the store could not answer.
    async fn tiers(&self) -> Result<TierDirectory, RepositoryError>;

    /// The revision of the tiers: how many tier changes the store holds.
    ///
    /// # Errors
    /// [`RepositoryError`] MUST be returned when the store could not answer.
    async fn tier_revision(&self) -> Result<i64, RepositoryError>;

    /// The Node with this id, or `None` when there is none.
    ///
    /// # Errors
    /// [`RepositoryError`] MUST be returned when the store could not answer or holds a Node
    /// that does not validate; a missing Node MUST be `Ok(None)`, never an error.
    async fn find_node(&self, id: NodeId) -> Result<Option<Node>, RepositoryError>;

    /// Stores a new Node with the hash of its credential.
    ///
    /// # Errors
    /// [`RepositoryError`] MUST be returned when the Node could not be stored (including when
    /// its Domain does not exist), carrying the cause; `Ok` MUST mean it is stored and
    /// `token_hash` authenticates it.
    async fn insert_node(&self, node: &Node, token_hash: &TokenHash) -> Result<(), RepositoryError>;

    /// The Node whose credential hashes to `token_hash`, or `None` when no Node's does.
    ///
    /// # Errors
    /// [`RepositoryError`] MUST be returned when the store could not answer; an unknown hash
    /// MUST be `Ok(None)`, never an error.
    async fn find_node_by_token(
        &self,
        token_hash: &TokenHash,
    ) -> Result<Option<AuthenticatedNode>, RepositoryError>;

    /// Deletes Node `node` of Domain `domain` with its credential; `false` when `domain` has no
    /// such Node.
    ///
    /// Every replica's cache of authenticated credentials must hear of it: the adapter MUST
    /// make the deletion announce itself (see `NODE_REVOKED_CHANNEL`), so a deleted Node's
    /// token stops authenticating everywhere, not only where it was deleted.
    ///
    /// # Errors
    /// [`RepositoryError`] MUST be returned when the store could not answer; an unknown Node
    /// MUST be `Ok(false)`, never an error.
    async fn delete_node(&self, domain: DomainId, node: NodeId) -> Result<bool, RepositoryError>;
}
