//! The guard's timing, on tokio's paused clock: what a take waits for, and for how long, is
//! exact there, whatever else the machine is doing.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::{Guard, GuardBuilder, Observer, Source};
use crate::{
    Decider, Decision, Enforcement, FailMode, Fill, Grant, Key, LeaseRequest, Leased, Limit, Name, Spend,
    Take, Undecided, Which,
};

/// A store that answers its first take at once, and then nothing, ever: no other take and no
/// lease.
#[derive(Debug, Default)]
struct AnswersOnce {
    takes: AtomicUsize,
}

#[async_trait]
impl Decider for AnswersOnce {
    async fn decide(&self, _: Take, now: DateTime<Utc>) -> Result<Decision, Undecided> {
        if self.takes.fetch_add(1, Ordering::SeqCst) > 0 {
            std::future::pending::<()>().await;
        }
        let row = Fill { tokens: 99.0, refilled_at: now };
        Ok(Decision::Granted(Grant::of([(Which::First, row)])))
    }

    async fn lease(&self, _: LeaseRequest, _: DateTime<Utc>) -> Result<Option<Leased>, Undecided> {
        std::future::pending().await
    }
}

/// Remembers where the last decision came from.
#[derive(Debug, Default)]
struct LastSource(std::sync::Mutex<Option<Source>>);

impl Observer for LastSource {
    fn decided(
        &self,
        _: &Take,
        _: DateTime<Utc>,
        outcome: Result<(&Decision, Source), &Undecided>,
        _: Duration,
    ) {
        *self.0.lock().unwrap() = outcome.ok().map(|(_, source)| source);
    }
    fn abandoned(&self, _: &Take, _: Duration) {}
    fn store_failing(&self, _: bool) {}
}

#[tokio::test(start_paused = true)]
async fn a_take_waiting_for_another_takes_lease_is_decided_by_its_fail_mode_within_one_decision_timeout() {
    // Issue 32, item 6. A take that met a lease being asked for waited for its answer (up to
    // the asking take's decision timeout), then asked the store with a decision timeout of
    // its own: two in all, past a caller's deadline of one and a half, which answered 500
    // where the take's OPEN fail mode should have admitted it.
    let timeout = Duration::from_secs(1);
    let observer = Arc::new(LastSource::default());
    let guard = Guard::builder(AnswersOnce::default())
        .decision_timeout(timeout)
        .leases(Duration::from_secs(60))
        .observer(observer.clone())
        .build();
    let limit = Limit::new(100.0, 100.0).unwrap();
    let spend = Spend::new(Name::new("hot").unwrap(), Key([7; 16]), 1.0, limit);
    let open = Take::Single(Spend {
        enforcement: Enforcement { fail_mode: FailMode::Open, ..Enforcement::STRICT },
        ..spend
    });
    let now = DateTime::<Utc>::from_timestamp(1_800_000_000, 0).unwrap();

    // The store answers the first take; the second finds the bucket hot and asks for a lease,
    // which never comes; the third waits for that lease.
    assert!(guard.decide(open.clone(), now).await.unwrap().is_granted());
    let caller_deadline = timeout * 3 / 2;
    let (asking, waiting) = tokio::join!(
        guard.decide(open.clone(), now),
        tokio::time::timeout(caller_deadline, guard.decide(open, now))
    );
    assert!(asking.unwrap().is_granted(), "the asking take times out and is admitted open");
    let waiting = waiting.expect("the waiting take is answered within its caller's deadline");
    assert!(waiting.unwrap().is_granted());
    assert_eq!(*observer.0.lock().unwrap(), Some(Source::Open), "decided by its fail mode");
}

/// A store that answers every take from rows of its own, exactly as the shared store would
/// (all or nothing, the first bucket short refused, a grant saying what each position left),
/// or fails every call while `failing`; it counts the takes and leases it was asked.
#[derive(Debug, Default)]
struct Rows {
    rows: std::sync::Mutex<std::collections::HashMap<(Name, Key), Fill>>,
    failing: std::sync::atomic::AtomicBool,
    takes: AtomicUsize,
    leases: AtomicUsize,
}

#[async_trait]
impl Decider for Rows {
    async fn decide(&self, take: Take, now: DateTime<Utc>) -> Result<Decision, Undecided> {
        self.takes.fetch_add(1, Ordering::SeqCst);
        if self.failing.load(Ordering::SeqCst) {
            return Err(Undecided::StoreFailing);
        }
        let mut rows = self.rows.lock().unwrap();
        let mut left = Vec::new();
        for (which, spend) in take.spends() {
            let row = rows.get(&(spend.name, spend.key)).copied();
            let level = row.map_or(spend.limit.burst(), |row| spend.limit.level(row, now));
            if level < spend.cost {
                let judged = row.expect("a missing row is full");
                let retry_after = spend.limit.time_to_cover(judged, spend.cost, now);
                return Ok(Decision::Refused(crate::Refusal { which, retry_after, judged: row, tat: None }));
            }
            let refilled_at = row.map_or(now, |row| row.refilled_at.max(now));
            left.push((which, spend, Fill { tokens: level - spend.cost, refilled_at }));
        }
        for (_, spend, fill) in &left {
            rows.insert((spend.name, spend.key), *fill);
        }
        Ok(Decision::Granted(Grant::of(left.into_iter().map(|(which, _, fill)| (which, fill)))))
    }

    async fn lease(&self, _: LeaseRequest, _: DateTime<Utc>) -> Result<Option<Leased>, Undecided> {
        self.leases.fetch_add(1, Ordering::SeqCst);
        Ok(None)
    }
}

/// A take of `n` distinct buckets (keys 1 to `n`) of one each, from buckets of 2, each
/// failing by `fail_mode(i)`.
fn many(n: u8, fail_mode: impl Fn(usize) -> FailMode) -> Take {
    let limit = Limit::new(1.0, 2.0).unwrap();
    Take::many(
        (0..n)
            .map(|i| Spend {
                enforcement: Enforcement { fail_mode: fail_mode(usize::from(i)), ..Enforcement::STRICT },
                ..Spend::new(Name::new("descriptors").unwrap(), Key([i + 1; 16]), 1.0, limit)
            })
            .collect::<Vec<_>>(),
    )
}

fn guard_of(store: &Arc<Rows>, observer: &Arc<LastSource>) -> Guard {
    GuardBuilder::shared(store.clone()).observer(observer.clone()).build()
}

#[tokio::test(start_paused = true)]
async fn a_take_of_many_buckets_is_refused_without_a_statement_once_one_of_them_is_known_short() {
    // Issue 34, item 3: the pre-check of a take of 64 buckets, as for a pair.
    let (store, observer) = (Arc::new(Rows::default()), Arc::new(LastSource::default()));
    let guard = guard_of(&store, &observer);
    let now = DateTime::<Utc>::from_timestamp(1_800_000_000, 0).unwrap();
    let take = many(64, |_| FailMode::Closed);
    // Twice granted: every bucket learned at 0 left.
    for _ in 0..2 {
        let Decision::Granted(grant) = guard.decide(take.clone(), now).await.unwrap() else { panic!() };
        for (which, _) in take.spends() {
            assert!(grant.remaining(which).is_some(), "{which:?} read at its own position");
        }
    }
    assert_eq!(store.takes.load(Ordering::SeqCst), 2);
    // Every bucket is known empty: the next take is refused without a statement, at the
    // first position, with the exact wait.
    let Decision::Refused(refusal) = guard.decide(take.clone(), now).await.unwrap() else { panic!() };
    assert_eq!(refusal.which, Which::First);
    assert_eq!(refusal.retry_after, Duration::from_secs(1));
    assert_eq!(*observer.0.lock().unwrap(), Some(Source::Precheck));
    assert_eq!(store.takes.load(Ordering::SeqCst), 2, "no statement");
    // A second later every bucket holds one again: asked, granted.
    let later = now + chrono::Duration::seconds(1);
    assert!(guard.decide(take.clone(), later).await.unwrap().is_granted());
    assert_eq!(store.takes.load(Ordering::SeqCst), 3);
    // Another second on, each holds one again, but bucket 40, taken alone, none: a take of
    // all 64 is refused at position 39 without a statement.
    let forty = take.spend(Which::at(39)).unwrap();
    let second_later = later + chrono::Duration::seconds(1);
    assert!(guard.decide(Take::Single(forty), second_later).await.unwrap().is_granted());
    let Decision::Refused(refusal) = guard.decide(take, second_later).await.unwrap() else { panic!() };
    assert_eq!((refusal.which, *observer.0.lock().unwrap()), (Which::at(39), Some(Source::Precheck)));
    assert_eq!(store.takes.load(Ordering::SeqCst), 4);
}

#[tokio::test(start_paused = true)]
async fn a_take_of_many_buckets_fails_by_the_strictest_of_their_fail_modes() {
    let now = DateTime::<Utc>::from_timestamp(1_800_000_000, 0).unwrap();
    let failing = || {
        let store = Arc::new(Rows::default());
        store.failing.store(true, Ordering::SeqCst);
        store
    };
    // One CLOSED among OPEN ones: undecided, never admitted.
    let (store, observer) = (failing(), Arc::new(LastSource::default()));
    let guard = guard_of(&store, &observer);
    let one_closed = many(8, |i| if i == 5 { FailMode::Closed } else { FailMode::Open });
    let undecided = guard.decide(one_closed, now).await.unwrap_err();
    assert!(undecided.is_store_failure(), "{undecided:?}");
    // Every one OPEN: admitted, nothing decided.
    assert!(guard.decide(many(8, |_| FailMode::Open), now).await.unwrap().is_granted());
    assert_eq!(*observer.0.lock().unwrap(), Some(Source::Open));
    // One STATIC among OPEN ones: this replica's fallback decides every bucket, all or
    // nothing, the grant read at each position.
    let one_static = many(8, |i| if i == 2 { FailMode::Static } else { FailMode::Open });
    for _ in 0..2 {
        let Decision::Granted(grant) = guard.decide(one_static.clone(), now).await.unwrap() else { panic!() };
        assert_eq!(*observer.0.lock().unwrap(), Some(Source::Fallback));
        assert!(one_static.spends().all(|(which, _)| grant.remaining(which).is_some()));
    }
    // A second later each holds one; bucket 8, spent alone, holds none: the take of all
    // eight is refused there, at position 7, and debits none of the others.
    let later = now + chrono::Duration::seconds(1);
    let eighth = one_static.spend(Which::at(7)).unwrap();
    let static_eighth =
        Spend { enforcement: Enforcement { fail_mode: FailMode::Static, ..eighth.enforcement }, ..eighth };
    assert!(guard.decide(Take::Single(static_eighth), later).await.unwrap().is_granted());
    let Decision::Refused(refusal) = guard.decide(one_static.clone(), later).await.unwrap() else { panic!() };
    assert_eq!((refusal.which, *observer.0.lock().unwrap()), (Which::at(7), Some(Source::Fallback)));
    let first_seven = Take::many(one_static.spends().take(7).map(|(_, spend)| spend).collect::<Vec<_>>());
    assert!(
        guard.decide(first_seven.clone(), later).await.unwrap().is_granted(),
        "the refusal debited none of them"
    );
    assert!(!guard.decide(first_seven, later).await.unwrap().is_granted());
}

#[tokio::test(start_paused = true)]
async fn an_open_circuit_skips_the_store_for_a_take_of_many_that_may_skip_it_and_asks_for_one_that_fails_closed(
) {
    let now = DateTime::<Utc>::from_timestamp(1_800_000_000, 0).unwrap();
    let (store, observer) = (Arc::new(Rows::default()), Arc::new(LastSource::default()));
    store.failing.store(true, Ordering::SeqCst);
    let guard = guard_of(&store, &observer);
    for _ in 0..3 {
        assert!(guard.decide(many(4, |_| FailMode::Closed), now).await.is_err());
    }
    assert!(guard.store_failing());
    let asked = store.takes.load(Ordering::SeqCst);
    assert!(guard.decide(many(4, |_| FailMode::Open), now).await.unwrap().is_granted());
    assert_eq!(store.takes.load(Ordering::SeqCst), asked, "not asked");
    assert!(guard
        .decide(many(4, |i| if i == 3 { FailMode::Closed } else { FailMode::Open }), now)
        .await
        .is_err());
    assert_eq!(store.takes.load(Ordering::SeqCst), asked + 1, "a take with a CLOSED bucket asks");
}

#[tokio::test(start_paused = true)]
async fn a_take_of_many_buckets_is_never_leased() {
    // Leases serve single takes: a take of many is all or nothing across its buckets, which
    // no lease of one of them can decide, so however hot its buckets it asks the store.
    let (store, observer) = (Arc::new(Rows::default()), Arc::new(LastSource::default()));
    let guard =
        GuardBuilder::shared(store.clone()).leases(Duration::from_secs(1)).observer(observer.clone()).build();
    let now = DateTime::<Utc>::from_timestamp(1_800_000_000, 0).unwrap();
    let limit = Limit::new(1_000.0, 1_000.0).unwrap();
    let take = Take::many(
        (1..=3)
            .map(|i| Spend::new(Name::new("descriptors").unwrap(), Key([i; 16]), 1.0, limit))
            .collect::<Vec<_>>(),
    );
    for _ in 0..50 {
        assert!(guard.decide(take.clone(), now).await.unwrap().is_granted());
        assert_eq!(*observer.0.lock().unwrap(), Some(Source::Store));
    }
    assert_eq!((store.takes.load(Ordering::SeqCst), store.leases.load(Ordering::SeqCst)), (50, 0));
}
