//! The layer in front of a shared store that keeps floods cheap and outages survivable.
//!
//! A [`Guard`] is a [`Decider`] wrapping another (the [`Store`](crate::Store)), per replica.
//! It adds, in the order a take meets them:
//!
//! 1. **The pre-check.** Per bucket it keeps the bucket's row as the store last described it
//!    (what a grant left, or what a refusal judged; for a named limiter, the key's TAT). A
//!    take that row cannot cover yet is refused here, without a statement, with the exact
//!    wait.
//! 2. **The store**, asked with a deadline (the decision timeout, counted from when the take
//!    began, so a take that first waited for a lease another take asked for has only what is
//!    left of it), behind a circuit: after a few failures in a row, takes that do not fail
//!    closed do not ask it at all (they decide by their fail mode at once) while it is probed
//!    twice a second, until a probe or any other take finds it answering. Takes that fail
//!    closed keep asking: skipping the store would only turn their wait into a 500.
//! 3. **The fail mode** each take carries ([`Spend::enforcement`](crate::Spend::enforcement), set per take by whoever
//!    sized it, so a changed rule applies at once) when the store cannot answer or is not
//!    asked: [`FailMode::Closed`] (the take is [`Undecided`], an HTTP 500),
//!    [`FailMode::Static`] (an in-memory bucket of the same limit decides, per replica) or
//!    [`FailMode::Open`] (admitted, nothing debited); the latter two log a warning at most
//!    once a minute per scope. A take of several buckets (a pair, or [`Take::Many`]) fails by
//!    the strictest of their modes: one `CLOSED` spend makes it undecided while the store
//!    cannot answer, and a `STATIC` one has the fallback decide every bucket of it, all or
//!    nothing.
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
//! ([`Guard::forget_every_bucket_of`], [`Guard::forget`]). (Costs below the float spacing of a
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

//!
//! # Where each part lives
//!
//! One path decides a take of either algorithm ([`Guard::decide`]): what the take is to the
//! guard, its buckets with what the pre-check knows of each, is `precheck`; the circuit is
//! `circuit`; the fallback is `fallback`; following resets is `resets`.

mod charges;
mod circuit;
mod fallback;
mod leases;
mod precheck;
mod resets;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use crate::named::Gcra;
use crate::{Decider, Decision, FailMode, Grant, Key, Name, NamedKey, NamedSpend, Refusal, Take, Undecided};

use circuit::Circuit;
use fallback::{Fallback, FallbackFull};
use precheck::{BucketId, Guarded, Known};
pub use resets::follow_resets;

/// The most often a scope deciding from its fallback says so in the log.
const WARN_EVERY: Duration = Duration::from_secs(60);

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
    /// How long a lease of a hot bucket lasts; `None`: no bucket is leased.
    lease_period: Option<Duration>,
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
                lease_period: None,
            },
            observer: Arc::new(Unobserved),
        }
    }

    /// The reference's decision timeout: 250 ms.
    pub const DEFAULT_DECISION_TIMEOUT: Duration = Duration::from_millis(250);
    /// A hundred thousand buckets, a few tens of megabytes at most.
    pub const DEFAULT_CAPACITY: u64 = 100_000;

    /// The longest a take waits for the store before it counts as not answered and its fail
    /// mode decides ([`GuardBuilder::DEFAULT_DECISION_TIMEOUT`] unless told): all of its
    /// waiting, a lease another take asks for included, comes out of this one timeout. Keep it below the
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

    /// Leases hot buckets for `period` each (docs/adr/0034): a replica that takes often from
    /// one token bucket takes many of its tokens in one statement and grants them from memory,
    /// never more than the budget; what it did not grant goes back with its next lease, or
    /// when [`Guard::return_leases`] runs after the period. Off unless told. Only single
    /// takes of a token bucket are leased; pairs, takes of many buckets and named limiters
    /// take directly (all or nothing across buckets is the store's to decide).
    pub fn leases(mut self, period: Duration) -> GuardBuilder {
        self.config.lease_period = Some(period).filter(|period| !period.is_zero());
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
            leasing: Mutex::new(HashMap::new()),
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
    /// This replica's lease of the bucket, without a statement (docs/adr/0034).
    Lease,
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
    /// fail `STATIC` now decide from their fallback (or from the store again).
    fn store_failing(&self, failing: bool);

    /// A lease of a bucket of `name` answered: what it took and what of its refund went back.
    fn leased(&self, name: Name, leased: &crate::Leased) {
        let _ = (name, leased);
    }
}

/// An [`Observer`] that ignores everything.
#[derive(Debug, Default, Clone, Copy)]
pub struct Unobserved;

impl Observer for Unobserved {
    fn decided(&self, _: &Take, _: DateTime<Utc>, _: Result<(&Decision, Source), &Undecided>, _: Duration) {}
    fn abandoned(&self, _: &Take, _: Duration) {}
    fn store_failing(&self, _: bool) {}
}

/// A bucket's pre-check entry, shared by the takes that meet it.
type Entry = Arc<Mutex<Known>>;

/// The pre-check, fallback and circuit in front of a shared store. Cheap to share (`Arc`).
pub struct Guard {
    inner: Arc<dyn Decider>,
    config: GuardConfig,
    observer: Arc<dyn Observer>,
    known: quick_cache::sync::Cache<BucketId, Arc<Mutex<Known>>>,
    /// The entries of `known` that may hold a lease: what the lease return and the operator's
    /// list walk, rather than every bucket the pre-check remembers. An entry `known` no
    /// longer has (a reset, a changed rule, eviction) took its lease with it and is dropped
    /// here at the next return. Locked before an entry, never while one is.
    leasing: Mutex<HashMap<(Name, Key), Entry>>,
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
        match resets::parse(payload) {
            Some(resets::Reset::Budget(name, key)) => self.forget(name, key),
            Some(resets::Reset::Named(limiter, key)) => self.forget_named(limiter, key),
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
        precheck::not_yet_conforming(gcra, spend.cells, tat, now)
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

    /// Decides `take` at `now`: the pre-check, then the store behind the circuit, then the
    /// fail mode; the same path for token buckets and GCRA limiters.
    async fn decide_guarded(&self, take: &Take, now: DateTime<Utc>) -> Result<(Decision, Source), Undecided> {
        // One decision timeout for the whole take: waiting for a lease another take asks for,
        // and then asking the store, come out of the same one, so its fail mode decides
        // within the timeout the caller was promised (a second timeout after the wait ran
        // past the caller's own deadline, which answered 500 where OPEN or STATIC should
        // have decided).
        let deadline = tokio::time::Instant::now() + self.config.decision_timeout;
        if let Some(Err(untrusted)) = self.config.clock.as_ref().map(crate::ClockStatus::check) {
            return Err(Undecided::Declined(Box::new(untrusted)));
        }
        let Some(guarded) = Guarded::of(self, take).map_err(Undecided::Store)? else {
            // Free, never fits, an unusable limit, or a bucket named twice with two limits:
            // the store answers without a query.
            return Ok((self.inner.decide(take.clone(), now).await?, Source::Store));
        };
        // A lease's tokens first: they are this replica's, whatever the row the pre-check
        // last learned says of the shared bucket.
        if let Some(granted) = self.granted_from_lease(&guarded, now, true) {
            return Ok(granted);
        }
        if let Some(refusal) = guarded.precheck(now) {
            return Ok((Decision::Refused(refusal), Source::Precheck));
        }
        let fail_mode = guarded.fail_mode();
        let may_skip = fail_mode != FailMode::Closed;
        let answer = match self.by_lease(&guarded, now, may_skip, deadline).await {
            ByLease::Decided(decided) => return decided,
            ByLease::Answered(answer) => answer,
            ByLease::Wait(mut asking) => {
                // Another take of this bucket asks for a lease: wait for its answer, then
                // spend the lease, or learn what it learned, or ask the store with what is
                // left of this take's timeout. A wait that uses it all up is the store not
                // answering in time, for the fail mode to decide; the asking take counts it
                // against the circuit, once.
                let waited = tokio::time::timeout_at(deadline, asking.changed()).await;
                if let Some(granted) = self.granted_from_lease(&guarded, now, false) {
                    return Ok(granted);
                }
                if let Some(refusal) = guarded.precheck(now) {
                    return Ok((Decision::Refused(refusal), Source::Precheck));
                }
                if waited.is_err() || tokio::time::Instant::now() >= deadline {
                    Some(Err(Undecided::TimedOut(self.config.decision_timeout)))
                } else {
                    self.ask_store(take, now, may_skip, deadline).await
                }
            }
            ByLease::Direct => self.ask_store(take, now, may_skip, deadline).await,
        };
        let undecided = match answer {
            Some(Ok(decision)) => {
                guarded.learn(&decision);
                return Ok((decision, Source::Store));
            }
            Some(Err(undecided)) if !undecided.is_store_failure() => return Err(undecided),
            Some(Err(undecided)) => undecided,
            None => Undecided::StoreFailing,
        };
        match fail_mode {
            FailMode::Closed => Err(undecided),
            FailMode::Open => {
                self.warn_fallback(&guarded.names(), fail_mode, &undecided);
                Ok((Decision::Granted(Grant::FREE), Source::Open))
            }
            FailMode::Static => {
                self.warn_fallback(&guarded.names(), fail_mode, &undecided);
                match self.fallback.spend(&guarded.fallback_spends(), now) {
                    Err(FallbackFull) => Err(self.fallback_full(undecided)),
                    Ok(decided) => {
                        Ok((for_take(guarded.fallback_decision(decided, now), take), Source::Fallback))
                    }
                }
            }
        }
    }

    /// A single take of a token bucket, when leases are on: granted from this replica's lease
    /// of the bucket, or decided by asking the store for one (which, granted, leaves the rest
    /// of the lease here), or left to take directly.
    async fn by_lease(
        &self,
        guarded: &Guarded,
        now: DateTime<Utc>,
        may_skip: bool,
        deadline: tokio::time::Instant,
    ) -> ByLease {
        let Some(period) = self.config.lease_period else { return ByLease::Direct };
        let Some((which, spend, entry)) = leasable(guarded) else { return ByLease::Direct };
        let instant = Instant::now();
        let (request, _answered) = match lock(entry).lease.request(spend, now, instant, period) {
            leases::Ask::Request(request, answered) => (request, answered),
            leases::Ask::Wait(asking) => return ByLease::Wait(asking),
            leases::Ask::Direct => return ByLease::Direct,
        };
        // Dropped before the answer (its caller went away), the request leaves the entry
        // asking no longer, and whatever it leased is forfeited.
        let mut asking = AskingForLease { entry, answered: false };
        let answer = self.ask_store_with(may_skip, deadline, self.inner.lease(request, now)).await;
        asking.answered = true;
        match answer {
            Some(Ok(Some(leased))) => {
                self.observer.leased(spend.name, &leased);
                let holds = {
                    let mut known = lock(entry);
                    known.lease.leased(spend, &leased, instant, period);
                    known.fill = Some(leased.row);
                    known.lease.held() > 0.0
                };
                if holds {
                    lock(&self.leasing).insert((spend.name, spend.key), entry.clone());
                }
                let decision = if leased.leased >= spend.cost {
                    Decision::Granted(Grant::of([(*which, leased.row)]))
                } else {
                    Decision::Refused(Refusal {
                        which: *which,
                        retry_after: spend.limit.time_to_cover(leased.row, spend.cost, now),
                        judged: Some(leased.row),
                        tat: None,
                    })
                };
                ByLease::Decided(Ok((decision, Source::Store)))
            }
            // A decider that cannot lease: take directly, now and from now on.
            Some(Ok(None)) => {
                lock(entry).lease.unanswered();
                ByLease::Direct
            }
            Some(Err(undecided)) => {
                lock(entry).lease.unanswered();
                ByLease::Answered(Some(Err(undecided)))
            }
            None => {
                lock(entry).lease.unanswered();
                ByLease::Answered(None)
            }
        }
    }

    /// A single take of a token bucket granted from this replica's lease of it, when leases
    /// are on and the lease covers it (counting the take's demand on its `first` try).
    fn granted_from_lease(
        &self,
        guarded: &Guarded,
        now: DateTime<Utc>,
        first: bool,
    ) -> Option<(Decision, Source)> {
        let period = self.config.lease_period?;
        let (which, spend, entry) = leasable(guarded)?;
        let row = lock(entry).lease.grant(spend, now, Instant::now(), period, first)?;
        Some((Decision::Granted(Grant::of([(*which, row)])), Source::Lease))
    }

    /// Gives back what expired leases did not grant, one statement per bucket: run it every
    /// lease period (the binary does). A bucket still hot gives back with its next lease
    /// instead. Returns the tokens credited; a refund that fails is forfeited.
    pub async fn return_leases(&self, now: DateTime<Utc>) -> f64 {
        let Some(period) = self.config.lease_period else { return 0.0 };
        let instant = Instant::now();
        let mut returned = 0.0;
        let mut due = Vec::new();
        for ((name, key), entry) in self.leasing_entries() {
            if let Some(request) = lock(&entry).lease.take_back(name, key, instant, now, period) {
                due.push((request, entry.clone()));
            }
            // Whatever it held is going back or spent: a lease taken meanwhile registers again.
            let mut leasing = lock(&self.leasing);
            if leasing.get(&(name, key)).is_some_and(|registered| Arc::ptr_eq(registered, &entry))
                && lock(&entry).lease.held() <= 0.0
            {
                leasing.remove(&(name, key));
            }
        }
        for (request, entry) in due {
            let answer =
                tokio::time::timeout(self.config.decision_timeout, self.inner.lease(request, now)).await;
            let mut known = lock(&entry);
            match answer {
                Ok(Ok(Some(leased))) => {
                    self.observer.leased(request.spend.name, &leased);
                    returned += leased.refunded;
                    known.lease.leased(&request.spend, &leased, instant, Duration::ZERO);
                    known.fill = Some(leased.row);
                }
                _ => known.lease.unanswered(),
            }
        }
        returned
    }

    /// The buckets this replica holds leased tokens of: (budget, key, tokens not granted).
    pub fn leased_buckets(&self) -> Vec<(Name, Key, f64)> {
        self.leasing_entries()
            .into_iter()
            .filter_map(|((name, key), entry)| {
                let held = lock(&entry).lease.held();
                (held > 0.0).then_some((name, key, held))
            })
            .collect()
    }

    /// The entries that may hold a lease and are still the pre-check's; those it dropped are
    /// forgotten here too, their leases forfeited with them.
    fn leasing_entries(&self) -> Vec<((Name, Key), Entry)> {
        let mut leasing = lock(&self.leasing);
        leasing.retain(|&(name, key), entry| {
            self.known.get(&BucketId::Budget(name, key)).is_some_and(|known| Arc::ptr_eq(&known, entry))
        });
        leasing.iter().map(|(id, entry)| (*id, entry.clone())).collect()
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

#[async_trait]
impl Decider for Guard {
    async fn decide(&self, take: Take, now: DateTime<Utc>) -> Result<Decision, Undecided> {
        let mut pending =
            Pending { observer: &*self.observer, take: &take, started: Instant::now(), answered: false };
        let outcome = self.decide_guarded(&take, now).await;
        pending.answered = true;
        let elapsed = pending.started.elapsed();
        match &outcome {
            Ok((decision, source)) => self.observer.decided(&take, now, Ok((decision, *source)), elapsed),
            Err(undecided) => self.observer.decided(&take, now, Err(undecided), elapsed),
        }
        outcome.map(|(decision, _)| decision)
    }

    /// The same trusted clock, decision timeout, circuit and fail mode as a take; the
    /// pre-check learns the row the charge left (`charges.rs`).
    async fn charge(
        &self,
        spend: crate::Spend,
        now: DateTime<Utc>,
    ) -> Result<Option<crate::Fill>, Undecided> {
        self.charge_guarded(spend, now).await
    }

    /// As [`Guard::charge`](Decider::charge); a row the pre-check knows to read below
    /// `spend.cost` answers without the store (`charges.rs`).
    async fn peek(&self, spend: crate::Spend, now: DateTime<Utc>) -> Result<Option<crate::Fill>, Undecided> {
        self.peek_guarded(spend, now).await
    }
}

/// The one bucket a take spends, when it is one a lease may serve: a single token bucket
/// (a pair or a take of many buckets is all or nothing across its buckets, which no lease of
/// one of them can decide; it takes directly, as `GuardBuilder::leases` says).
fn leasable(guarded: &Guarded) -> Option<&(crate::Which, crate::Spend, Arc<Mutex<Known>>)> {
    match guarded {
        Guarded::Buckets(entries) if entries.len() == 1 => entries.first(),
        _ => None,
    }
}

/// The fallback's decision of `take`'s sides, for `take` itself: a grant says what each bucket
/// left at every position that spends from it, as the store's does.
fn for_take(decision: Decision, take: &Take) -> Decision {
    match decision {
        Decision::Granted(grant) => Decision::Granted(grant.spread_over(take)),
        decision => decision,
    }
}

/// What a take's lease did: decided it, asked the store and got no decision (the answer
/// the direct path would have had, for the fail mode), or nothing.
enum ByLease {
    Decided(Result<(Decision, Source), Undecided>),
    Answered(Option<Result<Decision, Undecided>>),
    Wait(tokio::sync::watch::Receiver<()>),
    Direct,
}

/// Marks a lease request as over if its caller goes away before the answer.
struct AskingForLease<'a> {
    entry: &'a Arc<Mutex<Known>>,
    answered: bool,
}

impl Drop for AskingForLease<'_> {
    fn drop(&mut self) {
        if !self.answered {
            lock(self.entry).lease.unanswered();
        }
    }
}

/// Tells the observer about a take whose caller stopped waiting: dropped before it answered.
struct Pending<'a> {
    observer: &'a dyn Observer,
    take: &'a Take,
    started: Instant,
    answered: bool,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.observer.abandoned(self.take, self.started.elapsed());
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Every value behind these locks is whole between statements; a panic cannot tear one.
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
