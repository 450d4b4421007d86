//! The guard in front of the store: its pre-check refuses nothing the shared bucket would
//! admit (checked against the store itself with random workloads), a flood costs the store
//! next to nothing, and the fallback decides when the store cannot.

use std::sync::{Arc, Mutex};
use std::time::Duration as StdDuration;

use chrono::{DateTime, Duration, Utc};
use proptest::prelude::*;
use ratebudget::{
    Decider, Decision, Enforcement, FailMode, Guard, GuardConfig, Key, Limit, Observer, Scope, Source, Spend,
    Store, Take, Undecided, Unobserved,
};
use sqlx::PgPool;

use crate::support::helpers::{instant, key, unreachable_pool, FreshDatabase};

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
    let config = GuardConfig { decision_timeout: StdDuration::from_secs(5), capacity: 1000 };
    Guard::new(Arc::new(store.clone()), config, observer)
}

/// What the store's own arithmetic says a bucket holds at `now`, read without writing; a
/// missing bucket holds its burst (the next take mints it full).
async fn shared_level(pool: &PgPool, spend: Spend, now: DateTime<Utc>) -> f64 {
    let level: Option<f64> = sqlx::query_scalar(
        "SELECT LEAST($3::float8, tokens + GREATEST(0::float8, date_part('epoch', $5::timestamptz - refilled_at)) * $4::float8)
         FROM plexsphere.rate_budgets WHERE scope = $1 AND bucket_key = $2",
    )
    .bind(spend.scope.as_str())
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
                    let decision = runtime.block_on(guards[via].decide(take, now)).unwrap();
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

#[sqlx::test(migrator = "app::MIGRATOR")]
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

#[sqlx::test(migrator = "app::MIGRATOR")]
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
    let local = failing(Scope::SecretReadNode, FailMode::Local);
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
