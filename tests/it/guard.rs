//! The guard in front of the store: its pre-check refuses nothing the shared bucket would
//! admit (checked against the store itself with random workloads), a flood costs the store
//! next to nothing, and the fallback decides when the store cannot.

use std::sync::{Arc, Mutex};
use std::time::Duration as StdDuration;

use chrono::{DateTime, Duration, Utc};
use proptest::prelude::*;
use ratebudget::{
    Decider, Decision, Enforcement, FailMode, Guard, Key, Limit, Observer, Scope, Source, Spend, Store, Take,
    Undecided, Unobserved,
};
use sqlx::PgPool;

use crate::support::helpers::{instant, key, sessions_wait_on_a_lock, unreachable_pool, FreshDatabase};

/// Remembers where the last decision came from.
#[derive(Debug, Default)]
struct LastSource(Mutex<Option<Source>>);

impl Observer for LastSource {
    fn decided(
        &self,
        _: &Take,
        _: DateTime<Utc>,
        outcome: Result<(&Decision, Source), &Undecided>,
        _: StdDuration,
    ) {
        *self.0.lock().unwrap() = outcome.ok().map(|(_, source)| source);
    }
    fn abandoned(&self, _: &Take, _: StdDuration) {}
    fn store_failing(&self, _: bool) {}
}

fn guard(store: &Store, observer: Arc<dyn Observer>) -> Guard {
    Guard::builder(store.clone())
        .decision_timeout(StdDuration::from_secs(5))
        .capacity(1000)
        .observer(observer)
        .build()
}

/// What the store's own arithmetic says a bucket holds at `now`, read without writing; a
/// missing bucket holds its burst (the next take mints it full).
async fn shared_level(pool: &PgPool, spend: Spend, now: DateTime<Utc>) -> f64 {
    let level: Option<f64> = sqlx::query_scalar(
        "SELECT LEAST($3::float8, tokens + GREATEST(0::float8, date_part('epoch', $5::timestamptz - refilled_at)) * $4::float8)
         FROM plexsphere.rate_budgets WHERE scope = $1 AND bucket_key = $2",
    )
    .bind(spend.name.as_str())
    .bind(spend.key.as_uuid())
    .bind(spend.limit.burst())
    .bind(spend.limit.per_second())
    .bind(now)
    .fetch_optional(pool)
    .await
    .unwrap();
    level.unwrap_or(spend.limit.burst())
}

#[derive(Clone, Debug)]
enum Op {
    /// A take through replica `via` (0 or 1), or straight on the store (2, another replica
    /// without a guard), of `cost` from `bucket`, and from `second` too when it is a pair.
    Take { via: usize, bucket: usize, second: Option<usize>, cost: f64 },
    /// An operator resets `bucket`; both replicas hear of it.
    Reset { bucket: usize },
}

fn op() -> impl Strategy<Value = (Op, i64)> {
    let cost = prop_oneof![Just(1.0), 0.1f64..4.0];
    let take =
        (0usize..3, 0usize..3, prop::option::of(0usize..3), cost).prop_map(|(via, bucket, second, cost)| {
            Op::Take { via, bucket, second: second.filter(|s| *s != bucket), cost }
        });
    let op = prop_oneof![12 => take, 1 => (0usize..3).prop_map(|bucket| Op::Reset { bucket })];
    // Mostly small steps forward, sometimes none. Never back: one clock that goes back
    // between two replicas' takes is clock skew between them, the documented exception
    // (guard.rs; pinned by the test below).
    let step = prop_oneof![4 => 0i64..400_000, 2 => Just(0i64)];
    (op, step)
}

#[test]
fn the_precheck_refuses_only_what_the_shared_bucket_would_refuse() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let (database, pool) = runtime.block_on(FreshDatabase::create());
    let store = Store::new(pool.clone());
    let config = ProptestConfig { cases: 160, ..ProptestConfig::default() };
    let prechecked = std::sync::atomic::AtomicUsize::new(0);
    proptest!(config, |(
        per_second in 0.5f64..20.0,
        burst in 1.0f64..8.0,
        ops in prop::collection::vec(op(), 1..60),
    )| {
        let observers = [Arc::new(LastSource::default()), Arc::new(LastSource::default())];
        let guards = [
            guard(&store, observers[0].clone()),
            guard(&store, observers[1].clone()),
        ];
        let limit = Limit::new(per_second, burst.min(per_second * 3600.0)).unwrap();
        let buckets: Vec<(Scope, Key)> = vec![
            (Scope::SecretReadNode, key()),
            (Scope::SecretReadNode, key()),
            (Scope::SecretReadDomain, key()),
        ];
        let spend = |bucket: usize, cost| Spend::new(buckets[bucket].0, buckets[bucket].1, cost, limit);
        let mut now = instant();
        for (i, (op, step)) in ops.into_iter().enumerate() {
            now += Duration::microseconds(step);
            match op {
                Op::Reset { bucket } => {
                    let (scope, key) = buckets[bucket];
                    runtime.block_on(store.reset(scope, key)).unwrap();
                    guards.iter().for_each(|guard| guard.forget(scope, key));
                }
                Op::Take { via, bucket, second, cost } => {
                    let take = match second {
                        Some(second) => Take::Pair(spend(bucket, cost), spend(second, cost)),
                        None => Take::Single(spend(bucket, cost)),
                    };
                    if via == 2 {
                        runtime.block_on(store.decide(take, now)).unwrap();
                        continue;
                    }
                    let decision = runtime.block_on(guards[via].decide(take.clone(), now)).unwrap();
                    let source = *observers[via].0.lock().unwrap();
                    if source == Some(Source::Precheck) {
                        prechecked.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Decision::Refused(refusal) = decision else {
                            panic!("the pre-check only refuses: {decision:?}")
                        };
                        let refused = take.spend(refusal.which).unwrap();
                        let level = runtime.block_on(shared_level(&pool, refused, now));
                        prop_assert!(
                            level < refused.cost,
                            "op {}: the pre-check refused {} from a bucket holding {} at {}",
                            i, refused.cost, level, now
                        );
                    }
                }
            }
        }
    });
    // The workloads must have made the pre-check refuse, or the property says nothing.
    // 160 cases make 129-173 pre-check refusals (measured); 40 cases made 28-41 and, now and
    // then, fewer than this check's floor, which failed a CI run without any bug.
    let prechecked = prechecked.into_inner();
    assert!(prechecked > 40, "the pre-check hardly refused ({prechecked}): the workloads are too gentle");
    runtime.block_on(database.drop_database(pool));
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn skew_beyond_the_other_replicas_cost_over_the_rate_is_the_one_under_admission(pool: PgPool) {
    // Found by the property test above when its clock could go back. Replica B learns the
    // row; replica A, whose clock is ahead, spends 0.1 at its later instant (the row now holds
    // the refill up to A's instant); B, at its own instant, refuses from what it learned what
    // the store, judging A's row, would admit. The skew (7.3 ms) exceeds A's cost over the
    // rate (0.1 / 13.8 a second = 7.25 ms); within that, B never refuses wrongly.
    let store = Store::new(pool.clone());
    let (a, b) = (guard(&store, Arc::new(Unobserved)), guard(&store, Arc::new(Unobserved)));
    let limit = Limit::new(13.787281197370067, 4.450855888320927).unwrap();
    let bucket = key();
    let spend = |cost| Take::Single(Spend::new(Scope::SecretReadNode, bucket, cost, limit));
    let t0 = instant();
    let at = |micros| t0 + Duration::microseconds(micros);
    assert!(a.decide(spend(3.3524420578572096), at(0)).await.unwrap().is_granted());
    assert!(b.decide(spend(1.0), at(47_807)).await.unwrap().is_granted());
    assert!(a.decide(spend(0.1), at(228_711)).await.unwrap().is_granted());
    let refused = b.decide(spend(3.151710567702035), at(221_457)).await.unwrap();
    assert!(!refused.is_granted(), "B refuses from the row it learned");
    assert!(
        store.decide(spend(3.151710567702035), at(221_457)).await.unwrap().is_granted(),
        "the store admits"
    );
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn after_the_store_refuses_the_precheck_refuses_with_the_same_exact_wait_until_covered(pool: PgPool) {
    let store = Store::new(pool.clone());
    let observer = Arc::new(LastSource::default());
    let guard = guard(&store, observer.clone());
    let spend = Spend::new(Scope::IngestNode, key(), 2.0, Limit::new(4.0, 2.0).unwrap());
    let t0 = instant();
    assert!(guard.decide(Take::Single(spend), t0).await.unwrap().is_granted());

    // Empty, refilling at 4 a second: 2 tokens in 500 ms. Everything before is refused here,
    // with the wait that is left; the first instant that covers goes to the store.
    for (millis, wait) in [(0, 500), (100, 400), (499, 1)] {
        let at = t0 + Duration::milliseconds(millis);
        let Decision::Refused(refusal) = guard.decide(Take::Single(spend), at).await.unwrap() else {
            panic!()
        };
        assert_eq!(*observer.0.lock().unwrap(), Some(Source::Precheck), "at +{millis} ms");
        assert_eq!(refusal.retry_after, StdDuration::from_millis(wait), "at +{millis} ms");
    }
    let at = t0 + Duration::milliseconds(500);
    assert!(guard.decide(Take::Single(spend), at).await.unwrap().is_granted());
    assert_eq!(*observer.0.lock().unwrap(), Some(Source::Store));
}

#[tokio::test]
async fn each_take_fails_by_its_own_mode_and_a_pair_by_the_stricter_of_two() {
    let store = Store::new(unreachable_pool());
    let observer = Arc::new(LastSource::default());
    let guard = guard(&store, observer.clone());
    let now = instant();
    let failing = |scope, fail_mode| {
        let spend = Spend::new(scope, key(), 1.0, Limit::new(1.0, 3.0).unwrap());
        Spend { enforcement: Enforcement { fail_mode, ..Enforcement::STRICT }, ..spend }
    };

    // Local: a bucket of the same budget as the shared one, three back to back, then refused.
    let local = failing(Scope::SecretReadNode, FailMode::Static);
    let decisions: Vec<bool> =
        futures::future::join_all((0..4).map(|_| guard.decide(Take::Single(local), now)))
            .await
            .into_iter()
            .map(|d| d.unwrap().is_granted())
            .collect();
    assert_eq!(decisions.iter().filter(|granted| **granted).count(), 3, "{decisions:?}");
    assert!(guard.store_failing(), "three failures in a row open the circuit");

    // Open: admitted, however many, without a decision.
    let open = failing(Scope::IngestNode, FailMode::Open);
    for _ in 0..10 {
        assert!(guard.decide(Take::Single(open), now).await.unwrap().is_granted());
        assert_eq!(*observer.0.lock().unwrap(), Some(Source::Open));
    }

    // Closed: not decided, never refused, whatever the others did.
    let closed = failing(Scope::SecretReadDomain, FailMode::Closed);
    let answer = guard.decide(Take::Single(closed), now).await;
    assert!(matches!(&answer, Err(undecided) if undecided.is_store_failure()), "{answer:?}");

    // A pair fails by the stricter mode: open with local decides from the fallback (whose
    // local bucket is spent: refused), open with closed is not decided.
    let refused = guard.decide(Take::Pair(open, local), now).await.unwrap();
    assert!(!refused.is_granted());
    assert_eq!(*observer.0.lock().unwrap(), Some(Source::Fallback));
    let answer = guard.decide(Take::Pair(open, closed), now).await;
    assert!(matches!(&answer, Err(undecided) if undecided.is_store_failure()), "{answer:?}");
}

/// A guard with a short decision timeout, for tests that make the store stall or fail, and
/// room for `capacity` buckets.
fn guard_with_capacity(store: &Store, observer: Arc<dyn Observer>, capacity: u64) -> Guard {
    Guard::builder(store.clone())
        .decision_timeout(StdDuration::from_millis(200))
        .capacity(capacity)
        .observer(observer)
        .build()
}

/// `spend` failing by `fail_mode` when the store cannot answer.
fn failing_by(spend: Spend, fail_mode: FailMode) -> Spend {
    Spend { enforcement: Enforcement { fail_mode, ..Enforcement::STRICT }, ..spend }
}

/// Locks `plexsphere.rate_budgets` in a transaction of its own until the returned connection
/// commits: every take waits on it.
async fn lock_the_table(pool: &PgPool) -> sqlx::pool::PoolConnection<sqlx::Postgres> {
    let mut locker = pool.acquire().await.unwrap();
    sqlx::query("BEGIN").execute(&mut *locker).await.unwrap();
    sqlx::query("LOCK TABLE plexsphere.rate_budgets IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *locker)
        .await
        .unwrap();
    locker
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_probe_whose_caller_stops_waiting_leaves_the_next_take_to_probe(pool: PgPool) {
    // Issue 20, item 1. The probe marked the circuit as probing and only its answer cleared
    // the mark: a probe dropped mid-wait left every later OPEN or STATIC take deciding without
    // the store for good, however well the store answered again.
    let store = Store::new(pool.clone());
    let observer = Arc::new(LastSource::default());
    let guard = guard_with_capacity(&store, observer.clone(), 1000);
    let open = |cost| {
        Take::Single(failing_by(
            Spend::new(Scope::SecretReadNode, key(), cost, Limit::new(1.0, 5.0).unwrap()),
            FailMode::Open,
        ))
    };
    let now = instant();

    let mut locker = lock_the_table(&pool).await;
    for _ in 0..3 {
        assert!(guard.decide(open(1.0), now).await.unwrap().is_granted());
        assert_eq!(*observer.0.lock().unwrap(), Some(Source::Open), "timed out, admitted open");
    }
    assert!(guard.store_failing(), "three failures in a row open the circuit");

    // Every take skips the open circuit at once until a probe is due; the probe waits on the
    // table, and its caller gives up on it after 50 ms.
    let deadline = std::time::Instant::now() + StdDuration::from_secs(5);
    loop {
        assert!(std::time::Instant::now() < deadline, "no take probed the store");
        match tokio::time::timeout(StdDuration::from_millis(50), guard.decide(open(1.0), now)).await {
            Ok(decision) => assert!(decision.unwrap().is_granted()),
            Err(_) => break,
        }
    }
    sqlx::query("COMMIT").execute(&mut *locker).await.unwrap();

    // The store answers again, and the next take finds it so: it probes at once.
    assert!(guard.decide(open(1.0), now).await.unwrap().is_granted());
    assert_eq!(
        *observer.0.lock().unwrap(),
        Some(Source::Store),
        "the take after the dropped probe asks the store"
    );
    assert!(!guard.store_failing());
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn takes_dropped_before_the_store_answered_leave_nothing_behind_in_the_precheck(pool: PgPool) {
    // Issue 20, item 1. The pre-check reserved a take's cost in a local bucket on the way to
    // the store and refunded it only on the store's answer: takes whose callers stopped
    // waiting were never refunded, and the bucket refused what the store would admit.
    let store = Store::new(pool.clone());
    let observer = Arc::new(LastSource::default());
    let guard = Arc::new(guard(&store, observer.clone()));
    let bucket = key();
    let spend = Take::Single(Spend::new(Scope::SecretReadNode, bucket, 1.0, Limit::new(1.0, 10.0).unwrap()));
    let now = instant();
    assert!(guard.decide(spend.clone(), now).await.unwrap().is_granted(), "minted, 9 left");

    // Another transaction holds the row: the next take's call waits on it, and the twenty
    // after it queue behind that call; their callers give up before they are sent.
    let mut holder = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM plexsphere.rate_budgets WHERE bucket_key = $1 FOR UPDATE")
        .bind(bucket.as_uuid())
        .execute(&mut *holder)
        .await
        .unwrap();
    let on_the_wire = tokio::spawn({
        let (guard, spend) = (guard.clone(), spend.clone());
        async move { guard.decide(spend, now).await }
    });
    sessions_wait_on_a_lock(&pool, 1).await;
    for _ in 0..20 {
        let _ = tokio::time::timeout(StdDuration::from_millis(20), guard.decide(spend.clone(), now)).await;
    }
    holder.rollback().await.unwrap();
    assert!(on_the_wire.await.unwrap().unwrap().is_granted(), "8 left");

    // The twenty were never sent, so the bucket holds 8: exactly 8 more are granted, by the
    // store, and then the store's refusal is what the pre-check learns from.
    let mut granted = 0;
    for _ in 0..10 {
        let decision = guard.decide(spend.clone(), now).await.unwrap();
        if decision.is_granted() {
            granted += 1;
        } else {
            assert_eq!(granted, 8, "refused after {granted} grants: {decision:?}");
        }
    }
    assert_eq!(granted, 8);
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn the_precheck_counts_nothing_in_flight_that_the_store_may_refuse(pool: PgPool) {
    // Issue 20, item 4. The pre-check's local bucket (twice the burst) was debited for every
    // take in flight: two takes of 10 in flight against a burst of 10 left nothing for a
    // take of 1, although the store, refusing both (another replica had spent 5), grants it.
    let store = Store::new(pool.clone());
    let observer = Arc::new(LastSource::default());
    let guard = Arc::new(guard(&store, observer.clone()));
    let bucket = key();
    let limit = Limit::new(1.0, 10.0).unwrap();
    let take = move |cost| Take::Single(Spend::new(Scope::SecretReadNode, bucket, cost, limit));
    let t0 = instant();
    assert!(guard.decide(take(1.0), t0).await.unwrap().is_granted(), "the guard learns (9, t0)");
    // Ten seconds later the row it knows is full again. Another replica is spending 5 of it:
    // its transaction holds the row, not yet committed, so the snapshot still shows it full.
    let now = t0 + Duration::seconds(10);
    let mut holder = pool.begin().await.unwrap();
    sqlx::query("UPDATE plexsphere.rate_budgets SET tokens = 5, refilled_at = $2 WHERE bucket_key = $1")
        .bind(bucket.as_uuid())
        .bind(now)
        .execute(&mut *holder)
        .await
        .unwrap();
    let spawn = |cost| {
        let guard = guard.clone();
        tokio::spawn(async move { guard.decide(take(cost), now).await })
    };
    let tens = [spawn(10.0), spawn(10.0)];
    sessions_wait_on_a_lock(&pool, 1).await;
    let one = spawn(1.0);
    holder.commit().await.unwrap();
    for ten in tens {
        assert!(!ten.await.unwrap().unwrap().is_granted(), "5 cannot cover 10");
    }
    let decision = one.await.unwrap().unwrap();
    assert!(decision.is_granted(), "5 covers 1: {decision:?}");
}

#[tokio::test]
async fn the_fallback_keeps_its_buckets_through_whatever_the_precheck_forgets() {
    // Issue 20, item 2. The fallback's bucket lived in the pre-check's entry, so a reset, a
    // rule that may have grown, a reconnected listener or an eviction handed the bucket
    // another burst on this replica in the middle of an outage.
    let store = Store::new(unreachable_pool());
    let observer = Arc::new(LastSource::default());
    let guard = guard_with_capacity(&store, observer.clone(), 1000);
    let now = instant();
    let bucket = key();
    let local = Take::Single(failing_by(
        Spend::new(Scope::SecretReadNode, bucket, 1.0, Limit::new(1.0, 3.0).unwrap()),
        FailMode::Static,
    ));
    for _ in 0..3 {
        assert!(guard.decide(local.clone(), now).await.unwrap().is_granted());
        assert_eq!(*observer.0.lock().unwrap(), Some(Source::Fallback));
    }
    for forget in [
        &(|guard: &Guard| guard.forget(Scope::SecretReadNode, bucket)) as &dyn Fn(&Guard),
        &|guard: &Guard| guard.forget_every_bucket_of(Scope::SecretReadNode),
        &|guard: &Guard| guard.forget_all(),
    ] {
        forget(&guard);
        let decision = guard.decide(local.clone(), now).await.unwrap();
        assert!(!decision.is_granted(), "the fallback's bucket is spent: {decision:?}");
        assert_eq!(*observer.0.lock().unwrap(), Some(Source::Fallback));
    }
    // Refilled, it is what a new bucket would be.
    assert!(guard.decide(local, now + Duration::seconds(1)).await.unwrap().is_granted());
}

#[tokio::test]
async fn a_fallback_at_capacity_forgets_only_full_buckets_and_decides_no_other() {
    // Issue 20, item 2: eviction. The pre-check remembers two buckets; the fallback keeps
    // every bucket that is not full, up to two, and a take of a third is not decided (the
    // store's failure, a 500) rather than decided from a bucket that would start full.
    let store = Store::new(unreachable_pool());
    let observer = Arc::new(LastSource::default());
    let guard = guard_with_capacity(&store, observer.clone(), 2);
    let now = instant();
    let local = |bucket| {
        Take::Single(failing_by(
            Spend::new(Scope::SecretReadNode, bucket, 3.0, Limit::new(1.0, 3.0).unwrap()),
            FailMode::Static,
        ))
    };
    let (a, b, c) = (key(), key(), key());
    assert!(guard.decide(local(a), now).await.unwrap().is_granted());
    assert!(guard.decide(local(b), now).await.unwrap().is_granted());
    let undecided = guard.decide(local(c), now).await;
    assert!(matches!(&undecided, Err(undecided) if undecided.is_store_failure()), "{undecided:?}");
    assert!(!guard.decide(local(a), now).await.unwrap().is_granted(), "a is still spent");
    // Three seconds on, a and b are full: forgotten, and c has room.
    let later = now + Duration::seconds(3);
    assert!(guard.decide(local(c), later).await.unwrap().is_granted());
    assert!(!guard.decide(local(c), later).await.unwrap().is_granted());
}

#[tokio::test]
async fn a_pair_with_a_free_side_or_one_bucket_twice_decides_by_its_fail_mode() {
    // Issue 20, item 4. Such pairs went to the store without the decision timeout, the
    // circuit or the fail mode: with the store down, a STATIC pair was a 500.
    let store = Store::new(unreachable_pool());
    let observer = Arc::new(LastSource::default());
    let guard = guard_with_capacity(&store, observer.clone(), 1000);
    let now = instant();
    let spend = |bucket, cost| {
        failing_by(
            Spend::new(Scope::SecretReadNode, bucket, cost, Limit::new(1.0, 3.0).unwrap()),
            FailMode::Static,
        )
    };
    let (a, b) = (key(), key());
    let free_side = Take::Pair(spend(b, 0.0), spend(a, 1.0));
    for _ in 0..3 {
        let decision = guard.decide(free_side.clone(), now).await.unwrap();
        assert!(decision.is_granted(), "{decision:?}");
        assert_eq!(*observer.0.lock().unwrap(), Some(Source::Fallback));
    }
    let Decision::Refused(refusal) = guard.decide(free_side, now).await.unwrap() else { panic!() };
    assert_eq!(refusal.which, ratebudget::Which::Second, "the refused side is named as the caller named it");

    let twice = Take::Pair(spend(b, 1.0), spend(b, 1.0));
    assert!(guard.decide(twice.clone(), now).await.unwrap().is_granted());
    assert_eq!(*observer.0.lock().unwrap(), Some(Source::Fallback));
    assert!(!guard.decide(twice, now).await.unwrap().is_granted(), "2 of 3 spent, 2 more do not fit");
}
