//! Named (GCRA) limiters against a real PostgreSQL: the same decisions as the governor crate,
//! exact under concurrency, a key of any length one fixed-size row, resets and expiry.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration as StdDuration;

use chrono::Duration;
use governor::clock::FakeRelativeClock;
use proptest::prelude::*;
use ratebudget::{Decider, Decision, Limit, LimiterName, NamedKey, NamedSpend, Store, Take};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;
use tokio::sync::Barrier;

use crate::support::helpers::{instant, FreshDatabase};

fn limiter() -> LimiterName {
    LimiterName::new("login_attempt").unwrap()
}

fn spend(key: &[u8], cells: u32, limit: Limit) -> Take {
    Take::Named(NamedSpend {
        limiter: limiter(),
        key: NamedKey::of(limiter(), key),
        cells,
        limit,
        enforcement: ratebudget::Enforcement::STRICT,
    })
}

/// What a decision says, in governor's three answers.
#[derive(Debug, PartialEq)]
enum Answer {
    Allowed,
    NotUntil(StdDuration),
    Never,
}

fn answer(decision: &Decision) -> Answer {
    match decision {
        Decision::Granted(_) => Answer::Allowed,
        Decision::Refused(refusal) => Answer::NotUntil(refusal.retry_after),
        Decision::InsufficientCapacity(_) => Answer::Never,
    }
}

#[test]
fn decides_exactly_as_governor_for_the_same_quota_and_arrivals() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let (database, pool) = runtime.block_on(FreshDatabase::create());
    let store = Store::new(pool.clone());
    let config = ProptestConfig { cases: 64, ..ProptestConfig::default() };
    proptest!(config, |(
        period_us in prop_oneof![1u64..50, 1_000u64..2_000_000],
        burst in 1u32..12,
        arrivals in prop::collection::vec((prop_oneof![Just(0u64), 0u64..3_000_000], 1u32..14), 1..40),
    )| {
        let per_second = 1e6 / period_us as f64;
        // Some quotas would take over an hour to refill; the store refuses those at build.
        prop_assume!(f64::from(burst) <= per_second * 3600.0);
        let limit = Limit::new(per_second, f64::from(burst)).unwrap();
        let quota = governor::Quota::with_period(StdDuration::from_micros(period_us))
            .unwrap()
            .allow_burst(NonZeroU32::new(burst).unwrap());
        let clock = FakeRelativeClock::default();
        let theirs = governor::RateLimiter::direct_with_clock(quota, clock.clone());
        let key = uuid::Uuid::new_v4();
        let mut now = instant();
        for (i, (step_us, cells)) in arrivals.into_iter().enumerate() {
            clock.advance(StdDuration::from_micros(step_us));
            now += Duration::microseconds(step_us as i64);
            let expected = match theirs.check_n(NonZeroU32::new(cells).unwrap()) {
                Ok(Ok(())) => Answer::Allowed,
                Ok(Err(not_until)) => Answer::NotUntil(not_until.wait_time_from(governor::clock::Clock::now(&clock))),
                Err(_) => Answer::Never,
            };
            let ours = answer(&runtime.block_on(store.decide(spend(key.as_bytes(), cells, limit), now)).unwrap());
            prop_assert_eq!(ours, expected, "arrival {}: {} cells at +{} µs", i, cells, step_us);
        }
    });
    runtime.block_on(database.drop_database(pool));
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_hundred_decisions_from_two_pools_at_one_instant_grant_exactly_the_burst(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let open = || PgPoolOptions::new().max_connections(8).connect_with(connect.clone());
    let stores = [Store::new(open().await.unwrap()), Store::new(open().await.unwrap())];
    for burst in [1.0, 7.0, 50.0] {
        let limit = Limit::new(1.0, burst).unwrap();
        let key = uuid::Uuid::new_v4();
        let barrier = Arc::new(Barrier::new(100));
        let tasks: Vec<_> = (0..100)
            .map(|i| {
                let (store, barrier) = (stores[i % 2].clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    store.decide(spend(key.as_bytes(), 1, limit), instant()).await.unwrap().is_granted()
                })
            })
            .collect();
        let mut granted = 0;
        for task in tasks {
            granted += usize::from(task.await.unwrap());
        }
        assert_eq!(granted as f64, burst);
    }
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_ten_kilobyte_key_costs_the_same_row_as_a_three_byte_one(pool: PgPool) {
    let store = Store::new(pool.clone());
    let limit = Limit::new(1.0, 5.0).unwrap();
    store.decide(spend(b"abc", 1, limit), instant()).await.unwrap();
    store.decide(spend(&[b'x'; 10_240], 1, limit), instant()).await.unwrap();
    let sizes: Vec<(i32, i32)> = sqlx::query_as(
        "SELECT octet_length(key_hash), pg_column_size(l.*) FROM plexsphere.named_limits AS l ORDER BY 2",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(sizes.len(), 2);
    assert_eq!(sizes[0], sizes[1], "{sizes:?}");
    assert_eq!(sizes[0].0, 32);
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_refusal_writes_nothing_and_a_reset_forgets_the_key(pool: PgPool) {
    let store = Store::new(pool.clone());
    let limit = Limit::new(0.5, 2.0).unwrap();
    let at = instant();
    for _ in 0..2 {
        assert!(store.decide(spend(b"10.0.0.1", 1, limit), at).await.unwrap().is_granted());
    }
    let tat = || async {
        sqlx::query_scalar::<_, i64>("SELECT tat_us FROM plexsphere.named_limits")
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    let before = tat().await;
    let Decision::Refused(refusal) = store.decide(spend(b"10.0.0.1", 1, limit), at).await.unwrap() else {
        panic!()
    };
    assert_eq!(refusal.retry_after, StdDuration::from_secs(2), "one cell every two seconds");
    assert_eq!(tat().await, before, "a refusal leaves the TAT alone");

    let key = NamedKey::of(limiter(), b"10.0.0.1");
    assert!(store.reset_named(limiter(), key).await.unwrap());
    assert!(!store.reset_named(limiter(), key).await.unwrap());
    assert!(
        store.decide(spend(b"10.0.0.1", 1, limit), at).await.unwrap().is_granted(),
        "a full budget again"
    );
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn delete_expired_removes_only_keys_back_to_a_full_budget(pool: PgPool) {
    let store = Store::new(pool.clone());
    let limit = Limit::new(1.0, 3.0).unwrap();
    let t0 = instant();
    store.decide(spend(b"spent-once", 1, limit), t0).await.unwrap();
    for _ in 0..3 {
        store.decide(spend(b"spent-out", 1, limit), t0).await.unwrap();
    }
    // One second later the first key is full again (its TAT has passed); the second is not.
    assert_eq!(store.delete_expired(100, t0 + Duration::seconds(1)).await.unwrap(), 1);
    assert_eq!(store.delete_expired(100, t0 + Duration::seconds(1)).await.unwrap(), 0);
    assert!(!store
        .decide(spend(b"spent-out", 1, limit), t0 + Duration::seconds(1) - Duration::microseconds(1))
        .await
        .unwrap()
        .is_granted());
    assert_eq!(store.delete_expired(100, t0 + Duration::seconds(3)).await.unwrap(), 1);
}
