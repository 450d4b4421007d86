//! What a take answers: granted, refused for now, or never possible.
//!
//! One type for a single take and a two-budget take alike, so that every caller reads the
//! same answer and none recomputes it. Modelled on governor's split between "not now, but at
//! this instant" (`NotUntil`) and "never" (`InsufficientCapacity`): a refusal carries how long
//! until the refused cost could be covered, and a cost above the burst is its own answer
//! rather than a refusal with an invented wait.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use crate::{Fill, NamedSpend, Spend, Undecided};

/// One take: a spend from one bucket, from two or any number all-or-nothing, or a request
/// against a named (GCRA) limiter.
///
/// Not `Copy` since [`Take::Many`] holds its spends behind an `Arc`: cloning a take is
/// cheap (a reference count at most).
#[derive(Clone, Debug, PartialEq)]
pub enum Take {
    /// One bucket.
    Single(Spend),
    /// Two buckets, both debited or neither; [`Which::First`] is reported when both refuse.
    Pair(Spend, Spend),
    /// Any number of buckets (one request's descriptors, say), every one debited or none, in
    /// one statement: [`Which::at`]`(i)` names the `i`-th. The first that cannot cover its
    /// cost, in this order, is reported. A bucket named more than once takes every cost named
    /// for it (which needs one limit), as a pair naming one bucket twice does. `Take::Pair(a,
    /// b)` and `Take::Many([a, b])` decide alike.
    Many(Arc<[Spend]>),
    /// One key of a named limiter; its answers name [`Which::First`].
    Named(NamedSpend),
}

impl Take {
    /// A take of every spend of `spends`, all or nothing ([`Take::Many`]).
    pub fn many(spends: impl Into<Arc<[Spend]>>) -> Take {
        Take::Many(spends.into())
    }

    /// The bucket spend `which` names, if this take has it (a named take has none).
    pub fn spend(&self, which: Which) -> Option<Spend> {
        match (self, which.index()) {
            (Take::Single(spend) | Take::Pair(spend, _), 0) => Some(*spend),
            (Take::Pair(_, spend), 1) => Some(*spend),
            (Take::Many(spends), index) => spends.get(index).copied(),
            (Take::Single(_) | Take::Pair(..) | Take::Named(_), _) => None,
        }
    }

    /// Each bucket spend with its position (none for a named take).
    pub fn spends(&self) -> impl Iterator<Item = (Which, Spend)> + '_ {
        let spends: &[Spend] = match self {
            Take::Single(spend) => std::slice::from_ref(spend),
            Take::Pair(first, second) => return Spends::Pair([*first, *second], 0),
            Take::Many(spends) => spends,
            Take::Named(_) => &[],
        };
        Spends::Slice(spends.iter().enumerate())
    }

    /// How many bucket spends it has (0 for a named take).
    pub fn len(&self) -> usize {
        match self {
            Take::Single(_) => 1,
            Take::Pair(..) => 2,
            Take::Many(spends) => spends.len(),
            Take::Named(_) => 0,
        }
    }

    /// Whether it spends no bucket: a named take, or [`Take::Many`] of nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The spends of a take with their positions ([`Take::spends`]).
enum Spends<'a> {
    Pair([Spend; 2], usize),
    Slice(std::iter::Enumerate<std::slice::Iter<'a, Spend>>),
}

impl Iterator for Spends<'_> {
    type Item = (Which, Spend);

    fn next(&mut self) -> Option<(Which, Spend)> {
        match self {
            Spends::Pair(spends, next) => {
                let spend = *spends.get(*next)?;
                *next += 1;
                Some((Which::at(*next - 1), spend))
            }
            Spends::Slice(spends) => spends.next().map(|(index, spend)| (Which::at(index), *spend)),
        }
    }
}

/// Which spend of a [`Take`] an answer is about: its position, from 0.
///
/// [`Which::First`] and [`Which::Second`] are positions 0 and 1 (the single spend, or a
/// pair's two; they match as patterns), [`Which::at`] any position of a [`Take::Many`].
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Which(usize);

#[allow(non_upper_case_globals)]
impl Which {
    /// The single spend, or the first of a pair (position 0).
    pub const First: Which = Which(0);
    /// The second of a pair (position 1).
    pub const Second: Which = Which(1);

    /// The spend at `index`, from 0.
    pub const fn at(index: usize) -> Which {
        Which(index)
    }

    /// Its position, from 0.
    pub const fn index(self) -> usize {
        self.0
    }
}

impl std::fmt::Debug for Which {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            0 => f.write_str("First"),
            1 => f.write_str("Second"),
            index => write!(f, "At({index})"),
        }
    }
}

/// What a take decided. Not `Copy`: a grant of a [`Take::Many`] holds what it left in each of
/// its buckets behind an `Arc`.
#[derive(Clone, Debug, PartialEq)]
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
#[derive(Clone, Debug, PartialEq)]
pub struct Grant {
    pub(crate) first: Option<Fill>,
    pub(crate) second: Option<Fill>,
    /// For a named limiter: the key's TAT as the grant set it, and the cells it leaves.
    pub(crate) named: Option<(DateTime<Utc>, u32)>,
    /// For a take of more than two buckets: what each position from the third on left.
    pub(crate) rest: Option<Arc<[Option<Fill>]>>,
}

impl Grant {
    /// A grant that looked at no bucket (every cost was zero).
    pub(crate) const FREE: Grant = Grant { first: None, second: None, named: None, rest: None };

    /// A grant of bucket spends, each position with what it left (`None`: not looked at).
    pub(crate) fn of(fills: impl IntoIterator<Item = (Which, Fill)>) -> Grant {
        let mut grant = Grant::FREE;
        let mut rest: Vec<Option<Fill>> = Vec::new();
        for (which, fill) in fills {
            match which.index() {
                0 => grant.first = Some(fill),
                1 => grant.second = Some(fill),
                index => {
                    if rest.len() < index - 1 {
                        rest.resize(index - 1, None);
                    }
                    rest[index - 2] = Some(fill);
                }
            }
        }
        if !rest.is_empty() {
            grant.rest = Some(rest.into());
        }
        grant
    }

    /// The positions this grant says something of, with what each left.
    pub(crate) fn fills(&self) -> impl Iterator<Item = (Which, Fill)> + '_ {
        let rest = self.rest.as_deref().unwrap_or(&[]);
        [self.first, self.second]
            .into_iter()
            .chain(rest.iter().copied())
            .enumerate()
            .filter_map(|(index, fill)| Some((Which::at(index), fill?)))
    }

    /// This grant, with what each bucket left also said at every other position of `take`
    /// that spends from it (a bucket named twice is decided once, at one position); a free
    /// spend (cost 0) still looks at nothing.
    pub(crate) fn spread_over(self, take: &Take) -> Grant {
        if !matches!(take, Take::Pair(..) | Take::Many(_)) {
            return self;
        }
        let bucket = |which: Which| take.spend(which).map(|spend| (spend.name, spend.key));
        let known: Vec<(Which, Fill)> = self.fills().collect();
        let missing = take.spends().any(|(which, spend)| {
            !spend.is_free()
                && self.remaining(which).is_none()
                && known.iter().any(|(at, _)| bucket(*at) == Some((spend.name, spend.key)))
        });
        if !missing {
            return self;
        }
        let named = self.named;
        let spread = take.spends().filter(|(_, spend)| !spend.is_free()).filter_map(|(which, spend)| {
            let fill = self.remaining(which).or_else(|| {
                known
                    .iter()
                    .find(|(at, _)| bucket(*at) == Some((spend.name, spend.key)))
                    .map(|(_, fill)| *fill)
            })?;
            Some((which, fill))
        });
        Grant { named, ..Grant::of(spread) }
    }

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
    /// instant. `None` for a spend of zero cost, which is granted without looking at its
    /// bucket, and for a position the take does not have.
    pub fn remaining(&self, which: Which) -> Option<Fill> {
        match which.index() {
            0 => self.first,
            1 => self.second,
            index => self.rest.as_deref().and_then(|rest| rest.get(index - 2).copied().flatten()),
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
