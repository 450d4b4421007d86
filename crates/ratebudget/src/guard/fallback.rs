//! The fallback: in-memory token buckets that decide, per replica, while the store cannot
//! answer, for takes that fail [`FailMode::Static`](crate::FailMode::Static). A GCRA limiter's
//! is a token bucket of the same rate and burst, this replica's own approximation of the shared
//! limiter.

use std::collections::HashMap;
use std::sync::Mutex;

use chrono::{DateTime, Utc};

use super::lock;
use super::precheck::{BucketId, Guarded};
use crate::named;
use crate::{Decision, Fill, Grant, Refusal, Which};

/// An in-memory token bucket: a level as of an instant.
#[derive(Clone, Copy, Debug)]
struct LocalBucket {
    level: f64,
    at: DateTime<Utc>,
    /// The limit it was last spent under, to tell when it is full again.
    per_second: f64,
    ceiling: f64,
}

impl LocalBucket {
    /// What a bucket `self` (or a new, full one) holds at `now` under a limit of `per_second`
    /// up to `ceiling`.
    fn level(this: Option<&LocalBucket>, per_second: f64, ceiling: f64, now: DateTime<Utc>) -> f64 {
        match this {
            None => ceiling,
            Some(bucket) => {
                let elapsed =
                    (now - bucket.at).num_microseconds().map_or(f64::INFINITY, |us| us as f64 / 1e6);
                ceiling.min(bucket.level + elapsed.max(0.0) * per_second)
            }
        }
    }

    /// Whether the bucket has refilled to full by `now`, under the limit it was last spent
    /// under: it is then exactly what a new bucket would be, and may be forgotten.
    fn full_at(&self, now: DateTime<Utc>) -> bool {
        LocalBucket::level(Some(self), self.per_second, self.ceiling, now) >= self.ceiling
    }
}

/// The buckets that decide while the store cannot: kept apart from what the pre-check
/// forgets, and forgotten only once full (see the module documentation).
#[derive(Debug)]
pub(super) struct Fallback {
    buckets: Mutex<HashMap<BucketId, LocalBucket>>,
    pub(super) capacity: usize,
}

/// The fallback remembers its capacity of buckets that are not full yet.
#[derive(Debug)]
pub(super) struct FallbackFull;

/// One spend the fallback decides: its position in the take, its bucket, cost, rate and
/// ceiling.
pub(super) type FallbackSpend = (Which, BucketId, f64, f64, f64);

/// What the fallback decided.
pub(super) enum FallbackDecision {
    /// Every bucket covered its cost; what each holds now.
    Granted(smallvec::SmallVec<[(Which, f64); 2]>),
    /// The first bucket that could not, and what it holds.
    Refused { which: Which, level: f64 },
}

impl Fallback {
    pub(super) fn new(capacity: u64) -> Fallback {
        Fallback {
            buckets: Mutex::new(HashMap::new()),
            capacity: usize::try_from(capacity).unwrap_or(usize::MAX),
        }
    }

    /// Decides `spends` at `now`, all-or-nothing, as the store would: each takes its cost from
    /// its bucket, which refills at its rate up to its ceiling.
    pub(super) fn spend(
        &self,
        spends: &[FallbackSpend],
        now: DateTime<Utc>,
    ) -> Result<FallbackDecision, FallbackFull> {
        let mut buckets = lock(&self.buckets);
        let new = spends.iter().filter(|(_, id, ..)| !buckets.contains_key(id)).count();
        if new > 0 && buckets.len() + new > self.capacity {
            // Full buckets are what a new bucket would be: forgetting them changes nothing.
            buckets.retain(|_, bucket| !bucket.full_at(now));
            if buckets.len() + new > self.capacity {
                return Err(FallbackFull);
            }
        }
        for (which, id, cost, per_second, ceiling) in spends {
            let level = LocalBucket::level(buckets.get(id), *per_second, *ceiling, now);
            if level < *cost {
                return Ok(FallbackDecision::Refused { which: *which, level });
            }
        }
        let mut left = smallvec::SmallVec::new();
        for (which, id, cost, per_second, ceiling) in spends {
            let level = LocalBucket::level(buckets.get(id), *per_second, *ceiling, now) - cost;
            // Never moves the instant back: a clock behind refills nothing, as in the store.
            let at = buckets.get(id).map_or(now, |bucket| bucket.at.max(now));
            buckets.insert(*id, LocalBucket { level, at, per_second: *per_second, ceiling: *ceiling });
            left.push((*which, level));
        }
        Ok(FallbackDecision::Granted(left))
    }

    pub(super) fn len(&self) -> usize {
        lock(&self.buckets).len()
    }

    /// Charges `cost` to the bucket `id` at `now` whatever it holds, as the store's charge
    /// does (docs/adr/0040): its level may go below 0, a debt its refill repays before it
    /// covers anything again. Returns the level it is left at.
    pub(super) fn charge(
        &self,
        id: BucketId,
        cost: f64,
        per_second: f64,
        ceiling: f64,
        now: DateTime<Utc>,
    ) -> Result<f64, FallbackFull> {
        let mut buckets = lock(&self.buckets);
        if !buckets.contains_key(&id) && buckets.len() >= self.capacity {
            buckets.retain(|_, bucket| !bucket.full_at(now));
            if buckets.len() >= self.capacity {
                return Err(FallbackFull);
            }
        }
        let level = LocalBucket::level(buckets.get(&id), per_second, ceiling, now) - cost;
        let at = buckets.get(&id).map_or(now, |bucket| bucket.at.max(now));
        buckets.insert(id, LocalBucket { level, at, per_second, ceiling });
        Ok(level)
    }

    /// What the bucket `id` holds at `now` (below 0 in debt; a bucket it does not remember is
    /// full), without spending.
    pub(super) fn level(&self, id: BucketId, per_second: f64, ceiling: f64, now: DateTime<Utc>) -> f64 {
        LocalBucket::level(lock(&self.buckets).get(&id), per_second, ceiling, now)
    }
}

impl Guarded {
    /// The fallback's buckets for this take, each with its cost, rate and ceiling.
    pub(super) fn fallback_spends(&self) -> smallvec::SmallVec<[FallbackSpend; 2]> {
        match self {
            Guarded::Buckets(entries) => entries
                .iter()
                .map(|(which, spend, _)| {
                    let id = BucketId::Budget(spend.name, spend.key);
                    (*which, id, spend.cost, spend.limit.per_second(), spend.limit.burst())
                })
                .collect(),
            Guarded::Named { spend, gcra, .. } => smallvec::smallvec![(
                Which::First,
                BucketId::Named(spend.limiter, spend.key),
                f64::from(spend.cells),
                spend.limit.per_second(),
                f64::from(gcra.burst),
            )],
        }
    }

    /// The decision the fallback's answer is, in this take's terms. It is not the store's
    /// row: nothing the pre-check may learn from.
    pub(super) fn fallback_decision(&self, decided: FallbackDecision, now: DateTime<Utc>) -> Decision {
        match (self, decided) {
            (Guarded::Buckets(entries), FallbackDecision::Refused { which, level }) => {
                let (_, spend, _) = entries
                    .iter()
                    .find(|(position, ..)| *position == which)
                    .expect("the fallback refuses one of the spends it was given");
                let fill = Fill { tokens: level, refilled_at: now };
                let retry_after = spend.limit.time_to_cover(fill, spend.cost, now);
                Decision::Refused(Refusal { which, retry_after, judged: None, tat: None })
            }
            (Guarded::Buckets(_), FallbackDecision::Granted(left)) => Decision::Granted(Grant::of(
                left.into_iter().map(|(which, tokens)| (which, Fill { tokens, refilled_at: now })),
            )),
            (Guarded::Named { spend, .. }, FallbackDecision::Refused { level, .. }) => {
                let (rate, cost) = (spend.limit.per_second(), f64::from(spend.cells));
                let now_us = named::micros(now);
                let wait = ((cost - level) / rate * 1e6).ceil() as i64;
                let retry_after = named::until(now_us, now_us + wait);
                Decision::Refused(Refusal { which: Which::First, retry_after, judged: None, tat: None })
            }
            (Guarded::Named { .. }, FallbackDecision::Granted(left)) => {
                Decision::Granted(Grant { named: Some((now, left[0].1.floor() as u32)), ..Grant::FREE })
            }
        }
    }
}
