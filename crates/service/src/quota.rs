//! The allocator behind Envoy's Rate Limit Quota Service (RLQS): what each Envoy's bucket is
//! assigned, whatever transport carries the reports. Each Envoy decides every request itself
//! from the token buckets it is assigned and reports its usage; [`QuotaService::assign`]
//! answers a report of one bucket with the assignment to send, from the holder's max-min fair
//! share of the rule, counted in the store ([`QuotaStore`]) so that all the Envoys of every
//! replica together never admit more than the rule's `burst + rate × window`
//! (`docs/adr/0041`; the accounting is the migration `20261205100000`'s).
//!
//! A `bucket_id` is a map: its entries, ordered by key, are the descriptor the service's rules
//! resolve, exactly as [`crate::decide::governing_bucket`] resolves a `ShouldRateLimit`
//! descriptor, and its bucket is the one `ShouldRateLimit` keys. With no order to read, the
//! order is the keys': a file rule's levels match a `bucket_id` whose keys, sorted, are its
//! path's keys (write such a file's levels in key order); a selector rule names a set of
//! attributes already, and among those that match, the most specific wins, then the higher
//! priority, as for any descriptor.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use ratebudget::{BoxError, Key};
use rules::{PathLimit, Services};
use uuid::Uuid;

use crate::budgets::{NotLoaded, RuleBudgets};
use crate::decide::{governing_bucket, Entry};

/// What an Envoy is told about one bucket.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Assignment {
    /// Every request is allowed, for `ttl`.
    AllowAll {
        /// Whole seconds (Envoy reads only the seconds).
        ttl: Duration,
    },
    /// Every request is denied, for `ttl`.
    DenyAll {
        /// Whole seconds.
        ttl: Duration,
    },
    /// A token bucket of `max_tokens`, filled with `tokens_per_fill` every `fill_interval`, one
    /// token a request, for `ttl`.
    TokenBucket {
        /// Its capacity.
        max_tokens: u32,
        /// Tokens a fill.
        tokens_per_fill: u32,
        /// Whole seconds (Envoy truncates a fill interval to seconds).
        fill_interval: Duration,
        /// Whole seconds.
        ttl: Duration,
    },
    /// The bucket has shown no demand for a while: the Envoy forgets it.
    Abandon,
}

impl Assignment {
    /// The same strategy with a TTL of zero: Envoy applies it and lets it expire at once,
    /// falling back to its own defaults (a replica's goodbye). An abandon has no TTL.
    pub fn expiring_now(self) -> Assignment {
        match self {
            Assignment::AllowAll { .. } => Assignment::AllowAll { ttl: Duration::ZERO },
            Assignment::DenyAll { .. } => Assignment::DenyAll { ttl: Duration::ZERO },
            Assignment::TokenBucket { max_tokens, tokens_per_fill, fill_interval, .. } => {
                Assignment::TokenBucket { max_tokens, tokens_per_fill, fill_interval, ttl: Duration::ZERO }
            }
            Assignment::Abandon => Assignment::Abandon,
        }
    }

    /// Tokens a second it lets its Envoy admit, apart from its burst (`None`: unbounded).
    pub fn rate(self) -> Option<f64> {
        match self {
            Assignment::AllowAll { .. } => None,
            Assignment::DenyAll { .. } | Assignment::Abandon => Some(0.0),
            Assignment::TokenBucket { tokens_per_fill, fill_interval, .. } => {
                Some(f64::from(tokens_per_fill) / fill_interval.as_secs_f64())
            }
        }
    }
}

/// One bucket's usage since its last report, as Envoy sends it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    /// Requests allowed.
    pub allowed: u64,
    /// Requests denied.
    pub denied: u64,
    /// Time since its last report (Envoy: whole seconds; zero in a bucket's first report).
    pub elapsed: Duration,
}

/// The allocator's settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QuotaSettings {
    /// An assignment's TTL: above Envoy's report interval (5 s), so that a report renews it
    /// before it lapses.
    pub ttl: Duration,
    /// The longest an assignment or a report takes to arrive: what an Envoy was sent counts
    /// until its TTL plus this, and a report proves the last assignment arrived only when it
    /// came this long after it was sent.
    pub max_round_trip: Duration,
    /// The part of a rule's rate no share is granted from: it refills the pool that pays for
    /// the buckets Envoys build full.
    pub reserve: f64,
    /// A holder may grow to its demand times this, from capacity no one's demand takes (so
    /// that a share can follow a demand that grows; never at another's expense).
    pub headroom: f64,
    /// The part of the rule's burst the holders' max_tokens split; the rest stays in the pool.
    pub burst_share: f64,
    /// A bucket whose reports show no request for this long is abandoned.
    pub idle_after: Duration,
    /// The TTL of an ALLOW_ALL where no rule governs, and of a DENY_ALL of a limit of 0.
    pub ungoverned_ttl: Duration,
}

impl Default for QuotaSettings {
    /// The parameters ADR 0041's simulation chose.
    fn default() -> QuotaSettings {
        QuotaSettings {
            ttl: Duration::from_secs(12),
            max_round_trip: Duration::from_secs(1),
            reserve: 0.005,
            headroom: 1.25,
            burst_share: 0.9,
            idle_after: Duration::from_secs(60),
            ungoverned_ttl: Duration::from_secs(3600),
        }
    }
}

/// What a bucket's rules make of it.
#[derive(Clone, Debug, PartialEq)]
pub enum Governance {
    /// No rule governs it (or its limit is unlimited): allowed.
    Unlimited,
    /// A limit of 0 a unit: every request refused (a SHADOW one: allowed).
    RefuseAll {
        /// The rule's id.
        rule_id: String,
        /// Whether it is only observed.
        shadow: bool,
    },
    /// A budget to share.
    Budget(Budget),
}

/// A governed bucket's budget.
#[derive(Clone, Debug, PartialEq)]
pub struct Budget {
    /// The bucket, as `ShouldRateLimit` keys it.
    pub key: Key,
    /// The governing rule.
    pub rule_id: String,
    /// Tokens a second.
    pub rate: f64,
    /// Tokens.
    pub burst: f64,
    /// The fill interval its token buckets are built with, in whole seconds: a minute, or the
    /// rule's period when longer, so a share has at least a minute's worth of whole tokens
    /// to be counted in.
    pub fill_seconds: u32,
    /// Whether the rule is SHADOW: observed, never refusing.
    pub shadow: bool,
}

/// What the store decided for one holder's bucket.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Allotted {
    /// What to send.
    pub decision: Allotment,
    /// The share in force before (tokens a second, tokens): what the holder could admit.
    pub prior_rate: f64,
    /// Its burst.
    pub prior_burst: f64,
}

/// The store's decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Allotment {
    /// A token bucket of this share.
    TokenBucket {
        /// Its capacity.
        max_tokens: u32,
        /// Tokens every fill interval.
        tokens_per_fill: u32,
    },
    /// No share can be granted now.
    Deny,
    /// No demand for a while: abandon the bucket.
    Abandon,
}

/// Who holds a share: one bucket of one Envoy. Several `bucket_id`s a rule keys alike are
/// several token buckets in the Envoy, each holding a share of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BucketHolder {
    /// The Envoy's stream.
    pub stream: Uuid,
    /// The holder: the stream and the `bucket_id`, hashed.
    pub holder: Uuid,
    /// The stream cannot vouch for what was sent (its last statement failed, and may have
    /// committed a send that never left): no report proves an assignment arrived, and the next
    /// token bucket is paid for whole.
    pub unsure: bool,
    /// The Envoy's bucket is not what this rule's share last sent it (a blanket rule, or
    /// another rule's token bucket, came since): the next token bucket is built full, and paid
    /// for whole.
    pub builds_full: bool,
}

impl BucketHolder {
    /// The holder of `bucket_id` on `stream`: the first 128 bits of SHA-256 over the stream
    /// and each entry in key order, length-prefixed.
    pub fn of(stream: Uuid, bucket_id: &BTreeMap<String, String>) -> BucketHolder {
        use sha2::{Digest, Sha256};
        let mut hash = Sha256::new();
        hash.update(stream.as_bytes());
        for field in bucket_id.iter().flat_map(|(key, value)| [key, value]) {
            hash.update((field.len() as u64).to_be_bytes());
            hash.update(field.as_bytes());
        }
        let digest = hash.finalize();
        let mut first = [0u8; 16];
        first.copy_from_slice(&digest[..16]);
        BucketHolder { stream, holder: Uuid::from_bytes(first), unsure: false, builds_full: false }
    }
}

/// One holder's report (or, without usage, a push after a rule changed) of one bucket.
#[derive(Clone, Debug)]
pub struct ShareRequest {
    /// The service.
    pub service: String,
    /// The budget.
    pub budget: Budget,
    /// The holder: one bucket of one Envoy.
    pub holder: BucketHolder,
    /// The replica serving it.
    pub replica: String,
    /// Its usage, when it reported.
    pub usage: Option<Usage>,
    /// The settings.
    pub settings: QuotaSettings,
}

/// One RLQS bucket of a service as the store holds it, for the operator: the rule as last
/// assigned by, its pool, and every holder's share.
#[derive(Clone, Debug, PartialEq)]
pub struct QuotaBucket {
    /// The bucket, as `ShouldRateLimit` keys it.
    pub key: Key,
    /// The rule it was last assigned by.
    pub rule_id: String,
    /// That rule's tokens a second.
    pub rate: f64,
    /// Its burst.
    pub burst: f64,
    /// The pool's tokens at `pool_at` (it accrues only as a report or a push is decided, so
    /// the stored value is what the store last counted, not the level now).
    pub pool: f64,
    /// When the pool was last counted.
    pub pool_at: DateTime<Utc>,
    /// Its holders, by replica, then holder.
    pub holders: Vec<QuotaHolder>,
}

/// One holder's share of a [`QuotaBucket`].
#[derive(Clone, Debug, PartialEq)]
pub struct QuotaHolder {
    /// The holder: one Envoy's stream.
    pub holder: Uuid,
    /// The replica serving it.
    pub replica: String,
    /// Requests a second over its last report (`None`: a newcomer, not known yet).
    pub demand: Option<f64>,
    /// The assignment last sent, tokens a second (0: DENY_ALL, or none sent).
    pub rate: f64,
    /// Its max_tokens.
    pub max_tokens: f64,
    /// What the share counts against the rule now, tokens a second: the larger of the last
    /// assignment and any older one the Envoy may still be using.
    pub counted_rate: f64,
    /// And tokens.
    pub counted_burst: f64,
    /// When the last assignment was sent (`None`: never).
    pub sent_at: Option<DateTime<Utc>>,
    /// After when nothing it was sent can be used.
    pub expires_at: Option<DateTime<Utc>>,
    /// Whether its stream ended (or the bucket was abandoned): it takes no new share.
    pub closed: bool,
}

/// Where shares are counted: one statement a report of a bucket, shared by every replica.
#[async_trait]
pub trait QuotaStore: Send + Sync {
    /// Records `request` and decides the holder's share.
    async fn assign(&self, request: &ShareRequest) -> Result<Allotted, BoxError>;

    /// `stream` ended: its holders' shares take no new demand and count until they expire.
    async fn close(&self, stream: Uuid) -> Result<(), BoxError>;

    /// Deletes what no longer counts (shares long expired, buckets whose pool would be full);
    /// how many rows.
    async fn sweep(&self) -> Result<u64, BoxError>;

    /// `service`'s buckets with their holders, by key, each share counted at the store's now.
    ///
    /// # Errors
    /// When the store cannot answer; an unknown service MUST be an empty list, not an error.
    async fn buckets(&self, service: &str) -> Result<Vec<QuotaBucket>, BoxError>;
}

/// What the allocator tells the metrics.
pub trait QuotaObserver: Send + Sync {
    /// A report of a bucket of `service` with `usage`.
    fn reported(&self, service: &str, usage: Usage);
    /// An assignment of a bucket of `service` was decided (`None`: nothing sent).
    fn assigned(&self, service: &str, assignment: Option<Assignment>);
    /// A SHADOW rule's holder admitted about `refused` requests its share would have refused.
    fn shadow_refused(&self, service: &str, rule: &str, refused: u64);
    /// The store could not answer.
    fn failed(&self, service: &str);
}

/// Why no assignment could be decided.
#[derive(Debug, thiserror::Error)]
pub enum QuotaError {
    /// The caller may not ask for this service.
    #[error("this token may not decide for service {service:?}")]
    Forbidden {
        /// The service asked for.
        service: String,
    },
    /// The rules are not loaded yet.
    #[error(transparent)]
    NotLoaded(#[from] NotLoaded),
    /// The store could not answer: nothing is sent, the Envoy keeps its last assignment.
    #[error("the quota store could not answer")]
    Store(#[source] BoxError),
}

/// Decides assignments: the rules (through [`RuleBudgets`]), the store, the settings.
#[derive(Clone)]
pub struct QuotaService {
    budgets: Arc<RuleBudgets>,
    store: Arc<dyn QuotaStore>,
    observer: Arc<dyn QuotaObserver>,
    settings: QuotaSettings,
    replica: String,
}

impl QuotaService {
    /// Assigns by `budgets`' rules, counting in `store`, as `replica`.
    pub fn new(
        budgets: Arc<RuleBudgets>,
        store: Arc<dyn QuotaStore>,
        observer: Arc<dyn QuotaObserver>,
        settings: QuotaSettings,
        replica: impl Into<String>,
    ) -> QuotaService {
        QuotaService { budgets, store, observer, settings, replica: replica.into() }
    }

    /// The settings.
    pub fn settings(&self) -> QuotaSettings {
        self.settings
    }

    /// The revision of the rules held: a stream re-assigns its buckets when it changes.
    pub fn revision(&self) -> Option<i64> {
        self.budgets.compiled_rules().ok().map(|rules| rules.snapshot.revision())
    }

    /// Whether a caller that may ask for `services` may ask for `service`.
    ///
    /// # Errors
    /// [`QuotaError::Forbidden`] when it may not.
    pub fn permit(&self, services: &Services, service: &str) -> Result<(), QuotaError> {
        if services.permits(service) {
            Ok(())
        } else {
            Err(QuotaError::Forbidden { service: service.to_owned() })
        }
    }

    /// What `service`'s rules make of the bucket `bucket_id`.
    ///
    /// # Errors
    /// [`QuotaError::NotLoaded`] before the rules are loaded.
    pub fn govern(
        &self,
        service: &str,
        bucket_id: &BTreeMap<String, String>,
    ) -> Result<Governance, QuotaError> {
        let compiled = self.budgets.compiled_rules()?;
        // The map's entries in key order (BTreeMap's): the descriptor a set reads as.
        let entries: Vec<Entry> =
            bucket_id.iter().map(|(key, value)| Entry { key: key.clone(), value: value.clone() }).collect();
        let Some(governed) = governing_bucket(&compiled.snapshot, service, &entries) else {
            return Ok(Governance::Unlimited);
        };
        let policy = compiled.policies[governed.index];
        let shadow = policy.enforcement.is_shadow();
        let rule_id = governed.rule.id.as_str().to_owned();
        let mut period = f64::from(governed.rule.spec.per_ms()) / 1000.0;
        if let Some(file_rule) = governed.rule.spec.descriptor() {
            match file_rule.limit {
                PathLimit::PerUnit { requests_per_unit: 0, .. } => {
                    return Ok(Governance::RefuseAll { rule_id, shadow });
                }
                PathLimit::PerUnit { unit, .. } => period = unit.seconds(),
                _ => return Ok(Governance::Unlimited),
            }
        }
        let limit = policy.limit;
        // Whole seconds, at least a minute: Envoy reads a fill interval's seconds only.
        let fill_seconds = period.ceil().clamp(60.0, f64::from(u32::MAX)) as u32;
        Ok(Governance::Budget(Budget {
            key: governed.key,
            rule_id,
            rate: limit.per_second(),
            burst: limit.burst(),
            fill_seconds,
            shadow,
        }))
    }

    /// The assignment for `holder`'s bucket `bucket_id` of `service`, at a report of `usage`
    /// (or, with none, because the rules changed). `None`: nothing is sent.
    ///
    /// # Errors
    /// [`QuotaError::NotLoaded`] before the rules are loaded, [`QuotaError::Store`] when the
    /// store could not answer (nothing is sent: the Envoy keeps its last assignment until its
    /// TTL, then its own `no_assignment_behavior`).
    pub async fn assign(
        &self,
        service: &str,
        bucket_id: &BTreeMap<String, String>,
        holder: BucketHolder,
        usage: Option<Usage>,
    ) -> Result<Option<Assignment>, QuotaError> {
        let governance = self.govern(service, bucket_id)?;
        self.assign_governed(service, &governance, holder, usage).await
    }

    /// As [`QuotaService::assign`], for a bucket [`QuotaService::govern`] resolved to
    /// `governance`: a stream resolves its buckets again only when the rules change, and
    /// pushes only those whose governance did.
    ///
    /// # Errors
    /// As [`QuotaService::assign`].
    pub async fn assign_governed(
        &self,
        service: &str,
        governance: &Governance,
        holder: BucketHolder,
        usage: Option<Usage>,
    ) -> Result<Option<Assignment>, QuotaError> {
        // A service with rules by name, the rest as `other`: a bounded set of labels.
        let label = if self.budgets.has_service_rules(service) { service } else { "other" };
        if let Some(usage) = usage {
            self.observer.reported(label, usage);
        }
        let assignment = self.assignment(service, governance, holder, usage).await;
        match &assignment {
            Ok(assignment) => self.observer.assigned(label, *assignment),
            Err(_) => self.observer.failed(label),
        }
        assignment
    }

    async fn assignment(
        &self,
        service: &str,
        governance: &Governance,
        holder: BucketHolder,
        usage: Option<Usage>,
    ) -> Result<Option<Assignment>, QuotaError> {
        let settings = self.settings;
        let long = settings.ungoverned_ttl;
        let budget = match governance {
            Governance::Unlimited => return Ok(Some(Assignment::AllowAll { ttl: long })),
            Governance::RefuseAll { shadow: true, .. } => {
                return Ok(Some(Assignment::AllowAll { ttl: long }))
            }
            Governance::RefuseAll { shadow: false, .. } => {
                return Ok(Some(Assignment::DenyAll { ttl: long }))
            }
            Governance::Budget(budget) => budget,
        };
        let request = ShareRequest {
            service: service.to_owned(),
            budget: budget.clone(),
            holder,
            replica: self.replica.clone(),
            usage,
            settings,
        };
        let allotted = self.store.assign(&request).await.map_err(QuotaError::Store)?;
        let ttl = whole_seconds(settings.ttl);
        if budget.shadow {
            // A SHADOW rule refuses nothing: ALLOW_ALL, and what the share in force would have
            // refused, estimated from the report, counted.
            if let Some(usage) = usage {
                let could = allotted.prior_rate * usage.elapsed.as_secs_f64() + allotted.prior_burst;
                let refused = (usage.allowed as f64 - could).max(0.0).floor() as u64;
                if refused > 0 {
                    self.observer.shadow_refused(service, &budget.rule_id, refused);
                }
            }
            return Ok(match allotted.decision {
                Allotment::Abandon => Some(Assignment::Abandon),
                Allotment::TokenBucket { .. } | Allotment::Deny => Some(Assignment::AllowAll { ttl }),
            });
        }
        Ok(match allotted.decision {
            Allotment::TokenBucket { max_tokens, tokens_per_fill } => Some(Assignment::TokenBucket {
                max_tokens,
                tokens_per_fill,
                fill_interval: Duration::from_secs(u64::from(budget.fill_seconds)),
                ttl,
            }),
            Allotment::Deny => Some(Assignment::DenyAll { ttl }),
            Allotment::Abandon => Some(Assignment::Abandon),
        })
    }

    /// `stream` ended.
    ///
    /// # Errors
    /// When the store could not record it (its shares then count until they expire anyway).
    pub async fn close(&self, stream: Uuid) -> Result<(), QuotaError> {
        self.store.close(stream).await.map_err(QuotaError::Store)
    }

    /// Deletes the shares and buckets that no longer count (the leader's, now and then).
    ///
    /// # Errors
    /// When the store could not answer.
    pub async fn sweep(&self) -> Result<u64, QuotaError> {
        self.store.sweep().await.map_err(QuotaError::Store)
    }

    /// `service`'s RLQS buckets and every holder's share, as every replica counts them, for
    /// the operator.
    ///
    /// # Errors
    /// [`QuotaError::Store`] when the store could not answer.
    pub async fn buckets(&self, service: &str) -> Result<Vec<QuotaBucket>, QuotaError> {
        self.store.buckets(service).await.map_err(QuotaError::Store)
    }
}

/// `duration` truncated to whole seconds, as Envoy reads it.
fn whole_seconds(duration: Duration) -> Duration {
    Duration::from_secs(duration.as_secs())
}

#[cfg(test)]
mod tests;
