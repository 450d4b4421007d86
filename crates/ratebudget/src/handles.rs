//! A budget under a name of its user's own, ready to take from: what a user of the crate alone
//! holds. Each builds the [`Take`] for a key and a cost and asks its [`Decider`] (a
//! [`Guard`](crate::Guard) in front of the [`Store`](crate::Store)) at its clock's now: the
//! crate's one way to take, made short.
//!
//! ```text
//! ratebudget::MIGRATOR.run(&pool).await?;
//! let (clock, status) = DatabaseClock::spawn(pool.clone(), Duration::from_secs(1));
//! let guard = Arc::new(Guard::builder(Store::new(pool)).trusted_only(status).build());
//! let uploads = TokenBuckets::new(Name::new("uploads")?, Limit::new(1e6, 4e6)?, guard, Arc::new(clock));
//! match uploads.take("api-key-alice", 1500.0).await? {
//!     Decision::Granted(_) => { /* serve it */ }
//!     Decision::Refused(refusal) => { /* 429, Retry-After: refusal.retry_after */ }
//!     Decision::InsufficientCapacity(_) => { /* 413: never fits */ }
//! }
//! ```

use std::sync::Arc;

use crate::{
    Clock, Decider, Decision, Enforcement, Key, Limit, Name, NamedKey, NamedSpend, Spend, Take, Undecided,
};

/// Token buckets under one name: each key (any bytes: an API key, a client address, a tenant)
/// has a bucket of its own, all of one limit, shared by every process on the database. Costs
/// are fractional (bytes, say). Cheap to clone.
#[derive(Clone, Debug)]
pub struct TokenBuckets {
    name: Name,
    limit: Limit,
    enforcement: Enforcement,
    decider: Arc<dyn Decider>,
    clock: Arc<dyn Clock>,
}

impl TokenBuckets {
    /// The budget `name` of `limit`, decided by `decider` at `clock`'s now, enforced strictly
    /// (a refusal refuses; a store that cannot answer is [`Undecided`]).
    pub fn new(name: Name, limit: Limit, decider: Arc<dyn Decider>, clock: Arc<dyn Clock>) -> TokenBuckets {
        TokenBuckets { name, limit, enforcement: Enforcement::STRICT, decider, clock }
    }

    /// This budget, enforced as `enforcement` says (shadow, a fail mode).
    pub fn with_enforcement(mut self, enforcement: Enforcement) -> TokenBuckets {
        self.enforcement = enforcement;
        self
    }

    /// The budget's name.
    pub fn name(&self) -> Name {
        self.name
    }

    /// The budget's limit.
    pub fn limit(&self) -> Limit {
        self.limit
    }

    /// The spend of `cost` from `key`'s bucket, for a caller that builds takes itself (a pair
    /// with another budget, all-or-nothing).
    pub fn spend(&self, key: &[u8], cost: f64) -> Spend {
        Spend {
            name: self.name,
            key: Key::hashed(self.name, key),
            cost,
            limit: self.limit,
            enforcement: self.enforcement,
        }
    }

    /// The instant a take now is decided at, by this budget's clock.
    pub fn now(&self) -> chrono::DateTime<chrono::Utc> {
        self.clock.now()
    }

    /// Takes `cost` from `key`'s bucket now.
    ///
    /// # Errors
    /// [`Undecided`] when the take could not be decided (bad input, the store failing with a
    /// strict fail mode); never a refusal.
    pub async fn take(&self, key: impl AsRef<[u8]>, cost: f64) -> Result<Decision, Undecided> {
        self.take_at(key, cost, self.clock.now()).await
    }

    /// Takes `cost` from `key`'s bucket at `now` (a caller that reports the decision, with
    /// the instant it was made at).
    ///
    /// # Errors
    /// As [`TokenBuckets::take`].
    pub async fn take_at(
        &self,
        key: impl AsRef<[u8]>,
        cost: f64,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<Decision, Undecided> {
        self.decider.decide(Take::Single(self.spend(key.as_ref(), cost)), now).await
    }
}

/// A named limiter (GCRA) under one name: each key (any bytes) its own theoretical arrival
/// time, of one limit, in whole cells, shared by every process on the database. Cheap to clone.
#[derive(Clone, Debug)]
pub struct GcraLimiter {
    name: Name,
    limit: Limit,
    enforcement: Enforcement,
    decider: Arc<dyn Decider>,
    clock: Arc<dyn Clock>,
}

impl GcraLimiter {
    /// The limiter `name` of `limit` (see [`Limit::fits_gcra`]), decided by `decider` at
    /// `clock`'s now, enforced strictly.
    pub fn new(name: Name, limit: Limit, decider: Arc<dyn Decider>, clock: Arc<dyn Clock>) -> GcraLimiter {
        GcraLimiter { name, limit, enforcement: Enforcement::STRICT, decider, clock }
    }

    /// This limiter, enforced as `enforcement` says.
    pub fn with_enforcement(mut self, enforcement: Enforcement) -> GcraLimiter {
        self.enforcement = enforcement;
        self
    }

    /// The limiter's name.
    pub fn name(&self) -> Name {
        self.name
    }

    /// The limiter's limit.
    pub fn limit(&self) -> Limit {
        self.limit
    }

    /// The request of `cells` for `key`.
    pub fn spend(&self, key: &[u8], cells: u32) -> NamedSpend {
        NamedSpend {
            limiter: self.name,
            key: NamedKey::of(self.name, key),
            cells,
            limit: self.limit,
            enforcement: self.enforcement,
        }
    }

    /// Takes `cells` for `key` now.
    ///
    /// # Errors
    /// [`Undecided`] when the request could not be decided; never a refusal.
    pub async fn take(&self, key: impl AsRef<[u8]>, cells: u32) -> Result<Decision, Undecided> {
        self.decider.decide(Take::Named(self.spend(key.as_ref(), cells)), self.clock.now()).await
    }
}
