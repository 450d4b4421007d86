//! What a take answers: granted, refused for now, or never possible.
//!
//! One type for a single take and a two-budget take alike, so that every caller reads the
//! same answer and none recomputes it. Modelled on governor's split between "not now, but at
//! this instant" (`NotUntil`) and "never" (`InsufficientCapacity`): a refusal carries how long
//! until the refused cost could be covered, and a cost above the burst is its own answer
//! rather than a refusal with an invented wait.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use crate::{Fill, NamedSpend, Spend, Undecided};

/// One take: a spend from one bucket, or from two all-or-nothing, or a request against a
/// named (GCRA) limiter.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Take {
    /// One bucket.
    Single(Spend),
    /// Two buckets, both debited or neither; [`Which::First`] is reported when both refuse.
    Pair(Spend, Spend),
    /// One key of a named limiter; its answers name [`Which::First`].
    Named(NamedSpend),
}

impl Take {
    /// The bucket spend `which` names, if this take has it (a named take has none).
    pub fn spend(&self, which: Which) -> Option<Spend> {
        match (self, which) {
            (Take::Single(spend) | Take::Pair(spend, _), Which::First) => Some(*spend),
            (Take::Pair(_, spend), Which::Second) => Some(*spend),
            (Take::Single(_) | Take::Named(_), _) => None,
        }
    }

    /// Each bucket spend with its position (none for a named take).
    pub fn spends(&self) -> impl Iterator<Item = (Which, Spend)> + '_ {
        [Which::First, Which::Second].into_iter().filter_map(|which| Some((which, self.spend(which)?)))
    }
}

/// Which spend of a [`Take`] an answer is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Which {
    /// The single spend, or the first of a pair.
    First,
    /// The second of a pair.
    Second,
}

/// What a take decided.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Decision {
    /// Every bucket covered its cost and was debited.
    Granted(Grant),
    /// A bucket could not cover its cost now; nothing was debited or written.
    Refused(Refusal),
    /// A cost is above its bucket's burst, so no wait will ever cover it; nothing was written.
    InsufficientCapacity(InsufficientCapacity),
}

impl Decision {
    /// Whether the take was granted.
    pub fn is_granted(&self) -> bool {
        matches!(self, Decision::Granted(_))
    }
}

/// What a grant left in each bucket.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Grant {
    pub(crate) first: Option<Fill>,
    pub(crate) second: Option<Fill>,
    /// For a named limiter: the key's TAT as the grant set it, and the cells it leaves.
    pub(crate) named: Option<(DateTime<Utc>, u32)>,
}

impl Grant {
    /// A grant that looked at no bucket (every cost was zero).
    pub(crate) const FREE: Grant = Grant { first: None, second: None, named: None };

    /// For a named limiter's grant: the cells left at the decision's instant.
    pub fn cells_left(&self) -> Option<u32> {
        self.named.map(|(_, left)| left)
    }

    /// For a named limiter's grant: the key's theoretical arrival time as the grant set it,
    /// the instant its budget is full again if nobody spends.
    pub fn tat(&self) -> Option<DateTime<Utc>> {
        self.named.map(|(tat, _)| tat)
    }

    /// The bucket `which` right after the debit: `tokens` is what is left at the decision's
    /// instant. `None` for a spend of zero cost, which is granted without looking at its bucket.
    pub fn remaining(&self, which: Which) -> Option<Fill> {
        match which {
            Which::First => self.first,
            Which::Second => self.second,
        }
    }
}

/// A refusal: which bucket, and when it could cover the cost.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Refusal {
    /// The bucket that refused.
    pub which: Which,
    /// How long until the refused bucket covers the cost if nobody else spends from it: a
    /// caller that waits exactly this long is admitted then.
    pub retry_after: Duration,
    /// The bucket as the refusal judged it. `None` when a concurrent take won the last tokens
    /// under the row lock, so the level is known only to be below the cost; `retry_after` is
    /// then the time an empty bucket takes to cover it, which bounds the wait. Always `None`
    /// for a named limiter, whose state is `tat`.
    pub judged: Option<Fill>,
    /// For a named limiter, the key's theoretical arrival time as the refusal judged it
    /// (`None` when a concurrent request won under the lock, or for a bucket).
    pub tat: Option<DateTime<Utc>>,
}

/// A cost no bucket of its budget can ever cover.
#[derive(Clone, Copy, Debug, PartialEq, thiserror::Error)]
#[error("a cost of {cost} can never be covered by a bucket of burst {burst}")]
pub struct InsufficientCapacity {
    /// The bucket whose burst is too small.
    pub which: Which,
    /// What was asked for.
    pub cost: f64,
    /// The most that bucket ever holds.
    pub burst: f64,
}

/// Anything that decides takes: the shared store, or a layer in front of it.
///
/// Implementations MUST return `Err` when they could not decide, never a refusal: a refusal
/// tells a caller a cap was reached, and an outage reported as one would tell a whole fleet to
/// back off from a cap none of them reached.
#[async_trait]
pub trait Decider: Send + Sync + std::fmt::Debug {
    /// Decides `take` at the caller's `now`.
    ///
    /// # Errors
    /// [`Undecided::Store`] with the store's [`Error`](crate::Error): `ZeroKey` or
    /// `NegativeCost` before any query, `InvalidBudget` when one bucket is named twice with two
    /// different limits, `Database` when the store could not answer; and, from a
    /// [`Guard`](crate::Guard), [`Undecided::TimedOut`] or [`Undecided::StoreFailing`].
    async fn decide(&self, take: Take, now: DateTime<Utc>) -> Result<Decision, Undecided>;

    /// Leases tokens of one bucket ([`LeaseRequest`]) at `now`, for a [`Guard`](crate::Guard)
    /// to grant from memory: `Ok(None)` from a decider that cannot lease (the default), whose
    /// guard then takes every take from it directly.
    ///
    /// # Errors
    /// As [`Decider::decide`].
    async fn lease(&self, request: LeaseRequest, now: DateTime<Utc>) -> Result<Option<Leased>, Undecided> {
        let _ = (request, now);
        Ok(None)
    }

    /// Charges `spend.cost` to its bucket at `now` whatever it holds, leaving it in debt when
    /// it does not cover the cost ([`Store::charge`](crate::Store::charge)): the row as
    /// charged, or `Ok(None)` when a [`Guard`](crate::Guard) whose store cannot answer
    /// accepted the charge by its fail mode `OPEN`, charged nowhere (`STATIC` charges this
    /// replica's fallback bucket, and answers what it holds as a row would).
    ///
    /// # Errors
    /// As [`Decider::decide`]; a decider that cannot charge (the default) is
    /// [`Undecided::Declined`].
    async fn charge(&self, spend: Spend, now: DateTime<Utc>) -> Result<Option<Fill>, Undecided> {
        let _ = (spend, now);
        Err(Undecided::Declined("this decider cannot charge a bucket".into()))
    }

    /// What `spend`'s bucket holds at `now`, without spending or writing
    /// ([`Store::peek`](crate::Store::peek)): a fill whose level at `now` is the bucket's (a
    /// missing bucket reads as full), or `Ok(None)` when a [`Guard`](crate::Guard) whose store
    /// cannot answer does not know (fail mode `OPEN`; `STATIC` reads this replica's fallback
    /// bucket). `spend.cost` is the level the caller needs: a guard answers a bucket it
    /// already knows to hold less without asking the store.
    ///
    /// # Errors
    /// As [`Decider::decide`]; a decider that cannot read a bucket (the default) is
    /// [`Undecided::Declined`].
    async fn peek(&self, spend: Spend, now: DateTime<Utc>) -> Result<Option<Fill>, Undecided> {
        let _ = (spend, now);
        Err(Undecided::Declined("this decider cannot read a bucket".into()))
    }
}

/// A lease of one token bucket: after giving back `refund` tokens of the lease numbered
/// `refund_serial` (credited only if no lease of the bucket was made since), take at least
/// `at_least` and at most `at_most` tokens, as many as the bucket holds. `spend` names the
/// bucket and its limit; its cost is not used.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LeaseRequest {
    /// The bucket and its limit.
    pub spend: Spend,
    /// The least worth taking: the take that asked for the lease.
    pub at_least: f64,
    /// The most to take.
    pub at_most: f64,
    /// Tokens of an earlier lease not granted, to give back first.
    pub refund: f64,
    /// The number of the lease they came from.
    pub refund_serial: i64,
}

/// What a lease took.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Leased {
    /// Tokens taken: 0, or between the request's `at_least` and `at_most`.
    pub leased: f64,
    /// Of the refund, what was credited (the rest was forfeited).
    pub refunded: f64,
    /// The lease's number, to give its tokens back under.
    pub serial: i64,
    /// The row as the lease left it (or as judged, when it took nothing).
    pub row: Fill,
}
