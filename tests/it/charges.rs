//! Charges and peeks against a real PostgreSQL (docs/adr/0040): a charge the bucket cannot
//! cover is accepted and leaves it in debt (tokens 0, refilled_at ahead of now), which every
//! take refuses, with the exact wait, until refill has repaid it; charges are exact under
//! concurrency with takes; a lease's refund never credits a bucket in debt; the sweep keeps a
//! bucket in debt; a peek reads without writing.

use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};
use ratebudget::{Decider, Fill, Key, LeaseRequest, Limit, Name, Spend, Store, Take};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;
use tokio::sync::Barrier;

use crate::support::helpers::{instant, key};

fn tokens_budget() -> Name {
    Name::new("llm_tokens").unwrap()
}

/// The stored (tokens, refilled_at) of one bucket, or None when it has no row.
async fn row(pool: &PgPool, key: Key) -> Option<(f64, DateTime<Utc>)> {
    sqlx::query_as(
        "SELECT tokens, refilled_at FROM plexsphere.rate_budgets WHERE scope = $1 AND bucket_key = $2",
    )
    .bind(tokens_budget().as_str())
    .bind(key.as_uuid())
    .fetch_optional(pool)
    .await
    .unwrap()
}

/// 1000 tokens a minute, burst 1000: an hour's worth of an LLM's tokens, say.
fn per_minute() -> Limit {
    Limit::new(1000.0 / 60.0, 1000.0).unwrap()
}

fn spend(key: Key, cost: f64, limit: Limit) -> Spend {
    Spend::new(tokens_budget(), key, cost, limit)
}

async fn take(store: &Store, key: Key, cost: f64, limit: Limit, now: DateTime<Utc>) -> ratebudget::Decision {
    store.decide(Take::Single(spend(key, cost, limit)), now).await.unwrap()
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_charge_beyond_the_level_leaves_the_bucket_in_debt_until_refill_repays_it(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let pool = PgPool::connect_with(connect).await.unwrap();
    let store = Store::new(pool.clone());
    let (bucket, now) = (key(), instant());
    // Covered: debited as a take is.
    let charged = store.charge(spend(bucket, 300.0, per_minute()), now).await.unwrap();
    assert_eq!(charged, Fill { tokens: 700.0, refilled_at: now });
    // Not covered: 1200 of 700 leaves 500 of debt, 30 s of refill at 1000 a minute; the row
    // holds no negative tokens, and its refilled_at is ahead of now by the debt's time.
    let charged = store.charge(spend(bucket, 1200.0, per_minute()), now).await.unwrap();
    let repaid = now + Duration::seconds(30);
    assert_eq!(charged, Fill { tokens: 0.0, refilled_at: repaid });
    assert_eq!(row(&pool, bucket).await, Some((0.0, repaid)));
    assert_eq!(store.peek(spend(bucket, 1.0, per_minute()), now).await.unwrap(), charged);

    // Every take refuses until the debt is repaid and a token refilled: 30 s and 60 ms.
    let refused = take(&store, bucket, 1.0, per_minute(), now).await;
    let ratebudget::Decision::Refused(refusal) = refused else { panic!("{refused:?}") };
    assert_eq!(refusal.retry_after, std::time::Duration::from_millis(30_060));
    assert_eq!(refusal.judged, Some(charged));
    let almost = repaid + Duration::microseconds(59_999);
    assert!(!take(&store, bucket, 1.0, per_minute(), almost).await.is_granted());
    assert!(take(&store, bucket, 1.0, per_minute(), repaid + Duration::milliseconds(60)).await.is_granted());
    let (tokens, refilled_at) = row(&pool, bucket).await.unwrap();
    assert!(
        tokens.abs() < 1e-9 && refilled_at == repaid + Duration::milliseconds(60),
        "{tokens} {refilled_at}"
    );
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn debts_add_up_a_missing_bucket_is_charged_full_and_no_debt_outlasts_a_year_and_a_day(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let pool = PgPool::connect_with(connect).await.unwrap();
    let store = Store::new(pool.clone());
    let (bucket, now) = (key(), instant());
    // A missing bucket is minted full: 1500 of 1000 is 500 of debt.
    let first = store.charge(spend(bucket, 1500.0, per_minute()), now).await.unwrap();
    assert_eq!(first, Fill { tokens: 0.0, refilled_at: now + Duration::seconds(30) });
    // Charged again while in debt (the level is 0 until then), the debt grows: 600 more.
    let later = now + Duration::seconds(10);
    let second = store.charge(spend(bucket, 600.0, per_minute()), later).await.unwrap();
    assert_eq!(second, Fill { tokens: 0.0, refilled_at: now + Duration::seconds(66) });
    // However large the cost, a bucket is closed for at most a year and a day from now.
    let huge = store.charge(spend(bucket, 1e300, per_minute()), later).await.unwrap();
    assert_eq!(huge, Fill { tokens: 0.0, refilled_at: later + Duration::days(366) });
    let again = store.charge(spend(bucket, 1e300, per_minute()), later).await.unwrap();
    assert_eq!(again, huge, "capped at a year and a day from now, not from the debt");
    // Bad input never reaches the table.
    assert!(store.charge(spend(key(), f64::INFINITY, per_minute()), now).await.is_err());
    assert!(store.charge(spend(key(), -1.0, per_minute()), now).await.is_err());
    let count: i64 =
        sqlx::query_scalar("SELECT count(*) FROM plexsphere.rate_budgets").fetch_one(&pool).await.unwrap();
    assert_eq!(count, 1);
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_peek_reads_the_bucket_and_writes_nothing(_: PgPoolOptions, connect: PgConnectOptions) {
    let pool = PgPool::connect_with(connect).await.unwrap();
    let store = Store::new(pool.clone());
    let (bucket, now) = (key(), instant());
    // No row: full, and still no row.
    let peeked = store.peek(spend(bucket, 0.0, per_minute()), now).await.unwrap();
    assert_eq!(peeked, Fill { tokens: 1000.0, refilled_at: now });
    assert_eq!(row(&pool, bucket).await, None);
    assert!(take(&store, bucket, 400.0, per_minute(), now).await.is_granted());
    let later = now + Duration::seconds(6);
    let peeked = store.peek(spend(bucket, 0.0, per_minute()), later).await.unwrap();
    assert_eq!(peeked, Fill { tokens: 600.0, refilled_at: now });
    assert_eq!(per_minute().level(peeked, later), 700.0);
    assert_eq!(row(&pool, bucket).await, Some((600.0, now)));
}

/// Charges and takes of one bucket at one instant, all at once: the debt is exactly what the
/// charges and the granted takes spent beyond the burst, and no take was granted once the
/// level could not cover it.
#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn charges_are_exact_under_concurrency_with_takes(_: PgPoolOptions, connect: PgConnectOptions) {
    let pool = PgPoolOptions::new().max_connections(8).connect_with(connect).await.unwrap();
    let store = Store::new(pool.clone());
    let (bucket, now) = (key(), instant());
    // 10 a second, burst 1000; 20 charges of 100 and 200 takes of 1, interleaved.
    let limit = Limit::new(10.0, 1000.0).unwrap();
    let barrier = Arc::new(Barrier::new(220));
    let mut tasks = Vec::new();
    for i in 0..220 {
        let (store, barrier) = (store.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            if i % 11 == 0 {
                store.charge(spend(bucket, 100.0, limit), now).await.unwrap();
                0
            } else {
                u64::from(take(&store, bucket, 1.0, limit, now).await.is_granted())
            }
        }));
    }
    let mut granted = 0;
    for task in tasks {
        granted += task.await.unwrap();
    }
    let spent = 20.0 * 100.0 + granted as f64;
    let (tokens, refilled_at) = row(&pool, bucket).await.unwrap();
    assert_eq!(tokens, 0.0);
    // Each debt is a whole number of tokens at 10 a second: whole tenths of a second, exact.
    let debt_ms = (spent - 1000.0) / 10.0 * 1000.0;
    assert_eq!(refilled_at, now + Duration::milliseconds(debt_ms as i64), "{granted} takes granted");
    assert!(granted <= 200);
}

/// A lease made before a charge put its bucket in debt gives back nothing: its refund would
/// be tokens a bucket in debt could grant at once.
#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_refund_never_credits_a_bucket_in_debt(_: PgPoolOptions, connect: PgConnectOptions) {
    let pool = PgPool::connect_with(connect).await.unwrap();
    let store = Store::new(pool.clone());
    let (bucket, now) = (key(), instant());
    let limit = Limit::new(10.0, 1000.0).unwrap();
    let leased = store
        .lease(
            LeaseRequest {
                spend: spend(bucket, 1.0, limit),
                at_least: 1.0,
                at_most: 100.0,
                refund: 0.0,
                refund_serial: 0,
            },
            now,
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(leased.leased, 100.0);
    // 900 left; 1400 charged: 500 of debt, 50 s.
    let charged = store.charge(spend(bucket, 1400.0, limit), now).await.unwrap();
    assert_eq!(charged, Fill { tokens: 0.0, refilled_at: now + Duration::seconds(50) });
    let refund = LeaseRequest {
        spend: spend(bucket, 0.0, limit),
        at_least: 0.0,
        at_most: 0.0,
        refund: 100.0,
        refund_serial: leased.serial,
    };
    let refunded = store.lease(refund, now).await.unwrap().unwrap();
    assert_eq!(refunded.refunded, 0.0);
    assert_eq!(row(&pool, bucket).await, Some((0.0, now + Duration::seconds(50))));
}

/// The sweep deletes only full buckets: one in debt is not idle until refill has repaid its
/// debt and filled it (its refilled_at is ahead of now).
#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn the_sweep_keeps_a_bucket_in_debt(_: PgPoolOptions, connect: PgConnectOptions) {
    let pool = PgPool::connect_with(connect).await.unwrap();
    let store = Store::new(pool.clone());
    let (indebted, idle, now) = (key(), key(), instant());
    let limit = Limit::new(10.0, 1000.0).unwrap();
    store.charge(spend(indebted, 2000.0, limit), now).await.unwrap();
    assert!(take(&store, idle, 1.0, limit, now).await.is_granted());
    // The sweep of an hour later deletes buckets last refilled before now (the retention is
    // the hour every such limit refills within): the idle one, not the one in debt, whose
    // refilled_at is 100 s ahead; it goes with the sweep an hour after that, when it is full.
    assert_eq!(store.delete_idle(now + Duration::milliseconds(1)).await.unwrap(), 1);
    assert!(row(&pool, indebted).await.is_some());
    assert_eq!(row(&pool, idle).await, None);
    assert_eq!(store.delete_idle(now + Duration::seconds(100)).await.unwrap(), 0);
    assert_eq!(store.delete_idle(now + Duration::milliseconds(100_001)).await.unwrap(), 1);
    assert_eq!(row(&pool, indebted).await, None);
}
