//! The layer in front of a shared store that keeps floods cheap and outages survivable.
//!
//! A [`Guard`] is a [`Decider`] wrapping another (the [`Store`](crate::Store)), per replica.
//! It adds, in the order a take meets them:
//!
//! 1. **The pre-check.** Per bucket it keeps (a) the reference's local bucket, twice the
//!    burst at the same rate, debited when a take is sent to the store and refunded when the
//!    store does not debit; and (b) the bucket's row as the store last described it (what a
//!    grant left, or what a refusal judged). A take whose cost (b) cannot cover yet, or that
//!    (a) cannot cover, is refused here, without a statement.
//! 2. **The store**, asked with a deadline (the decision timeout), behind a circuit: after a
//!    few failures in a row, takes that do not fail closed do not ask it at all (they decide
//!    by their fail mode at once) while it is probed twice a second, until a probe or any
//!    other take finds it answering. Takes that fail closed keep asking: skipping the store
//!    would only turn their wait into a 500.
//! 3. **The fail mode** each take carries ([`Spend::enforcement`], set per take by whoever
//!    sized it, so a changed rule applies at once) when the store cannot answer or is not
//!    asked: [`FailMode::Closed`] (the take is [`Undecided`], an HTTP 500),
//!    [`FailMode::Local`] (an in-memory bucket of the same limit decides, per replica) or
//!    [`FailMode::Open`] (admitted, nothing debited); the latter two log a warning at most
//!    once a minute per scope. A pair fails by the stricter of its two modes.
//!
//! # Which takes the pre-check refuses that the store would admit
//!
//! None, with one bounded exception. (b) refuses when `limit.level(row, now) < cost`, the
//! store's own arithmetic ([`Limit::level`]) on a row the store wrote or read. Every later
//! version of that row was written by a take, and a take only lowers a bucket: whatever it
//! spent is gone, and refill is a deterministic function of the instant. So the row the store
//! would judge holds at most what the known one does, and the store refuses too. A reset is
//! the one thing that adds tokens, and it tells every replica to forget the bucket (see
//! [`Store::reset`](crate::Store::reset) and [`follow_resets`]). (a) debits only what the store
//! debits, in the end, and starts at twice the burst, so it always holds at least what the
//! shared bucket does: it refuses only when the shared bucket would too, and in practice only
//! bites when more than twice the burst is in flight at once.
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

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use crate::named::{self, Gcra};
use crate::{
    Decider, Decision, FailMode, Fill, Grant, Key, Limit, LimiterName, NamedKey, NamedSpend, Refusal, Scope,
    Spend, Take, Undecided, Which,
};

/// What a [`Guard`] is told at build time.
#[derive(Clone, Debug)]
pub struct GuardConfig {
    /// The longest a take waits for the store before it counts as not answered.
    pub decision_timeout: Duration,
    /// The most buckets the pre-check and fallback remember; the least recently useful are
    /// forgotten first, which is always safe (a forgotten bucket is simply asked about).
    pub capacity: u64,
}

impl GuardConfig {
    /// The reference's decision timeout: 250 ms.
    pub const DEFAULT_DECISION_TIMEOUT: Duration = Duration::from_millis(250);
    /// A hundred thousand buckets, a few tens of megabytes at most.
    pub const DEFAULT_CAPACITY: u64 = 100_000;
}

/// Where a decision came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The shared store.
    Store,
    /// This replica's pre-check, without a statement.
    Precheck,
    /// This replica's in-memory fallback, because the store could not answer and the take
    /// fails [`FailMode::Local`].
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

/// Which bucket an entry is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum BucketId {
    Budget(Scope, Key),
    Named(LimiterName, NamedKey),
}

/// What a fail mode and a fallback warning are set per: a scope, or a named limiter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Class {
    Scope(Scope),
    Limiter(LimiterName),
}

impl fmt::Display for Class {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Class::Scope(scope) => fmt::Display::fmt(scope, f),
            Class::Limiter(name) => fmt::Display::fmt(name, f),
        }
    }
}

/// A take's spends with their entries.
type Entries = smallvec::SmallVec<[(Which, Spend, Arc<Mutex<Entry>>); 2]>;

/// What this replica remembers about one bucket.
#[derive(Debug)]
struct Entry {
    /// (a): twice the burst, debited on the way to the store.
    local: LocalBucket,
    /// (b): the row as the store last described it.
    known: Option<Fill>,
    /// (b) for a named limiter: the key's TAT (µs) as the store last described it.
    known_tat: Option<i64>,
    /// The bucket that decides when the store cannot, sized like the shared one.
    fallback: LocalBucket,
}

/// An in-memory token bucket: a level as of an instant; `None` until first used (full).
#[derive(Clone, Copy, Debug, Default)]
struct LocalBucket(Option<(f64, DateTime<Utc>)>);

impl LocalBucket {
    fn level(self, per_second: f64, ceiling: f64, now: DateTime<Utc>) -> f64 {
        match self.0 {
            None => ceiling,
            Some((level, at)) => {
                let elapsed = (now - at).num_microseconds().map_or(f64::INFINITY, |us| us as f64 / 1e6);
                ceiling.min(level + elapsed.max(0.0) * per_second)
            }
        }
    }

    /// Sets the level at `now`, never moving the instant back (a clock behind refills
    /// nothing, as in the store).
    fn set(&mut self, level: f64, now: DateTime<Utc>) {
        let at = self.0.map_or(now, |(_, at)| at.max(now));
        self.0 = Some((level, at));
    }
}

/// The pre-check's ceiling for a limit: twice the burst, as the reference's local bucket.
fn precheck_ceiling(limit: Limit) -> f64 {
    2.0 * limit.burst()
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
    entries: quick_cache::sync::Cache<BucketId, Arc<Mutex<Entry>>>,
    circuit: Mutex<Circuit>,
    warned: Mutex<HashMap<(Class, FailMode), Instant>>,
}

impl fmt::Debug for Guard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guard")
            .field("inner", &self.inner)
            .field("config", &self.config)
            .field("entries", &self.entries.len())
            .finish_non_exhaustive()
    }
}

impl Guard {
    /// A guard in front of `inner`, telling `observer` about every decision.
    pub fn new(inner: Arc<dyn Decider>, config: GuardConfig, observer: Arc<dyn Observer>) -> Guard {
        let entries = quick_cache::sync::Cache::new(config.capacity as usize);
        Guard {
            inner,
            config,
            observer,
            entries,
            circuit: Mutex::new(Circuit::Closed { failures: 0 }),
            warned: Mutex::new(HashMap::new()),
        }
    }

    /// Forgets what this replica knows of one bucket: after a reset, which adds tokens, or
    /// when its budget may have grown. The key of the scope's GCRA limiter
    /// ([`LimiterName::of_scope`]) is forgotten too, whichever algorithm governs it now.
    pub fn forget(&self, scope: Scope, key: Key) {
        self.entries.remove(&BucketId::Budget(scope, key));
        let limiter = LimiterName::of_scope(scope);
        self.entries.remove(&BucketId::Named(limiter, NamedKey::of(limiter, &key.0)));
    }

    /// Forgets one key of a named limiter: after a reset.
    pub fn forget_named(&self, limiter: LimiterName, key: NamedKey) {
        self.entries.remove(&BucketId::Named(limiter, key));
    }

    /// Forgets every bucket of a scope, and every key of its GCRA limiter: after its limit
    /// may have grown.
    pub fn forget_scope(&self, scope: Scope) {
        let limiter = LimiterName::of_scope(scope);
        self.entries.retain(|id, _| match id {
            BucketId::Budget(entry_scope, _) => *entry_scope != scope,
            BucketId::Named(name, _) => *name != limiter,
        });
    }

    /// Forgets a key of a limiter known only by its name's text (a reset notification).
    fn forget_named_by_text(&self, limiter: &str, key: NamedKey) {
        self.entries
            .retain(|id, _| !matches!(id, BucketId::Named(name, k) if name.as_str() == limiter && *k == key));
    }

    fn entry(&self, id: BucketId) -> Arc<Mutex<Entry>> {
        let entry = self.entries.get_or_insert_with(&id, || {
            Ok::<_, std::convert::Infallible>(Arc::new(Mutex::new(Entry {
                local: LocalBucket::default(),
                known: None,
                known_tat: None,
                fallback: LocalBucket::default(),
            })))
        });
        let Ok(entry) = entry;
        entry
    }

    /// Forgets everything: when resets may have been missed (the listener reconnected).
    pub fn forget_all(&self) {
        self.entries.clear();
    }

    /// The refusal the pre-check already knows for `spend` at `now`, without asking the store
    /// or spending anything: for a caller that must not do costly work (a credential lookup,
    /// say) on behalf of a key whose budget is known to be spent. `None` means "not known to
    /// be refused", not "granted".
    pub fn known_refusal(&self, spend: NamedSpend, now: DateTime<Utc>) -> Option<Refusal> {
        let gcra = Gcra::of(spend.limit)?;
        let entry = self.entries.get(&BucketId::Named(spend.limiter, spend.key))?;
        let tat = lock(&entry).known_tat?;
        let (now_us, earliest) = (named::micros(now), gcra.earliest(tat, spend.cells));
        (now_us < earliest).then(|| Refusal {
            which: Which::First,
            retry_after: named::until(now_us, earliest),
            judged: None,
            tat: Some(named::instant(tat)),
        })
    }

    /// How many buckets this replica remembers (pre-check and fallback state), at most the
    /// configured capacity.
    pub fn remembered_buckets(&self) -> u64 {
        self.entries.len() as u64
    }

    /// Whether the store is treated as failing right now (its circuit is open).
    pub fn store_failing(&self) -> bool {
        matches!(*lock(&self.circuit), Circuit::Open { .. })
    }

    async fn decide_guarded(&self, take: Take, now: DateTime<Utc>) -> Result<(Decision, Source), Undecided> {
        if let Take::Named(spend) = take {
            return self.decide_named(spend, now).await;
        }
        for (_, spend) in take.spends() {
            spend.validate().map_err(Undecided::Store)?;
        }
        // The store answers these without a query (free, never fits) or as one combined take
        // (one bucket twice); there is nothing for the pre-check to save or the fallback to do.
        let same_bucket = matches!(take, Take::Pair(a, b) if (a.scope, a.key) == (b.scope, b.key));
        if same_bucket || take.spends().any(|(_, spend)| spend.never_fits() || spend.is_free()) {
            return Ok((self.inner.decide(take, now).await?, Source::Store));
        }
        // At most two: kept inline, since this runs for every take.
        let entries: Entries = take
            .spends()
            .map(|(which, spend)| (which, spend, self.entry(BucketId::Budget(spend.scope, spend.key))))
            .collect();

        if let Some(refusal) = precheck(&entries, now) {
            return Ok((Decision::Refused(refusal), Source::Precheck));
        }
        reserve(&entries, now);

        // A take spending two budgets fails by the stricter of their modes.
        let fail_mode = entries
            .iter()
            .map(|(_, spend, _)| spend.enforcement.fail_mode)
            .reduce(FailMode::stricter)
            .unwrap_or(FailMode::Closed);
        let answer = self.ask_store(take, now, fail_mode != FailMode::Closed).await;
        let undecided = match answer {
            Some(Ok(decision)) => {
                learn(&entries, &decision, now);
                return Ok((decision, Source::Store));
            }
            Some(Err(undecided)) if !undecided.is_store_failure() => {
                refund(&entries, now);
                return Err(undecided);
            }
            Some(Err(undecided)) => undecided,
            None => Undecided::StoreFailing,
        };
        refund(&entries, now);
        let classes: smallvec::SmallVec<[Class; 2]> =
            entries.iter().map(|(_, spend, _)| Class::Scope(spend.scope)).collect();
        match fail_mode {
            FailMode::Closed => Err(undecided),
            FailMode::Local => {
                self.warn_fallback(&classes, fail_mode, &undecided);
                Ok((fallback(&entries, now), Source::Fallback))
            }
            FailMode::Open => {
                self.warn_fallback(&classes, fail_mode, &undecided);
                Ok((Decision::Granted(Grant::FREE), Source::Open))
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
        let entry = self.entry(BucketId::Named(spend.limiter, spend.key));
        let now_us = named::micros(now);
        let cost = f64::from(spend.cells);
        let (rate, ceiling) = (spend.limit.per_second(), 2.0 * f64::from(gcra.burst));
        {
            let mut known = lock(&entry);
            if let Some(tat) = known.known_tat {
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
            let level = known.local.level(rate, ceiling, now);
            if level < cost {
                let retry_after = named::until(now_us, now_us + i64::from(spend.cells) * gcra.t);
                let refusal = Refusal { which: Which::First, retry_after, judged: None, tat: None };
                return Ok((Decision::Refused(refusal), Source::Precheck));
            }
            known.local.set(level - cost, now);
        }
        let refund = |entry: &Mutex<Entry>| {
            let mut entry = lock(entry);
            let level = entry.local.level(rate, ceiling, now);
            entry.local.set((level + cost).min(ceiling), now);
        };
        let fail_mode = spend.enforcement.fail_mode;
        let undecided = match self.ask_store(Take::Named(spend), now, fail_mode != FailMode::Closed).await {
            Some(Ok(decision)) => {
                let tat = match &decision {
                    Decision::Granted(grant) => grant.named.map(|(tat, _)| tat),
                    Decision::Refused(refusal) => {
                        refund(&entry);
                        refusal.tat
                    }
                    Decision::InsufficientCapacity(_) => {
                        refund(&entry);
                        None
                    }
                };
                if let Some(tat) = tat {
                    lock(&entry).known_tat = Some(named::micros(tat));
                }
                return Ok((decision, Source::Store));
            }
            Some(Err(undecided)) if !undecided.is_store_failure() => {
                refund(&entry);
                return Err(undecided);
            }
            Some(Err(undecided)) => undecided,
            None => Undecided::StoreFailing,
        };
        refund(&entry);
        let class = Class::Limiter(spend.limiter);
        match fail_mode {
            FailMode::Closed => return Err(undecided),
            FailMode::Open => {
                self.warn_fallback(&[class], fail_mode, &undecided);
                return Ok((Decision::Granted(Grant::FREE), Source::Open));
            }
            FailMode::Local => self.warn_fallback(&[class], fail_mode, &undecided),
        }
        // The fallback is a token bucket of the same rate and burst: this replica's own
        // approximation of the shared GCRA while the store cannot answer.
        let mut entry = lock(&entry);
        let level = entry.fallback.level(rate, f64::from(gcra.burst), now);
        let decision = if level >= cost {
            entry.fallback.set(level - cost, now);
            Decision::Granted(Grant {
                first: None,
                second: None,
                named: Some((now, (level - cost).floor() as u32)),
            })
        } else {
            let wait = ((cost - level) / rate * 1e6).ceil() as i64;
            let retry_after = named::until(now_us, now_us + wait);
            Decision::Refused(Refusal { which: Which::First, retry_after, judged: None, tat: None })
        };
        Ok((decision, Source::Fallback))
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
        match self.ask(may_skip) {
            Ask::No => None,
            Ask::Yes { probe } => {
                let answer =
                    tokio::time::timeout(self.config.decision_timeout, self.inner.decide(take, now)).await;
                let answer = answer.unwrap_or(Err(Undecided::TimedOut(self.config.decision_timeout)));
                match &answer {
                    Ok(_) => self.store_answered(),
                    Err(undecided) if undecided.is_store_failure() => self.store_failed(probe),
                    Err(_) => {}
                }
                Some(answer)
            }
        }
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

    /// Says, at most once a minute per scope (or limiter) and fail mode, that takes are being
    /// decided without the store.
    fn warn_fallback(&self, classes: &[Class], fail_mode: FailMode, undecided: &Undecided) {
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

/// A refusal the pre-check can give without the store, if any: (b) first, whose wait is
/// exact, then (a).
fn precheck(entries: &[(Which, Spend, Arc<Mutex<Entry>>)], now: DateTime<Utc>) -> Option<Refusal> {
    for (which, spend, entry) in entries {
        let known = lock(entry).known;
        if let Some(fill) = known {
            if spend.limit.level(fill, now) < spend.cost {
                let retry_after = spend.limit.time_to_cover(fill, spend.cost, now);
                return Some(Refusal { which: *which, retry_after, judged: Some(fill), tat: None });
            }
        }
    }
    for (which, spend, entry) in entries {
        let local = lock(entry).local;
        if local.level(spend.limit.per_second(), precheck_ceiling(spend.limit), now) < spend.cost {
            // The shared level is unknown, only below the cost: the wait an empty bucket
            // needs bounds it.
            let empty = Fill { tokens: 0.0, refilled_at: now };
            let retry_after = spend.limit.time_to_cover(empty, spend.cost, now);
            return Some(Refusal { which: *which, retry_after, judged: None, tat: None });
        }
    }
    None
}

/// Debits each spend's (a) bucket on the way to the store.
fn reserve(entries: &[(Which, Spend, Arc<Mutex<Entry>>)], now: DateTime<Utc>) {
    adjust_local(entries, now, -1.0);
}

/// Gives back what [`reserve`] took: the store did not debit.
fn refund(entries: &[(Which, Spend, Arc<Mutex<Entry>>)], now: DateTime<Utc>) {
    adjust_local(entries, now, 1.0);
}

fn adjust_local(entries: &[(Which, Spend, Arc<Mutex<Entry>>)], now: DateTime<Utc>, sign: f64) {
    for (_, spend, entry) in entries {
        let mut entry = lock(entry);
        let ceiling = precheck_ceiling(spend.limit);
        let level = entry.local.level(spend.limit.per_second(), ceiling, now);
        entry.local.set((level + sign * spend.cost).min(ceiling), now);
    }
}

/// Remembers what the store said about each bucket, and refunds (a) when it did not debit.
fn learn(entries: &[(Which, Spend, Arc<Mutex<Entry>>)], decision: &Decision, now: DateTime<Utc>) {
    match decision {
        Decision::Granted(grant) => {
            for (which, _, entry) in entries {
                if let Some(fill) = grant.remaining(*which) {
                    lock(entry).known = Some(fill);
                }
            }
        }
        Decision::Refused(refusal) => {
            refund(entries, now);
            if let Some(fill) = refusal.judged {
                if let Some((_, _, entry)) = entries.iter().find(|(which, _, _)| *which == refusal.which) {
                    lock(entry).known = Some(fill);
                }
            }
        }
        Decision::InsufficientCapacity(_) => refund(entries, now),
    }
}

/// Decides from this replica's fallback buckets, all-or-nothing, as the store would.
fn fallback(entries: &[(Which, Spend, Arc<Mutex<Entry>>)], now: DateTime<Utc>) -> Decision {
    // Both entries of a pair are held at once, so they are locked in one global order, as
    // the store locks rows: two takes naming the buckets in opposite orders cannot deadlock.
    let mut ordered: Vec<&(Which, Spend, Arc<Mutex<Entry>>)> = entries.iter().collect();
    ordered.sort_by_key(|(_, spend, _)| (spend.scope, spend.key));
    let mut guards: Vec<_> =
        ordered.into_iter().map(|(which, spend, entry)| (*which, *spend, lock(entry))).collect();
    guards.sort_by_key(|(which, _, _)| *which == Which::Second);
    for (which, spend, entry) in &guards {
        let level = entry.fallback.level(spend.limit.per_second(), spend.limit.burst(), now);
        if level < spend.cost {
            let fill = Fill { tokens: level, refilled_at: now };
            let retry_after = spend.limit.time_to_cover(fill, spend.cost, now);
            // Not the store's row: nothing the pre-check may learn from.
            return Decision::Refused(Refusal { which: *which, retry_after, judged: None, tat: None });
        }
    }
    let mut grant = Grant::FREE;
    for (which, spend, entry) in &mut guards {
        let left = entry.fallback.level(spend.limit.per_second(), spend.limit.burst(), now) - spend.cost;
        entry.fallback.set(left, now);
        let fill = Some(Fill { tokens: left, refilled_at: now });
        match which {
            Which::First => grant.first = fill,
            Which::Second => grant.second = fill,
        }
    }
    Decision::Granted(grant)
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
                Ok(Some(notification)) => match parse_reset(notification.payload()) {
                    Some(Reset::Budget(scope, key)) => guard.forget(scope, key),
                    Some(Reset::Named(limiter, key)) => guard.forget_named_by_text(limiter, key),
                    None => tracing::warn!(
                        payload = notification.payload(),
                        "ignoring a malformed reset notification"
                    ),
                },
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
enum Reset<'a> {
    Budget(Scope, Key),
    Named(&'a str, NamedKey),
}

/// `scope:uuid` ([`Store::reset`](crate::Store::reset)) or `named:limiter:hex`
/// ([`Store::reset_named`](crate::Store::reset_named)).
fn parse_reset(payload: &str) -> Option<Reset<'_>> {
    if let Some(named) = payload.strip_prefix("named:") {
        let (limiter, hex) = named.split_once(':')?;
        let mut key = [0u8; 32];
        if hex.len() != 64 {
            return None;
        }
        for (i, byte) in key.iter_mut().enumerate() {
            *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        return Some(Reset::Named(limiter, NamedKey(key)));
    }
    let (scope, key) = payload.split_once(':')?;
    Some(Reset::Budget(scope.parse().ok()?, uuid::Uuid::parse_str(key).ok()?.into()))
}
