//! The layer in front of a shared store that keeps floods cheap and outages survivable.
//!
//! A [`Guard`] is a [`Decider`] wrapping another (the [`Store`](crate::Store)), per replica.
//! It adds, in the order a take meets them:
//!
//! 1. **The pre-check.** Per bucket it keeps the bucket's row as the store last described it
//!    (what a grant left, or what a refusal judged; for a named limiter, the key's TAT). A
//!    take that row cannot cover yet is refused here, without a statement, with the exact
//!    wait.
//! 2. **The store**, asked with a deadline (the decision timeout), behind a circuit: after a
//!    few failures in a row, takes that do not fail closed do not ask it at all (they decide
//!    by their fail mode at once) while it is probed twice a second, until a probe or any
//!    other take finds it answering. Takes that fail closed keep asking: skipping the store
//!    would only turn their wait into a 500.
//! 3. **The fail mode** each take carries ([`Spend::enforcement`], set per take by whoever
//!    sized it, so a changed rule applies at once) when the store cannot answer or is not
//!    asked: [`FailMode::Closed`] (the take is [`Undecided`], an HTTP 500),
//!    [`FailMode::Static`] (an in-memory bucket of the same limit decides, per replica) or
//!    [`FailMode::Open`] (admitted, nothing debited); the latter two log a warning at most
//!    once a minute per scope. A pair fails by the stricter of its two modes.
//!
//! # Which takes the pre-check refuses that the store would admit
//!
//! None, with one bounded exception. It refuses when `limit.level(row, now) < cost`, the
//! store's own arithmetic ([`Limit::level`](crate::Limit::level)) on a row the store wrote or read. Every later
//! version of that row was written by a take, and a take only lowers a bucket: whatever it
//! spent is gone, and refill is a deterministic function of the instant. So the row the store
//! would judge holds at most what the known one does, and the store refuses too. A reset is
//! the one thing that adds tokens, and it tells every replica to forget the bucket (see
//! [`Store::reset`](crate::Store::reset) and [`follow_resets`]).
//!
//! It counts nothing in flight. An earlier version also kept the reference's local bucket of
//! twice the burst, debited when a take was sent and refunded when the store did not debit;
//! but a take in flight may be refused, or decided after a later one, so counting it refused
//! what the store would admit (burst 10, two takes of 10 in flight, a take of 1 refused while
//! the store, deciding it first, grants it), and a take whose caller stopped waiting was never
//! refunded. What a flood costs the store is one round trip per replica before the first
//! answer, and refusals the snapshot foresees write nothing there either (docs/adr/0030).
//!
//! The exception is clock skew between replicas. A take writes the row as refilled up to its
//! caller's instant. If a replica whose clock runs ahead of this one spends `c` from the
//! bucket after this one learned the row, the new row holds, at this replica's earlier
//! instant, the refill up to the other's later one, less `c`; when the skew exceeds
//! `c / rate` that is more than the learned row implies, and the pre-check refuses what the
//! store would admit. It only ever under-admits, by at most the skew's worth of refill, and
//! skew is bounded by the clock discipline (docs/adr). Two replicas deciding one bucket with
//! different limits (one has heard of a changed rule, the other not yet) are the same
//! exception in another form; it lasts until the other hears, and a replica that hears of a
//! budget that may have grown forgets what it knew of that budget's buckets
//! ([`Guard::forget_scope`], [`Guard::forget`]). (Costs below the float spacing of a
//! bucket's level, about 1e-15 of its burst, are not meaningful and not covered.)
//! `tests/it/guard.rs` checks all of this against the store with random workloads.
//!
//! # The fallback outlives what the pre-check forgets
//!
//! The fallback's buckets are kept apart from the pre-check's rows. A reset, a rule that may
//! have grown, a reconnected listener or the pre-check's own eviction forget what the store
//! said, which is always safe; forgetting a fallback bucket that is not full would hand its
//! key another burst on this replica in the middle of an outage. So a fallback bucket is
//! forgotten only once it has refilled to full (when it is exactly what a new one would be),
//! and when the fallback already remembers its capacity of buckets that are not full, a take
//! of another bucket is not decided (the store's failure, an HTTP 500) rather than decided
//! from a bucket it cannot remember. Each replica admits at most one whole budget of a key on
//! its own over an outage, however long.
//!
//! # Cancellation
//!
//! A caller may stop waiting at any await (its deadline, its client hanging up, a tower
//! timeout): the future is dropped there. Nothing this guard changes is left half-done by
//! that. The pre-check only learns after an answer (a take dropped before it learns nothing,
//! which only means the next take asks the store). A probe of the open circuit marks the
//! circuit as probing while it waits; the mark is a drop guard, so a probe dropped before its
//! answer frees the circuit for the next take to probe at once, and the circuit always goes
//! back to the store once it answers. The fallback and the circuit's counters change only
//! under a lock, never across an await. (ARCHITECTURE.md, "Deadlines", says what the store
//! does with a take whose caller left.)

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use crate::named::{self, Gcra};
use crate::{
    Decider, Decision, FailMode, Fill, Grant, Key, Name, NamedKey, NamedSpend, Refusal, Spend, Take,
    Undecided, Which,
};

/// What a [`Guard`] is told at build time ([`GuardBuilder`]).
#[derive(Clone, Debug)]
struct GuardConfig {
    /// The longest a take waits for the store before it counts as not answered.
    decision_timeout: Duration,
    /// The most buckets the pre-check remembers (the least recently useful are forgotten
    /// first, which is always safe: a forgotten bucket is simply asked about), and the most
    /// the fallback remembers that have not refilled to full.
    capacity: u64,
    /// The clock takes are decided at, when it must be trusted for any take to be decided.
    clock: Option<crate::ClockStatus>,
}

/// Builds a [`Guard`]: [`Guard::builder`], then what differs from the defaults.
pub struct GuardBuilder {
    inner: Arc<dyn Decider>,
    config: GuardConfig,
    observer: Arc<dyn Observer>,
}

impl GuardBuilder {
    /// A builder for a guard in front of a decider already shared.
    pub fn shared(inner: Arc<dyn Decider>) -> GuardBuilder {
        GuardBuilder {
            inner,
            config: GuardConfig {
                decision_timeout: GuardBuilder::DEFAULT_DECISION_TIMEOUT,
                capacity: GuardBuilder::DEFAULT_CAPACITY,
                clock: None,
            },
            observer: Arc::new(Unobserved),
        }
    }

    /// The reference's decision timeout: 250 ms.
    pub const DEFAULT_DECISION_TIMEOUT: Duration = Duration::from_millis(250);
    /// A hundred thousand buckets, a few tens of megabytes at most.
    pub const DEFAULT_CAPACITY: u64 = 100_000;

    /// The longest a take waits for the store before it counts as not answered and its fail
    /// mode decides ([`GuardBuilder::DEFAULT_DECISION_TIMEOUT`] unless told). Keep it below the
    /// deadline a caller gives a whole request, or the caller gives up first and the fail mode
    /// never decides.
    pub fn decision_timeout(mut self, timeout: Duration) -> GuardBuilder {
        self.config.decision_timeout = timeout;
        self
    }

    /// The most buckets the pre-check remembers, and the most buckets not yet full the
    /// fallback remembers ([`GuardBuilder::DEFAULT_CAPACITY`] unless told).
    pub fn capacity(mut self, buckets: u64) -> GuardBuilder {
        self.config.capacity = buckets;
        self
    }

    /// Decides nothing while `clock` cannot be trusted (a [`DatabaseClock`](crate::DatabaseClock)'s
    /// status, whose `now` takes are decided at): every take is then
    /// [`Undecided::Declined`], and its observer hears so. Nothing at all is the only safe
    /// decision then: neither the store nor a fallback may decide on a wrong instant.
    pub fn trusted_only(mut self, clock: crate::ClockStatus) -> GuardBuilder {
        self.config.clock = Some(clock);
        self
    }

    /// Told about every decision ([`Unobserved`] unless told): for metrics and headers.
    pub fn observer(mut self, observer: Arc<dyn Observer>) -> GuardBuilder {
        self.observer = observer;
        self
    }

    /// The guard.
    pub fn build(self) -> Guard {
        let known = quick_cache::sync::Cache::new(self.config.capacity as usize);
        let fallback = Fallback::new(self.config.capacity);
        Guard {
            inner: self.inner,
            config: self.config,
            observer: self.observer,
            known,
            fallback,
            circuit: Mutex::new(Circuit::Closed { failures: 0 }),
            warned: Mutex::new(HashMap::new()),
        }
    }
}

/// Where a decision came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The shared store.
    Store,
    /// This replica's pre-check, without a statement.
    Precheck,
    /// This replica's in-memory fallback, because the store could not answer and the take
    /// fails [`FailMode::Static`].
    Fallback,
    /// Nothing: the store could not answer and the take fails [`FailMode::Open`], so it was
    /// admitted without a decision and nothing was debited.
    Open,
}

/// Told about every decision a [`Guard`] makes, for metrics and response headers.
///
/// Called on the deciding caller's task, synchronously: keep it cheap.
pub trait Observer: Send + Sync + fmt::Debug {
    /// `take`, asked at `now`, was decided (`Ok`) by `source`, or not decided (`Err`), after
    /// `elapsed`.
    fn decided(
        &self,
        take: &Take,
        now: DateTime<Utc>,
        outcome: Result<(&Decision, Source), &Undecided>,
        elapsed: Duration,
    );

    /// The caller stopped waiting for `take` (its own deadline passed, or its request went
    /// away) after `elapsed`, before an answer: it was not decided as far as it knows.
    fn abandoned(&self, take: &Take, elapsed: Duration);

    /// The store started (`true`) or stopped (`false`) being treated as failing; scopes that
    /// fail locally now decide from their fallback (or from the store again).
    fn store_failing(&self, failing: bool);
}

/// An [`Observer`] that ignores everything.
#[derive(Debug, Default, Clone, Copy)]
pub struct Unobserved;

impl Observer for Unobserved {
    fn decided(&self, _: &Take, _: DateTime<Utc>, _: Result<(&Decision, Source), &Undecided>, _: Duration) {}
    fn abandoned(&self, _: &Take, _: Duration) {}
    fn store_failing(&self, _: bool) {}
}

/// Which bucket an entry is about: a token bucket of a budget, or a key of a named limiter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum BucketId {
    Budget(Name, Key),
    Named(Name, NamedKey),
}

impl BucketId {
    /// The budget or limiter the bucket belongs to.
    fn name(self) -> Name {
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
struct Known {
    /// The row as the store last described it.
    fill: Option<Fill>,
    /// For a named limiter: the key's TAT (µs) as the store last described it.
    tat: Option<i64>,
}

/// A take's spends with their pre-check entries: at most two, kept inline since this runs for
/// every take.
type Entries = smallvec::SmallVec<[(Which, Spend, Arc<Mutex<Known>>); 2]>;

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
struct Fallback {
    buckets: Mutex<HashMap<BucketId, LocalBucket>>,
    capacity: usize,
}

/// The fallback remembers its capacity of buckets that are not full yet.
#[derive(Debug)]
struct FallbackFull;

/// One spend the fallback decides: its position in the take, its bucket, cost, rate and
/// ceiling.
type FallbackSpend = (Which, BucketId, f64, f64, f64);

/// What the fallback decided.
enum FallbackDecision {
    /// Every bucket covered its cost; what each holds now.
    Granted(smallvec::SmallVec<[(Which, f64); 2]>),
    /// The first bucket that could not, and what it holds.
    Refused { which: Which, level: f64 },
}

impl Fallback {
    fn new(capacity: u64) -> Fallback {
        Fallback {
            buckets: Mutex::new(HashMap::new()),
            capacity: usize::try_from(capacity).unwrap_or(usize::MAX),
        }
    }

    /// Decides `spends` at `now`, all-or-nothing, as the store would: each takes its cost from
    /// its bucket, which refills at its rate up to its ceiling.
    fn spend(&self, spends: &[FallbackSpend], now: DateTime<Utc>) -> Result<FallbackDecision, FallbackFull> {
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

    fn len(&self) -> usize {
        lock(&self.buckets).len()
    }
}

/// The circuit in front of the store.
#[derive(Debug)]
enum Circuit {
    /// The store answers; `failures` in a row so far.
    Closed { failures: u32 },
    /// The store is failing: it is not asked, but probed (one take at a time) from `next_probe`.
    Open { next_probe: Instant, probing: bool },
}

/// Failures in a row that open the circuit: one slow statement is not an outage, three are.
const FAILURES_TO_OPEN: u32 = 3;
/// How often an open circuit lets one take through to the store to see whether it answers.
const PROBE_INTERVAL: Duration = Duration::from_millis(500);
/// The most often a scope deciding from its fallback says so in the log.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// Whether to ask the store.
enum Ask {
    Yes { probe: bool },
    No,
}

/// The pre-check, fallback and circuit in front of a shared store. Cheap to share (`Arc`).
pub struct Guard {
    inner: Arc<dyn Decider>,
    config: GuardConfig,
    observer: Arc<dyn Observer>,
    known: quick_cache::sync::Cache<BucketId, Arc<Mutex<Known>>>,
    fallback: Fallback,
    circuit: Mutex<Circuit>,
    /// When a budget (or limiter) deciding without the store last said so, per fail mode.
    warned: Mutex<HashMap<(Name, FailMode), Instant>>,
}

impl fmt::Debug for Guard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guard")
            .field("inner", &self.inner)
            .field("config", &self.config)
            .field("known", &self.known.len())
            .field("fallback", &self.fallback.len())
            .finish_non_exhaustive()
    }
}

impl Guard {
    /// A guard in front of `inner` (a [`Store`](crate::Store), or any [`Decider`]), with the
    /// defaults: a decision timeout of 250 ms, 100,000 buckets remembered, no observer.
    pub fn builder(inner: impl Decider + 'static) -> GuardBuilder {
        GuardBuilder::shared(Arc::new(inner))
    }

    /// Forgets what the store said of `key`'s bucket of the budget `name` (a [`Scope`] or a
    /// [`Name`]): after a reset, which adds tokens, or when its budget may have grown. The key
    /// of the named limiter of the same name is forgotten too, whichever algorithm governs it
    /// now. The fallback's bucket is kept (see the module documentation).
    ///
    /// [`Scope`]: crate::Scope
    pub fn forget(&self, name: impl Into<Name>, key: Key) {
        let name = name.into();
        self.known.remove(&BucketId::Budget(name, key));
        self.known.remove(&BucketId::Named(name, NamedKey::of(name, &key.0)));
    }

    /// Forgets one key of a named limiter: after a reset.
    pub fn forget_named(&self, limiter: Name, key: NamedKey) {
        self.known.remove(&BucketId::Named(limiter, key));
    }

    /// Forgets every bucket of the budget `name`, and every key of the named limiter of the
    /// same name: after its limit may have grown.
    pub fn forget_every_bucket_of(&self, name: impl Into<Name>) {
        let name = name.into();
        self.known.retain(|id, _| id.name() != name);
    }

    /// Forgets the bucket a reset announced on [`RESET_CHANNEL`](crate::RESET_CHANNEL) names
    /// (its payload): for a caller that LISTENs on its own connection; [`follow_resets`] is
    /// one that does.
    pub fn hear_reset(&self, payload: &str) {
        match parse_reset(payload) {
            Some(Reset::Budget(name, key)) => self.forget(name, key),
            Some(Reset::Named(limiter, key)) => self.forget_named(limiter, key),
            // Not from this crate's statements: forgetting everything is always safe.
            None => {
                tracing::warn!(payload, "a malformed reset notification; forgetting every bucket");
                self.forget_all();
            }
        }
    }

    /// Forgets everything the store said: when resets may have been missed (the listener
    /// reconnected). The fallback's buckets are kept.
    pub fn forget_all(&self) {
        self.known.clear();
    }

    fn entry(&self, id: BucketId) -> Arc<Mutex<Known>> {
        let entry = self.known.get_or_insert_with(&id, || {
            Ok::<_, std::convert::Infallible>(Arc::new(Mutex::new(Known::default())))
        });
        let Ok(entry) = entry;
        entry
    }

    /// The refusal the pre-check already knows for `spend` at `now`, without asking the store
    /// or spending anything: for a caller that must not do costly work (a credential lookup,
    /// say) on behalf of a key whose budget is known to be spent. `None` means "not known to
    /// be refused", not "granted".
    pub fn known_refusal(&self, spend: NamedSpend, now: DateTime<Utc>) -> Option<Refusal> {
        let gcra = Gcra::of(spend.limit)?;
        let entry = self.known.get(&BucketId::Named(spend.limiter, spend.key))?;
        let tat = lock(&entry).tat?;
        let (now_us, earliest) = (named::micros(now), gcra.earliest(tat, spend.cells));
        (now_us < earliest).then(|| Refusal {
            which: Which::First,
            retry_after: named::until(now_us, earliest),
            judged: None,
            tat: Some(named::instant(tat)),
        })
    }

    /// How many buckets this replica remembers: the pre-check's (at most the configured
    /// capacity) and the fallback's that are not known to be full (at most the capacity too).
    pub fn remembered_buckets(&self) -> u64 {
        (self.known.len() + self.fallback.len()) as u64
    }

    /// Whether the store is treated as failing right now (its circuit is open).
    pub fn store_failing(&self) -> bool {
        matches!(*lock(&self.circuit), Circuit::Open { .. })
    }

    async fn decide_guarded(&self, take: Take, now: DateTime<Utc>) -> Result<(Decision, Source), Undecided> {
        if let Some(Err(untrusted)) = self.config.clock.as_ref().map(crate::ClockStatus::check) {
            return Err(Undecided::Declined(Box::new(untrusted)));
        }
        let sent = match take {
            Take::Named(spend) => return self.decide_named(spend, now).await,
            take => match Sent::of(take).map_err(Undecided::Store)? {
                // Free, never fits, or a bucket named twice with two limits: the store answers
                // without a query.
                Sent::Answered => return Ok((self.inner.decide(take, now).await?, Source::Store)),
                Sent::Spends(spends) => spends,
            },
        };
        let entries: Entries = sent
            .iter()
            .map(|(which, spend)| (*which, *spend, self.entry(BucketId::Budget(spend.name, spend.key))))
            .collect();

        if let Some(refusal) = precheck(&entries, now) {
            return Ok((Decision::Refused(refusal), Source::Precheck));
        }

        // A take spending two budgets fails by the stricter of their modes.
        let fail_mode = entries
            .iter()
            .map(|(_, spend, _)| spend.enforcement.fail_mode)
            .reduce(FailMode::stricter)
            .unwrap_or(FailMode::Closed);
        let undecided = match self.ask_store(take, now, fail_mode != FailMode::Closed).await {
            Some(Ok(decision)) => {
                learn(&entries, &decision);
                return Ok((decision, Source::Store));
            }
            Some(Err(undecided)) if !undecided.is_store_failure() => return Err(undecided),
            Some(Err(undecided)) => undecided,
            None => Undecided::StoreFailing,
        };
        let classes: smallvec::SmallVec<[Name; 2]> = entries.iter().map(|(_, spend, _)| spend.name).collect();
        match fail_mode {
            FailMode::Closed => Err(undecided),
            FailMode::Open => {
                self.warn_fallback(&classes, fail_mode, &undecided);
                Ok((Decision::Granted(Grant::FREE), Source::Open))
            }
            FailMode::Static => {
                self.warn_fallback(&classes, fail_mode, &undecided);
                let spends: smallvec::SmallVec<[_; 2]> = entries
                    .iter()
                    .map(|(which, spend, _)| {
                        let id = BucketId::Budget(spend.name, spend.key);
                        (*which, id, spend.cost, spend.limit.per_second(), spend.limit.burst())
                    })
                    .collect();
                let decision = match self.fallback.spend(&spends, now) {
                    Err(FallbackFull) => return Err(self.fallback_full(undecided)),
                    Ok(FallbackDecision::Refused { which, level }) => {
                        let (_, spend, _) = entries
                            .iter()
                            .find(|(position, ..)| *position == which)
                            .expect("the fallback refuses one of the spends it was given");
                        let fill = Fill { tokens: level, refilled_at: now };
                        let retry_after = spend.limit.time_to_cover(fill, spend.cost, now);
                        // Not the store's row: nothing the pre-check may learn from.
                        Decision::Refused(Refusal { which, retry_after, judged: None, tat: None })
                    }
                    Ok(FallbackDecision::Granted(left)) => {
                        let mut grant = Grant::FREE;
                        for (which, tokens) in left {
                            let fill = Some(Fill { tokens, refilled_at: now });
                            match which {
                                Which::First => grant.first = fill,
                                Which::Second => grant.second = fill,
                            }
                        }
                        Decision::Granted(grant)
                    }
                };
                Ok((decision, Source::Fallback))
            }
        }
    }

    /// A named limiter's take: the same pre-check, store, circuit and fail mode, in GCRA's
    /// terms. The pre-check refuses when the TAT the store last gave makes the cells not
    /// conform yet: concurrent requests only push a TAT later, so the store would too.
    async fn decide_named(
        &self,
        spend: NamedSpend,
        now: DateTime<Utc>,
    ) -> Result<(Decision, Source), Undecided> {
        let Some(gcra) = Gcra::of(spend.limit).filter(|gcra| (1..=gcra.burst).contains(&spend.cells)) else {
            // Free, never fits, or an unusable limit: the store answers without a query.
            return Ok((self.inner.decide(Take::Named(spend), now).await?, Source::Store));
        };
        let id = BucketId::Named(spend.limiter, spend.key);
        let entry = self.entry(id);
        let now_us = named::micros(now);
        if let Some(tat) = lock(&entry).tat {
            let earliest = gcra.earliest(tat, spend.cells);
            if now_us < earliest {
                let retry_after = named::until(now_us, earliest);
                let refusal = Refusal {
                    which: Which::First,
                    retry_after,
                    judged: None,
                    tat: Some(named::instant(tat)),
                };
                return Ok((Decision::Refused(refusal), Source::Precheck));
            }
        }
        let fail_mode = spend.enforcement.fail_mode;
        let undecided = match self.ask_store(Take::Named(spend), now, fail_mode != FailMode::Closed).await {
            Some(Ok(decision)) => {
                let tat = match &decision {
                    Decision::Granted(grant) => grant.named.map(|(tat, _)| tat),
                    Decision::Refused(refusal) => refusal.tat,
                    Decision::InsufficientCapacity(_) => None,
                };
                if let Some(tat) = tat {
                    lock(&entry).tat = Some(named::micros(tat));
                }
                return Ok((decision, Source::Store));
            }
            Some(Err(undecided)) if !undecided.is_store_failure() => return Err(undecided),
            Some(Err(undecided)) => undecided,
            None => Undecided::StoreFailing,
        };
        let class = spend.limiter;
        match fail_mode {
            FailMode::Closed => return Err(undecided),
            FailMode::Open => {
                self.warn_fallback(&[class], fail_mode, &undecided);
                return Ok((Decision::Granted(Grant::FREE), Source::Open));
            }
            FailMode::Static => self.warn_fallback(&[class], fail_mode, &undecided),
        }
        // The fallback is a token bucket of the same rate and burst: this replica's own
        // approximation of the shared GCRA while the store cannot answer.
        let (rate, cost) = (spend.limit.per_second(), f64::from(spend.cells));
        let decision =
            match self.fallback.spend(&[(Which::First, id, cost, rate, f64::from(gcra.burst))], now) {
                Err(FallbackFull) => return Err(self.fallback_full(undecided)),
                Ok(FallbackDecision::Granted(left)) => Decision::Granted(Grant {
                    first: None,
                    second: None,
                    named: Some((now, left[0].1.floor() as u32)),
                }),
                Ok(FallbackDecision::Refused { level, .. }) => {
                    let wait = ((cost - level) / rate * 1e6).ceil() as i64;
                    let retry_after = named::until(now_us, now_us + wait);
                    Decision::Refused(Refusal { which: Which::First, retry_after, judged: None, tat: None })
                }
            };
        Ok((decision, Source::Fallback))
    }

    /// The fallback cannot remember another bucket: the take is not decided, as if it failed
    /// closed, rather than decided from a bucket that would start full again.
    fn fallback_full(&self, undecided: Undecided) -> Undecided {
        tracing::warn!(
            capacity = self.fallback.capacity,
            "the fallback remembers as many buckets as it may, none of them full yet: a take of another bucket is not decided until the store answers"
        );
        undecided
    }

    /// Asks the store, with the decision timeout, unless the circuit is open and the take
    /// `may_skip` the store (every scope it spends decides locally): then `None`, at once.
    ///
    /// A take that fails closed always asks: skipping would only turn a wait into a 500, and
    /// it may be the one that finds the store answering again.
    async fn ask_store(
        &self,
        take: Take,
        now: DateTime<Utc>,
        may_skip: bool,
    ) -> Option<Result<Decision, Undecided>> {
        let probe = match self.ask(may_skip) {
            Ask::No => return None,
            Ask::Yes { probe } => probe,
        };
        // Dropped before the answer (the caller stopped waiting), a probe frees the circuit
        // for the next take to probe; see the module documentation on cancellation.
        let mut asking = Asking { guard: self, probe, answered: false };
        let answer = tokio::time::timeout(self.config.decision_timeout, self.inner.decide(take, now)).await;
        asking.answered = true;
        let answer = answer.unwrap_or(Err(Undecided::TimedOut(self.config.decision_timeout)));
        match &answer {
            Ok(_) => self.store_answered(),
            Err(undecided) if undecided.is_store_failure() => self.store_failed(probe),
            // Bad input never reached the store: it says nothing of whether it answers.
            Err(_) if probe => self.probe_inconclusive(),
            Err(_) => {}
        }
        Some(answer)
    }

    fn ask(&self, may_skip: bool) -> Ask {
        let mut circuit = lock(&self.circuit);
        match &mut *circuit {
            Circuit::Closed { .. } => Ask::Yes { probe: false },
            Circuit::Open { next_probe, probing } if !*probing && Instant::now() >= *next_probe => {
                *probing = true;
                Ask::Yes { probe: true }
            }
            Circuit::Open { .. } if !may_skip => Ask::Yes { probe: false },
            Circuit::Open { .. } => Ask::No,
        }
    }

    fn store_answered(&self) {
        let was_open = {
            let mut circuit = lock(&self.circuit);
            let was_open = matches!(*circuit, Circuit::Open { .. });
            *circuit = Circuit::Closed { failures: 0 };
            was_open
        };
        if was_open {
            tracing::info!("the rate-budget store answers again; deciding from it");
            self.observer.store_failing(false);
        }
    }

    fn store_failed(&self, probe: bool) {
        let opened = {
            let mut circuit = lock(&self.circuit);
            match &mut *circuit {
                Circuit::Closed { failures } => {
                    *failures += 1;
                    let open = *failures >= FAILURES_TO_OPEN;
                    if open {
                        *circuit =
                            Circuit::Open { next_probe: Instant::now() + PROBE_INTERVAL, probing: false };
                    }
                    open
                }
                Circuit::Open { next_probe, probing } => {
                    if probe {
                        *next_probe = Instant::now() + PROBE_INTERVAL;
                        *probing = false;
                    }
                    false
                }
            }
        };
        if opened {
            tracing::warn!(
                "the rate-budget store keeps failing; not asking it, probing every {PROBE_INTERVAL:?}"
            );
            self.observer.store_failing(true);
        }
    }

    /// A probe ended without saying whether the store answers (its caller stopped waiting, or
    /// its take was bad input): the next take may probe, at once.
    fn probe_inconclusive(&self) {
        if let Circuit::Open { probing, .. } = &mut *lock(&self.circuit) {
            *probing = false;
        }
    }

    /// Says, at most once a minute per scope (or limiter) and fail mode, that takes are being
    /// decided without the store.
    fn warn_fallback(&self, classes: &[Name], fail_mode: FailMode, undecided: &Undecided) {
        let now = Instant::now();
        let mut warned = lock(&self.warned);
        for class in classes {
            let due =
                warned.get(&(*class, fail_mode)).is_none_or(|last| now.duration_since(*last) >= WARN_EVERY);
            if !due {
                continue;
            }
            warned.insert((*class, fail_mode), now);
            if fail_mode == FailMode::Open {
                tracing::warn!(scope = %class, cause = %undecided, "admitting without a decision (fail mode open): the shared store cannot answer (said at most once a minute)");
            } else {
                tracing::warn!(scope = %class, cause = %undecided, "deciding from this replica's fallback bucket: the shared store cannot answer (said at most once a minute)");
            }
        }
    }
}

/// A question to the store in progress; see [`Guard::ask_store`].
struct Asking<'a> {
    guard: &'a Guard,
    probe: bool,
    answered: bool,
}

impl Drop for Asking<'_> {
    fn drop(&mut self) {
        if self.probe && !self.answered {
            self.guard.probe_inconclusive();
        }
    }
}

/// What a bucket take comes to before the store, as the store reduces it (`Store::decide`):
/// answered without a query, or the spends sent, each with the position its answers name.
enum Sent {
    Answered,
    Spends(smallvec::SmallVec<[(Which, Spend); 2]>),
}

impl Sent {
    /// A zero cost is not sent (a pair with one free side is a single take of its other), a
    /// cost above its burst is never sent, and a pair naming one bucket twice is one take of
    /// both costs under the stricter of their enforcements: the same reductions the store
    /// makes, so that whatever the store is asked goes through the pre-check, the decision
    /// timeout, the circuit and the fail mode.
    fn of(take: Take) -> Result<Sent, crate::Error> {
        for (_, spend) in take.spends() {
            spend.validate()?;
        }
        if take.spends().any(|(_, spend)| spend.never_fits()) {
            return Ok(Sent::Answered);
        }
        let spends = match take {
            Take::Pair(first, second) if (first.name, first.key) == (second.name, second.key) => {
                if first.limit != second.limit {
                    return Ok(Sent::Answered);
                }
                let mut enforcement = first.enforcement;
                enforcement.fail_mode = first.enforcement.fail_mode.stricter(second.enforcement.fail_mode);
                let both = Spend { cost: first.cost + second.cost, enforcement, ..first };
                if both.never_fits() || both.is_free() {
                    return Ok(Sent::Answered);
                }
                smallvec::smallvec![(Which::First, both)]
            }
            take => take.spends().filter(|(_, spend)| !spend.is_free()).collect(),
        };
        Ok(if spends.is_empty() { Sent::Answered } else { Sent::Spends(spends) })
    }
}

#[async_trait]
impl Decider for Guard {
    async fn decide(&self, take: Take, now: DateTime<Utc>) -> Result<Decision, Undecided> {
        let mut pending =
            Pending { observer: &*self.observer, take, started: Instant::now(), answered: false };
        let outcome = self.decide_guarded(take, now).await;
        pending.answered = true;
        let elapsed = pending.started.elapsed();
        match &outcome {
            Ok((decision, source)) => self.observer.decided(&take, now, Ok((decision, *source)), elapsed),
            Err(undecided) => self.observer.decided(&take, now, Err(undecided), elapsed),
        }
        outcome.map(|(decision, _)| decision)
    }
}

/// Tells the observer about a take whose caller stopped waiting: dropped before it answered.
struct Pending<'a> {
    observer: &'a dyn Observer,
    take: Take,
    started: Instant,
    answered: bool,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.observer.abandoned(&self.take, self.started.elapsed());
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Every value behind these locks is whole between statements; a panic cannot tear one.
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The refusal the pre-check can give without the store, if any, with its exact wait.
fn precheck(entries: &[(Which, Spend, Arc<Mutex<Known>>)], now: DateTime<Utc>) -> Option<Refusal> {
    entries.iter().find_map(|(which, spend, entry)| {
        let fill = lock(entry).fill?;
        (spend.limit.level(fill, now) < spend.cost).then(|| Refusal {
            which: *which,
            retry_after: spend.limit.time_to_cover(fill, spend.cost, now),
            judged: Some(fill),
            tat: None,
        })
    })
}

/// Remembers what the store said about each bucket.
fn learn(entries: &[(Which, Spend, Arc<Mutex<Known>>)], decision: &Decision) {
    match decision {
        Decision::Granted(grant) => {
            for (which, _, entry) in entries {
                if let Some(fill) = grant.remaining(*which) {
                    lock(entry).fill = Some(fill);
                }
            }
        }
        Decision::Refused(refusal) => {
            if let Some(fill) = refusal.judged {
                if let Some((_, _, entry)) = entries.iter().find(|(which, _, _)| *which == refusal.which) {
                    lock(entry).fill = Some(fill);
                }
            }
        }
        Decision::InsufficientCapacity(_) => {}
    }
}

/// Follows resets from every replica until `shutdown`: each one makes `guard` forget its
/// bucket, so the next take asks the store (which mints it full).
///
/// When the listening connection is lost, notifications sent meanwhile are lost too, so on
/// every reconnect the guard forgets everything, which is always safe.
pub async fn follow_resets(
    pool: sqlx::PgPool,
    guard: Arc<Guard>,
    shutdown: impl std::future::Future<Output = ()> + Send,
) {
    tokio::pin!(shutdown);
    loop {
        let mut listener = loop {
            match listen(&pool).await {
                Ok(listener) => break listener,
                Err(error) => {
                    tracing::warn!(%error, "cannot listen for rate-budget resets; retrying");
                    tokio::select! {
                        () = &mut shutdown => return,
                        () = tokio::time::sleep(Duration::from_secs(1)) => {}
                    }
                }
            }
        };
        // Anything reset while nobody listened is unknown.
        guard.forget_all();
        loop {
            let message = tokio::select! {
                () = &mut shutdown => return,
                message = listener.try_recv() => message,
            };
            match message {
                Ok(Some(notification)) => guard.hear_reset(notification.payload()),
                // The connection was lost; try_recv reconnects on the next call, but what was
                // sent in between is gone.
                Ok(None) => guard.forget_all(),
                Err(error) => {
                    tracing::warn!(%error, "lost the rate-budget reset listener; reconnecting");
                    break;
                }
            }
        }
    }
}

async fn listen(pool: &sqlx::PgPool) -> Result<sqlx::postgres::PgListener, sqlx::Error> {
    let mut listener = sqlx::postgres::PgListener::connect_with(pool).await?;
    listener.listen(crate::store::RESET_CHANNEL).await?;
    Ok(listener)
}

/// What a reset notification names.
enum Reset {
    Budget(Name, Key),
    Named(Name, NamedKey),
}

/// `name:uuid` ([`Store::reset`](crate::Store::reset)) or `named:limiter:hex`
/// ([`Store::reset_named`](crate::Store::reset_named)).
fn parse_reset(payload: &str) -> Option<Reset> {
    if let Some(named) = payload.strip_prefix("named:") {
        let (limiter, hex) = named.split_once(':')?;
        let mut key = [0u8; 32];
        if hex.len() != 64 {
            return None;
        }
        for (i, byte) in key.iter_mut().enumerate() {
            *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        return Some(Reset::Named(Name::new(limiter).ok()?, NamedKey(key)));
    }
    let (name, key) = payload.split_once(':')?;
    Some(Reset::Budget(Name::new(name).ok()?, uuid::Uuid::parse_str(key).ok()?.into()))
}
