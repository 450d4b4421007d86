//! The access context's use cases: create Domains, enrol Nodes, authenticate them.

use std::sync::Arc;

use crate::{
    AccessRepository, AuthError, AuthenticatedNode, CreateDomainError, Domain, DomainId, EnrolError,
    Enrolment, InsertDomainError, Limiter, NewDomain, Node, NodeId, NodeName, NodeToken, RepositoryError,
    RevokeError, Tier, TierDirectory,
};

#[cfg(test)]
mod tests;

/// Domains, Node enrolment and Node authentication, over a store and an issuance limiter.
///
/// Cloning is cheap and clones share both ports.
#[derive(Clone)]
pub struct AccessService {
    repository: Arc<dyn AccessRepository>,
    limiter: Arc<dyn Limiter>,
}

impl AccessService {
    /// A service over `repository`, spending issuances from `limiter`.
    pub fn new(repository: Arc<dyn AccessRepository>, limiter: Arc<dyn Limiter>) -> AccessService {
        AccessService { repository, limiter }
    }

    /// Creates a Domain under the id its caller chose. Names are unique.
    ///
    /// # Errors
    /// [`CreateDomainError::NameTaken`] when another Domain has the name (nothing is stored);
    /// [`CreateDomainError::Unavailable`] when the store could not answer.
    #[tracing::instrument(level = "debug", skip_all, fields(domain = %new.id))]
    pub async fn create_domain(&self, new: NewDomain) -> Result<Domain, CreateDomainError> {
        let domain = Domain { id: new.id, name: new.name, tier: new.tier };
        match self.repository.insert_domain(&domain).await {
            Ok(()) => Ok(domain),
            Err(InsertDomainError::NameTaken { existing }) => {
                Err(CreateDomainError::NameTaken { name: domain.name.as_str().to_owned(), existing })
            }
            Err(InsertDomainError::Unavailable(error)) => Err(error.into()),
        }
    }

    /// Moves a Domain to `tier`, returning it as it now is; `None` when there is no such
    /// Domain.
    ///
    /// # Errors
    /// [`RepositoryError`] when the store could not answer.
    #[tracing::instrument(level = "debug", skip_all, fields(domain = %id, %tier))]
    pub async fn set_tier(&self, id: DomainId, tier: Tier) -> Result<Option<Domain>, RepositoryError> {
        self.repository.set_tier(id, tier).await
    }

    /// Every Domain whose tier is not [`Tier::DEFAULT`], as of one revision.
    ///
    /// # Errors
    /// [`RepositoryError`] when the store could not answer.
    pub async fn tiers(&self) -> Result<TierDirectory, RepositoryError> {
        self.repository.tiers().await
    }

    /// How many tier changes the store holds: a reader whose directory is older reloads it.
    ///
    /// # Errors
    /// [`RepositoryError`] when the store could not answer.
    pub async fn tier_revision(&self) -> Result<i64, RepositoryError> {
        self.repository.tier_revision().await
    }

    /// The Domain with this id, or `None` when there is none.
    ///
    /// # Errors
    /// [`RepositoryError`] when the store could not answer.
    #[tracing::instrument(level = "debug", skip_all, fields(domain = %id))]
    pub async fn find_domain(&self, id: DomainId) -> Result<Option<Domain>, RepositoryError> {
        self.repository.find_domain(id).await
    }

    /// The Node with this id, or `None` when there is none.
    ///
    /// # Errors
    /// [`RepositoryError`] when the store could not answer.
    #[tracing::instrument(level = "debug", skip_all, fields(node = %id))]
    pub async fn find_node(&self, id: NodeId) -> Result<Option<Node>, RepositoryError> {
        self.repository.find_node(id).await
    }

    /// Enrols a Node into a Domain and issues its credential, spending one issuance from the
    /// Domain's budget.
    ///
    /// The returned token is the only copy: the store keeps its hash.
    ///
    /// # Errors
    /// - [`EnrolError::UnknownDomain`] when no Domain has this id; nothing is spent.
    /// - [`EnrolError::IssuanceRateLimited`] when the Domain's issuance budget refuses.
    /// - [`EnrolError::Unavailable`] when the store or the limiter could not answer.
    #[tracing::instrument(level = "debug", skip_all, fields(domain = %domain_id))]
    pub async fn enrol_node(&self, domain_id: DomainId, name: NodeName) -> Result<Enrolment, EnrolError> {
        // The Domain is looked up first, so that a caller naming Domains that do not exist
        // cannot mint buckets for them.
        let domain =
            self.repository.find_domain(domain_id).await?.ok_or(EnrolError::UnknownDomain(domain_id))?;

        self.limiter.spend_issuance(domain.id).await?;

        // Spent before the insert, and not refunded if the insert fails: a refund is a second
        // write that a crash could skip, and an issuance lost to an outage is harmless.
        let token = NodeToken::generate();
        let node = Node { id: NodeId::random(), domain_id: domain.id, name };
        self.repository.insert_node(&node, &token.hash()).await?;
        Ok(Enrolment { node, token })
    }

    /// Revokes Node `node` of Domain `domain`: its credential stops authenticating, on every
    /// replica (the store announces the deletion; see `NODE_REVOKED_CHANNEL`).
    ///
    /// # Errors
    /// - [`RevokeError::UnknownNode`] when the Domain has no such Node.
    /// - [`RevokeError::Unavailable`] when the store could not answer.
    #[tracing::instrument(level = "debug", skip_all, fields(%domain, %node))]
    pub async fn revoke_node(&self, domain: DomainId, node: NodeId) -> Result<(), RevokeError> {
        match self.repository.delete_node(domain, node).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(RevokeError::UnknownNode { domain, node }),
            Err(error) => Err(RevokeError::Unavailable(error.into())),
        }
    }

    /// The Node a presented token was issued to.
    ///
    /// # Errors
    /// - [`AuthError::MalformedToken`] when `token` is not shaped like a Node token; the store
    ///   is not asked.
    /// - [`AuthError::UnknownToken`] when no Node holds it.
    /// - [`AuthError::Unavailable`] when the store could not answer.
    // The token never enters a span: it is the credential itself.
    #[tracing::instrument(level = "debug", skip_all)]
    pub async fn authenticate(&self, token: &str) -> Result<AuthenticatedNode, AuthError> {
        let token = NodeToken::parse(token)?;
        self.repository.find_node_by_token(&token.hash()).await?.ok_or(AuthError::UnknownToken)
    }
}
