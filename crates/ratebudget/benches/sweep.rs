//! The idle sweep at scale: a million idle buckets deleted in batches, with how long each
//! batch statement ran (and so held its row locks) and how long the whole sweep took.
//!
//! ```text
//! cargo bench -p ratebudget --bench sweep -- --database-url postgres://postgres@127.0.0.1:5432/plexsphere_bench
//! ```
//!
//! It replaces the table's contents (run it on the benchmark database, never a real one):
//! a million rows idle for two hours, and ten thousand taken a minute ago that must stay.

use std::str::FromStr;
use std::time::{Duration, Instant};

use chrono::{TimeDelta, Utc};
use ratebudget::Store;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

const IDLE_ROWS: i64 = 1_000_000;
const FRESH_ROWS: i64 = 10_000;

#[allow(clippy::print_stdout)]
fn main() {
    let mut database_url = "postgres://postgres@127.0.0.1:5432/plexsphere_bench".to_owned();
    let mut words = std::env::args().skip(1);
    while let Some(word) = words.next() {
        match word.as_str() {
            "--database-url" => database_url = words.next().expect("--database-url needs a value"),
            "--bench" => {}
            other => panic!("unknown argument {other:?}"),
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async {
        let options = PgConnectOptions::from_str(&database_url).unwrap();
        let pool = PgPoolOptions::new().max_connections(2).connect_with(options).await.unwrap();
        let now = Utc::now();
        sqlx::query("TRUNCATE plexsphere.rate_budgets").execute(&pool).await.unwrap();
        sqlx::query(
            "INSERT INTO plexsphere.rate_budgets (scope, bucket_key, tokens, refilled_at)
             SELECT 'ingest_node', gen_random_uuid(), 1, $1 - (i % 3600) * interval '1 second'
             FROM generate_series(1, $2) AS i",
        )
        .bind(now - TimeDelta::hours(2))
        .bind(IDLE_ROWS)
        .execute(&pool)
        .await
        .unwrap();
        sqlx::query(
            "INSERT INTO plexsphere.rate_budgets (scope, bucket_key, tokens, refilled_at)
             SELECT 'ingest_domain', gen_random_uuid(), 1, $1 FROM generate_series(1, $2)",
        )
        .bind(now - TimeDelta::minutes(1))
        .bind(FRESH_ROWS)
        .execute(&pool)
        .await
        .unwrap();
        sqlx::query("VACUUM ANALYZE plexsphere.rate_budgets").execute(&pool).await.unwrap();

        let store = Store::new(pool.clone());
        let before = now - TimeDelta::hours(1);
        let started = Instant::now();
        let mut batches: Vec<Duration> = Vec::new();
        let mut sweep = store.sweep_idle(before);
        loop {
            let began = Instant::now();
            let Some(batch) = sweep.next_batch().await else { break };
            batch.unwrap();
            batches.push(began.elapsed());
        }
        let deleted = sweep.deleted();
        let total = started.elapsed();
        let left: i64 = sqlx::query_scalar("SELECT count(*) FROM plexsphere.rate_budgets").fetch_one(&pool).await.unwrap();
        assert_eq!(deleted, IDLE_ROWS as u64);
        assert_eq!(left, FRESH_ROWS);
        let mut sorted = batches.clone();
        sorted.sort();
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        println!(
            "sweep: {deleted} idle rows deleted in {} batches of {} in {:.1} s; per batch: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms (first {:.1} ms, last full {:.1} ms); {left} fresh rows kept",
            batches.len(),
            Store::DELETE_IDLE_BATCH,
            total.as_secs_f64(),
            ms(sorted[sorted.len() / 2]),
            ms(sorted[sorted.len() * 99 / 100]),
            ms(*sorted.last().unwrap()),
            ms(batches[0]),
            ms(batches[batches.len().saturating_sub(2)]),
        );
    });
}
