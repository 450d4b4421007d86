//! Decorators around the contexts' limiter ports that count every decision by scope and
//! outcome for `/metrics`, without the contexts knowing metrics exist, and that do not decide
//! at all while this replica's clock cannot be trusted (`crate::clock`): such a decision is an
//! error (HTTP 500), never a refusal.

use std::sync::Arc;

use ratebudget::Scope;

use crate::clock::ClockStatus;
use crate::metrics::{Metrics, Outcome, ScopeLabel};

/// Counts the decisions of the secrets context's limiter.
pub struct MeteredReadLimiter {
    /// The limiter that decides.
    pub inner: Arc<dyn secrets::Limiter>,
    /// Where decisions are counted.
    pub metrics: Metrics,
    /// Whether the clock may be decided with.
    pub clock: ClockStatus,
}

#[async_trait::async_trait]
impl secrets::Limiter for MeteredReadLimiter {
    async fn spend_read(&self, reader: secrets::Reader) -> Result<(), secrets::ReadLimitError> {
        let (node, domain) = (ScopeLabel(Scope::SecretReadNode), ScopeLabel(Scope::SecretReadDomain));
        if let Err(untrusted) = self.clock.check() {
            self.metrics.pair_decision(node, domain, Outcome::error);
            return Err(secrets::ReadLimitError::Unavailable(untrusted.into()));
        }
        let decision = self.inner.spend_read(reader).await;
        match &decision {
            Ok(()) => self.metrics.pair_decision(node, domain, Outcome::granted),
            // A pair is all-or-nothing, so only the bucket that refused was decided.
            Err(secrets::ReadLimitError::NodeRateLimited { .. }) => {
                self.metrics.decision(node, Outcome::refused)
            }
            Err(secrets::ReadLimitError::DomainRateLimited { .. }) => {
                self.metrics.decision(domain, Outcome::refused)
            }
            Err(secrets::ReadLimitError::Unavailable(_)) => {
                self.metrics.pair_decision(node, domain, Outcome::error)
            }
        }
        decision
    }
}

/// Counts the decisions of the access context's issuance limiter.
pub struct MeteredIssuanceLimiter {
    /// The limiter that decides.
    pub inner: Arc<dyn access::Limiter>,
    /// Where decisions are counted.
    pub metrics: Metrics,
    /// Whether the clock may be decided with.
    pub clock: ClockStatus,
}

#[async_trait::async_trait]
impl access::Limiter for MeteredIssuanceLimiter {
    async fn spend_issuance(
        &self,
        domain: access::DomainId,
        policy: Option<access::IssuancePolicy>,
    ) -> Result<(), access::IssuanceLimitError> {
        if let Err(untrusted) = self.clock.check() {
            self.metrics.decision(ScopeLabel(Scope::AccessIssuanceDomain), Outcome::error);
            return Err(access::IssuanceLimitError::Unavailable(untrusted.into()));
        }
        let decision = self.inner.spend_issuance(domain, policy).await;
        let outcome = match &decision {
            Ok(()) => Outcome::granted,
            Err(access::IssuanceLimitError::RateLimited { .. }) => Outcome::refused,
            Err(access::IssuanceLimitError::Unavailable(_)) => Outcome::error,
        };
        self.metrics.decision(ScopeLabel(Scope::AccessIssuanceDomain), outcome);
        decision
    }
}

/// Counts the decisions of the ingest context's quota limiter.
pub struct MeteredQuotaLimiter {
    /// The limiter that decides.
    pub inner: Arc<dyn ingest::Limiter>,
    /// Where decisions are counted.
    pub metrics: Metrics,
    /// Whether the clock may be decided with.
    pub clock: ClockStatus,
}

#[async_trait::async_trait]
impl ingest::Limiter for MeteredQuotaLimiter {
    async fn spend_bytes(&self, sender: ingest::Sender, bytes: u64) -> Result<(), ingest::QuotaError> {
        let (node, domain) = (ScopeLabel(Scope::IngestNode), ScopeLabel(Scope::IngestDomain));
        if let Err(untrusted) = self.clock.check() {
            self.metrics.pair_decision(node, domain, Outcome::error);
            return Err(ingest::QuotaError::Unavailable(untrusted.into()));
        }
        let decision = self.inner.spend_bytes(sender, bytes).await;
        match &decision {
            Ok(()) => self.metrics.pair_decision(node, domain, Outcome::granted),
            Err(ingest::QuotaError::Exceeded { quota: ingest::Quota::Node, .. }) => {
                self.metrics.decision(node, Outcome::refused)
            }
            Err(ingest::QuotaError::Exceeded { quota: ingest::Quota::Domain, .. }) => {
                self.metrics.decision(domain, Outcome::refused)
            }
            Err(ingest::QuotaError::LargerThanQuota { quota, .. }) => self
                .metrics
                .decision(if *quota == ingest::Quota::Node { node } else { domain }, Outcome::refused),
            Err(ingest::QuotaError::Unavailable(_)) => {
                self.metrics.pair_decision(node, domain, Outcome::error)
            }
        }
        decision
    }
}
