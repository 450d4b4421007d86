//! The pre-check: what the store last said of each bucket, and the refusals it foresees
//! without a statement (see the module documentation of [`super`] for why they are exact).
//! Also what a take is to the guard, in either algorithm: its buckets, each with its entry.

use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};

use super::{lock, Guard};
use crate::named::{self, Gcra};
use crate::sides::{self, Sides};
use crate::{Decision, FailMode, Fill, Key, Name, NamedKey, NamedSpend, Refusal, Spend, Take, Which};

/// Which bucket an entry is about: a token bucket of a budget, or a key of a named limiter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum BucketId {
    Budget(Name, Key),
    Named(Name, NamedKey),
}

impl BucketId {
    /// The budget or limiter the bucket belongs to.
    pub(super) fn name(self) -> Name {
        match self {
            BucketId::Budget(name, _) | BucketId::Named(name, _) => name,
        }
    }
}

/// What the store last said about one bucket: the pre-check's whole state for it.
///
/// Shared as `Arc<Mutex<Known>>`: a take holds its bucket's entry from before it asks the
/// store until it learns the answer, so an answer that arrives after the entry was forgotten
/// (a reset meanwhile) is written into the forgotten entry, where nothing reads it.
#[derive(Debug, Default)]
pub(super) struct Known {
    /// The row as the store last described it.
    pub(super) fill: Option<Fill>,
    /// For a named limiter: the key's TAT (µs) as the store last described it.
    pub(super) tat: Option<i64>,
    /// For a token bucket: this replica's lease of it, and its demand here. Forgotten with
    /// the entry (a reset, a rule that changed, eviction), which only forfeits its tokens.
    pub(super) lease: super::leases::Lease,
}

/// A take's spends with their pre-check entries: kept inline up to two, since this runs for
/// every take (a take of many buckets allocates).
pub(super) type Entries = smallvec::SmallVec<[(Which, Spend, Arc<Mutex<Known>>); 2]>;

/// A take as the pre-check, the circuit and the fallback see it: the buckets it spends, each
/// with what the pre-check knows of it.
pub(super) enum Guarded {
    /// One or more token buckets, reduced as the store reduces them (`sides::of`).
    Buckets(Entries),
    /// One key of a named (GCRA) limiter, taking 1 to its burst cells.
    Named { spend: NamedSpend, gcra: Gcra, entry: Arc<Mutex<Known>> },
}

impl Guarded {
    /// What `take` is to `guard`; `None` when the store answers it without a query.
    ///
    /// # Errors
    /// A spend that is not valid (the store would refuse it as bad input).
    pub(super) fn of(guard: &Guard, take: &Take) -> Result<Option<Guarded>, crate::Error> {
        if let Take::Named(spend) = *take {
            let usable = Gcra::of(spend.limit).filter(|gcra| (1..=gcra.burst).contains(&spend.cells));
            return Ok(usable.map(|gcra| Guarded::Named {
                spend,
                gcra,
                entry: guard.entry(BucketId::Named(spend.limiter, spend.key)),
            }));
        }
        // The same reductions the store makes, so that whatever the store is asked goes
        // through the pre-check, the decision timeout, the circuit and the fail mode.
        Ok(match sides::of(take)? {
            Sides::Answered(_) => None,
            Sides::Send(spends) => Some(Guarded::Buckets(
                spends
                    .into_iter()
                    .map(|(which, spend)| {
                        (which, spend, guard.entry(BucketId::Budget(spend.name, spend.key)))
                    })
                    .collect(),
            )),
        })
    }

    /// The refusal the pre-check can give without the store, if any, with its exact wait. A
    /// token bucket refuses when the row the store last gave cannot cover the cost by `now`;
    /// a GCRA key when the TAT it last gave makes the cells not conform yet (concurrent
    /// requests only push a TAT later, so the store would too).
    pub(super) fn precheck(&self, now: DateTime<Utc>) -> Option<Refusal> {
        match self {
            Guarded::Buckets(entries) => entries.iter().find_map(|(which, spend, entry)| {
                let fill = lock(entry).fill?;
                (spend.limit.level(fill, now) < spend.cost).then(|| Refusal {
                    which: *which,
                    retry_after: spend.limit.time_to_cover(fill, spend.cost, now),
                    judged: Some(fill),
                    tat: None,
                })
            }),
            Guarded::Named { spend, gcra, entry } => {
                let tat = lock(entry).tat?;
                not_yet_conforming(*gcra, spend.cells, tat, now)
            }
        }
    }

    /// Remembers what the store said about each bucket.
    pub(super) fn learn(&self, decision: &Decision) {
        match (self, decision) {
            (Guarded::Buckets(entries), Decision::Granted(grant)) => {
                for (which, _, entry) in entries {
                    if let Some(fill) = grant.remaining(*which) {
                        lock(entry).fill = Some(fill);
                    }
                }
            }
            (Guarded::Buckets(entries), Decision::Refused(refusal)) => {
                if let Some(fill) = refusal.judged {
                    if let Some((_, _, entry)) = entries.iter().find(|(which, _, _)| *which == refusal.which)
                    {
                        lock(entry).fill = Some(fill);
                    }
                }
            }
            (Guarded::Named { entry, .. }, decision) => {
                let tat = match decision {
                    Decision::Granted(grant) => grant.named.map(|(tat, _)| tat),
                    Decision::Refused(refusal) => refusal.tat,
                    Decision::InsufficientCapacity(_) => None,
                };
                if let Some(tat) = tat {
                    lock(entry).tat = Some(named::micros(tat));
                }
            }
            (Guarded::Buckets(_), Decision::InsufficientCapacity(_)) => {}
        }
    }

    /// The take's fail mode: a take spending several budgets fails by the strictest of theirs.
    pub(super) fn fail_mode(&self) -> FailMode {
        match self {
            Guarded::Buckets(entries) => entries
                .iter()
                .map(|(_, spend, _)| spend.enforcement.fail_mode)
                .reduce(FailMode::stricter)
                .unwrap_or(FailMode::Closed),
            Guarded::Named { spend, .. } => spend.enforcement.fail_mode,
        }
    }

    /// The budgets (or limiter) it spends, for the log.
    pub(super) fn names(&self) -> smallvec::SmallVec<[Name; 2]> {
        match self {
            Guarded::Buckets(entries) => entries.iter().map(|(_, spend, _)| spend.name).collect(),
            Guarded::Named { spend, .. } => smallvec::smallvec![spend.limiter],
        }
    }
}

/// The refusal of `cells` of a GCRA key whose TAT (µs) is `tat`, if they do not conform at
/// `now` yet.
pub(super) fn not_yet_conforming(gcra: Gcra, cells: u32, tat: i64, now: DateTime<Utc>) -> Option<Refusal> {
    let (now_us, earliest) = (named::micros(now), gcra.earliest(tat, cells));
    (now_us < earliest).then(|| Refusal {
        which: Which::First,
        retry_after: named::until(now_us, earliest),
        judged: None,
        tat: Some(named::instant(tat)),
    })
}
