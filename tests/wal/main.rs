//! Refusals write nothing: measured on the WAL position.
//!
//! This is a binary of its own because `pg_current_wal_lsn()` is cluster-wide: cargo runs
//! test binaries one after another, so while this one runs no other test writes WAL.

use chrono::{TimeZone, Utc};
use ratebudget::{Budget, Decider, Key, Limit, LimiterName, NamedKey, NamedSpend, Scope, Store, Take};
use sqlx::PgPool;

/// The reference's statement without the snapshot guard: a plain upsert whose conflict arm
/// refuses. It is here to show what the measurement sees when refusals do write.
const PLAIN_UPSERT: &str = "
INSERT INTO plexsphere.rate_budgets AS b (scope, bucket_key, tokens, refilled_at)
VALUES ($1, $2, $5 - $3, $6)
ON CONFLICT (scope, bucket_key) DO UPDATE
SET tokens = LEAST($5, b.tokens + GREATEST(0, date_part('epoch', $6 - b.refilled_at)) * $4) - $3,
    refilled_at = GREATEST(b.refilled_at, $6)
WHERE LEAST($5, b.tokens + GREATEST(0, date_part('epoch', $6 - b.refilled_at)) * $4) >= $3";

const REFUSALS: u64 = 1_000;

async fn wal_position(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint")
        .fetch_one(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_thousand_refusals_on_an_exhausted_bucket_write_next_to_no_wal(pool: PgPool) {
    let store = Store::new(pool.clone());
    let now = Utc.with_ymd_and_hms(2026, 11, 30, 12, 0, 0).unwrap();
    // Every take is at one instant, so the bucket cannot refill whatever its rate.
    let never_refills = Budget { per_second: 1.0, burst: 3.0 };
    let bucket = Key::from(uuid::Uuid::new_v4());
    assert!(store.take(Scope::IngestDomain, bucket, 3.0, never_refills, now).await.unwrap());

    // The position is cluster-wide, so a checkpoint or autovacuum landing inside a window
    // would count too. Three windows, and the quietest one counts: refusals that wrote would
    // show in all three.
    let mut guarded = i64::MAX;
    for _ in 0..3 {
        let before = wal_position(&pool).await;
        for _ in 0..REFUSALS {
            assert!(!store.take(Scope::IngestDomain, bucket, 1.0, never_refills, now).await.unwrap());
        }
        guarded = guarded.min(wal_position(&pool).await - before);
    }

    let before = wal_position(&pool).await;
    for _ in 0..REFUSALS {
        let result = sqlx::query(PLAIN_UPSERT)
            .bind(Scope::IngestDomain.as_str())
            .bind(bucket.as_uuid())
            .bind(1.0f64)
            .bind(never_refills.per_second)
            .bind(never_refills.burst)
            .bind(now)
            .execute(&pool)
            .await
            .unwrap();
        assert_eq!(result.rows_affected(), 0, "the plain upsert refuses too");
    }
    let plain = wal_position(&pool).await - before;

    // A named (GCRA) limiter's refusals go through the same kind of guard.
    let limiter = LimiterName::new("wal_check").unwrap();
    let named = |key: &str| {
        Take::Named(NamedSpend {
            limiter,
            key: NamedKey::of(limiter, key.as_bytes()),
            cells: 1,
            limit: Limit::new(1.0, 3.0).unwrap(),
            enforcement: ratebudget::Enforcement::STRICT,
        })
    };
    for _ in 0..3 {
        assert!(store.decide(named("10.0.0.1"), now).await.unwrap().is_granted());
    }
    let mut named_guarded = i64::MAX;
    for _ in 0..3 {
        let before = wal_position(&pool).await;
        for _ in 0..REFUSALS {
            assert!(!store.decide(named("10.0.0.1"), now).await.unwrap().is_granted());
        }
        named_guarded = named_guarded.min(wal_position(&pool).await - before);
    }

    eprintln!(
        "WAL for {REFUSALS} refusals: guarded take {guarded} bytes, named limiter {named_guarded} bytes, plain upsert {plain} bytes"
    );
    // A write per refusal is at least a lock record and a commit record each.
    assert!(plain >= 50 * REFUSALS as i64, "the measurement sees writes: {plain} bytes");
    assert!(guarded * 20 < plain, "guarded {guarded} bytes against plain {plain} bytes");
    assert!(named_guarded * 20 < plain, "named {named_guarded} bytes against plain {plain} bytes");
}
