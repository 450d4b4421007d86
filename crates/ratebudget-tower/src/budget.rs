//! What the layer spends from: a [`RequestBudget`], and its three implementations over
//! `ratebudget`: token buckets under a name of one's own keyed by any bytes
//! ([`BucketBudget`]), a named (GCRA) limiter keyed by any bytes ([`NamedBudget`]), and a
//! scope's token buckets keyed by a Node's or Domain's id ([`ScopeBudget`]).
//!
//! The layer knows nothing of tables, algorithms or policies: it hands a budget a key and a
//! cost and turns the [`Answer`] into a response. Each implementation decides through a
//! [`Guard`], so the pre-check, the circuit and each take's fail mode apply exactly as they do
//! to the `plexsphere` binary's own budgets.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use ratebudget::{
    Clock, Decider, Decision, Enforcement, Guard, InsufficientCapacity, Key, Limit, LimiterName, NamedKey,
    NamedSpend, Scope, SingleBudget, Spender, Take, TokenBuckets, Undecided,
};

use crate::Reading;

/// What a request spends under: any bytes (a client address, an API key, a tenant's name).
///
/// Keys may be credentials, so `Debug` shows only their length.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct RequestKey(Box<[u8]>);

impl RequestKey {
    /// A key of these bytes.
    pub fn new(bytes: impl Into<Vec<u8>>) -> RequestKey {
        RequestKey(bytes.into().into_boxed_slice())
    }

    /// The key's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl From<&str> for RequestKey {
    fn from(text: &str) -> Self {
        RequestKey::new(text)
    }
}

impl From<String> for RequestKey {
    fn from(text: String) -> Self {
        RequestKey::new(text)
    }
}

impl fmt::Debug for RequestKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RequestKey(<{} bytes>)", self.0.len())
    }
}

/// What a budget answered for a request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Answer {
    /// Admitted: spent, or admitted without spending (a shadow budget's refusal, a take that
    /// fails open while the store cannot answer). The fields, when the budget can report them.
    Admitted(Option<Reading>),
    /// Refused for now; nothing was spent.
    Refused(Refused),
    /// The cost is above anything the budget ever holds: no wait will admit it.
    NeverFits(InsufficientCapacity),
}

/// A refusal, in the terms a response needs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Refused {
    /// How long until the cost could be covered if nobody else spends.
    pub retry_after: Duration,
    /// The refused bucket's fields, when the budget can report them.
    pub fields: Option<Reading>,
}

/// Why a budget gave no answer. Never a refusal.
#[derive(Debug, thiserror::Error)]
pub enum SpendError {
    /// The key names no bucket of this budget (a scope's buckets are keyed by uuids): the
    /// request's fault, a 400.
    #[error("the key names no bucket of this budget: {0}")]
    InvalidKey(&'static str),
    /// The budget could not be decided (the store could not answer and the take fails
    /// closed, say): a 500, never a 429.
    #[error("the budget could not be decided")]
    Undecided(#[from] Undecided),
}

/// A budget requests spend from.
///
/// Implementations MUST answer `Err` when they could not decide, never a refusal: a refusal
/// tells a client to back off from a cap, and an outage reported as one would tell every
/// client to back off from a cap none of them reached.
#[async_trait]
pub trait RequestBudget: Send + Sync + fmt::Debug {
    /// Spends `cost` from `key`'s budget now.
    ///
    /// # Errors
    /// [`SpendError::InvalidKey`] when `key` cannot name a bucket of this budget, before
    /// anything is spent; [`SpendError::Undecided`] when the budget could not be decided.
    async fn spend(&self, key: &RequestKey, cost: u64) -> Result<Answer, SpendError>;

    /// The refusal this replica already knows `key` would get for `cost`, without asking the
    /// store or spending anything: for refusing before a service does costly work. `None`
    /// means "not known to be refused", not "admitted"; a budget that keeps no such
    /// knowledge always answers `None`.
    fn known_refusal(&self, key: &RequestKey, cost: u64) -> Option<Refused>;
}

/// A named (GCRA) limiter of one limit: keys of any bytes, whole cells (a cost above
/// `u32::MAX` cells never fits).
#[derive(Clone, Debug)]
pub struct NamedBudget {
    limiter: LimiterName,
    limit: Limit,
    enforcement: Enforcement,
    guard: Arc<Guard>,
    decider: Arc<dyn Decider>,
    clock: Arc<dyn Clock>,
}

impl NamedBudget {
    /// `limiter`'s keys, `limit` each, decided through `guard` at `clock`'s now (tests move a
    /// [`ManualClock`](ratebudget::ManualClock) rather than sleep); enforced, and failing
    /// closed while the store cannot answer ([`Enforcement::STRICT`]).
    pub fn new(limiter: LimiterName, limit: Limit, guard: Arc<Guard>, clock: Arc<dyn Clock>) -> NamedBudget {
        NamedBudget { limiter, limit, enforcement: Enforcement::STRICT, decider: guard.clone(), guard, clock }
    }

    /// The same budget under `enforcement`: its fail mode says what decides while the store
    /// cannot answer (a 500, this replica's fallback bucket, or admission), its mode whether a
    /// refusal refuses.
    pub fn with_enforcement(self, enforcement: Enforcement) -> NamedBudget {
        NamedBudget { enforcement, ..self }
    }

    /// The same budget deciding through `decider`, a gate in front of the guard (the
    /// `plexsphere` binary's clock gate, say); refusals already known are still the guard's.
    pub fn deciding_through(self, decider: Arc<dyn Decider>) -> NamedBudget {
        NamedBudget { decider, ..self }
    }

    fn spend_of(&self, key: &RequestKey, cost: u64) -> NamedSpend {
        NamedSpend {
            limiter: self.limiter,
            key: NamedKey::of(self.limiter, key.as_bytes()),
            cells: u32::try_from(cost).unwrap_or(u32::MAX),
            limit: self.limit,
            enforcement: self.enforcement,
        }
    }
}

#[async_trait]
impl RequestBudget for NamedBudget {
    async fn spend(&self, key: &RequestKey, cost: u64) -> Result<Answer, SpendError> {
        let take = Take::Named(self.spend_of(key, cost));
        let now = self.clock.now();
        let decision = self.decider.decide(take.clone(), now).await?;
        if self.enforcement.is_shadow() && !decision.is_granted() {
            // Decided and spent as if enforced (the observer saw the refusal); admitted.
            return Ok(Answer::Admitted(None));
        }
        Ok(answer(&take, &decision, now))
    }

    fn known_refusal(&self, key: &RequestKey, cost: u64) -> Option<Refused> {
        if self.enforcement.is_shadow() {
            return None;
        }
        let spend = self.spend_of(key, cost);
        let now = self.clock.now();
        let refusal = self.guard.known_refusal(spend, now)?;
        let fields = Reading::binding(&Take::Named(spend), &Decision::Refused(refusal), now);
        Some(Refused { retry_after: refusal.retry_after, fields })
    }
}

/// Token buckets under a name of their own (a [`TokenBuckets`]): keys of any bytes, each its
/// own bucket of one limit, costs fractional (a request's body length, say).
#[derive(Clone, Debug)]
pub struct BucketBudget {
    buckets: TokenBuckets,
}

impl BucketBudget {
    /// Requests spend from `buckets`.
    pub fn new(buckets: TokenBuckets) -> BucketBudget {
        BucketBudget { buckets }
    }
}

#[async_trait]
impl RequestBudget for BucketBudget {
    async fn spend(&self, key: &RequestKey, cost: u64) -> Result<Answer, SpendError> {
        // Exact: costs of requests and bytes stay far below 2^53.
        let spend = self.buckets.spend(key.as_bytes(), cost as f64);
        let take = Take::Single(spend);
        let now = self.buckets.now();
        let decision = self.buckets.take_at(key.as_bytes(), cost as f64, now).await?;
        if spend.enforcement.is_shadow() && !decision.is_granted() {
            // Decided and spent as if enforced (the observer saw the refusal); admitted.
            return Ok(Answer::Admitted(None));
        }
        Ok(answer(&take, &decision, now))
    }

    /// Always `None`: the guard pre-checks token buckets inside every take instead, which
    /// refuses a spent bucket without a statement all the same.
    fn known_refusal(&self, _: &RequestKey, _: u64) -> Option<Refused> {
        None
    }
}

/// A scope's token buckets, keyed by the uuid of a Node or a Domain (its text), each sized by
/// the policy the spender's [`Budgets`](ratebudget::Budgets) give for the key: the rules, in
/// the `plexsphere` binary. The key is also the Domain the policy is asked for, which is right
/// for a Domain's scopes; a Node's scope gets the policy every Domain's Nodes have.
#[derive(Clone, Debug)]
pub struct ScopeBudget {
    budget: SingleBudget,
}

impl ScopeBudget {
    /// `scope`'s buckets, spent through `spender`.
    pub fn new(spender: Spender, scope: Scope) -> ScopeBudget {
        ScopeBudget { budget: spender.single(scope) }
    }
}

#[async_trait]
impl RequestBudget for ScopeBudget {
    async fn spend(&self, key: &RequestKey, cost: u64) -> Result<Answer, SpendError> {
        let key = std::str::from_utf8(key.as_bytes())
            .ok()
            .and_then(|text| uuid::Uuid::parse_str(text).ok())
            .filter(|id| !id.is_nil())
            .map(Key::from)
            .ok_or(SpendError::InvalidKey("not the id of a Node or a Domain (a uuid)"))?;
        // Exact: costs of requests and bytes stay far below 2^53.
        let spent = self.budget.spend_detailed(key, key, cost as f64).await?;
        Ok(answer(&spent.take, &spent.decision, spent.now))
    }

    /// Always `None`: the guard pre-checks token buckets inside every take instead, which
    /// refuses a spent bucket without a statement all the same.
    fn known_refusal(&self, _: &RequestKey, _: u64) -> Option<Refused> {
        None
    }
}

/// `decision`'s answer, with the fields of the bucket that binds.
fn answer(take: &Take, decision: &Decision, now: chrono::DateTime<chrono::Utc>) -> Answer {
    let fields = Reading::binding(take, decision, now);
    match decision {
        Decision::Granted(_) => Answer::Admitted(fields),
        Decision::Refused(refusal) => Answer::Refused(Refused { retry_after: refusal.retry_after, fields }),
        Decision::InsufficientCapacity(never) => Answer::NeverFits(*never),
    }
}
