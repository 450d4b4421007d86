//! A decision reads its own buckets and no others, whatever the planner believed when it
//! planned it.
//!
//! PostgreSQL keeps a statement's generic plan for the life of a connection: a prepared
//! statement's (take.sql, the lease), and those of every statement inside the decision
//! functions (PL/pgSQL plans each once per session). One planned while `rate_budgets` looked
//! empty (a fresh deployment; a table the sweep emptied and ANALYZE saw so) is kept after the
//! table fills, until the next ANALYZE of it. A fresh replica's coalesced calls over distinct
//! buckets were planned as a hash join over a sequential scan of the whole table, and read
//! every row of it on every call: 3.7 ms a call of twenty takes once it held 50,000 rows,
//! growing with the table, for as long as autovacuum took to analyze it (bench/decide.sh's
//! random tenants, BENCHMARKS.md section 8).
//!
//! The tests plan every decision statement on one connection while the table is empty, with
//! autovacuum off for it so that nothing replans them, fill the table, and decide again on
//! that connection: PostgreSQL's own counters of rows read by sequential scans and of index
//! entries read must stay below the table's size, which one scan of it would reach.

use chrono::{DateTime, Duration, Utc};
use ratebudget::{
    Decider, Enforcement, Key, LeaseRequest, Limit, LimiterName, NamedKey, NamedSpend, Scope, Spend, Store,
    Take,
};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;

use crate::support::helpers::{instant, key};
use crate::support::replicas::eventually;

/// Rows in each filled table, half of `rate_budgets`' under each scope the decisions use: one
/// scan of a table, or of one scope's part of an index, reads at least `FILLED / 2`; every
/// decision of the test together, a few thousand.
const FILLED: i64 = 200_000;

/// The tables decisions read: token buckets, and named (GCRA) limiters' cells.
const TABLES: [&str; 2] = ["plexsphere.rate_budgets", "plexsphere.named_limits"];

/// A decision of every shape the store sends, each a statement of its own: a lone take
/// (take.sql), a lone pair and a lone take of many buckets (the takes function), a coalesced
/// call on one bucket, one over distinct buckets, one mixing pairs, takes of many and repeats
/// (the takes function), a named limiter's take (decide_named.sql, on `named_limits`), and a
/// lease.
/// Returns the number of takes decided. Each decision must have been answered.
async fn decide_every_shape(store: &Store, at: DateTime<Utc>) -> u64 {
    let limit = Limit::new(1_000.0, 1_000.0).unwrap();
    let single = |key| Take::Single(Spend::new(Scope::IngestNode, key, 1.0, limit));
    let pair = |first, second| {
        Take::Pair(
            Spend::new(Scope::IngestNode, first, 1.0, limit),
            Spend::new(Scope::IngestDomain, second, 1.0, limit),
        )
    };
    let login_attempt = LimiterName::new("login_attempt").unwrap();
    let named = |key: &[u8]| {
        Take::Named(NamedSpend {
            limiter: login_attempt,
            key: NamedKey::of(login_attempt, key),
            cells: 1,
            limit,
            enforcement: Enforcement::STRICT,
        })
    };
    let hot = key();
    let (first, second) = (key(), key());
    let many = |keys: &[Key]| {
        Take::many(
            keys.iter().map(|key| Spend::new(Scope::IngestDomain, *key, 1.0, limit)).collect::<Vec<_>>(),
        )
    };
    let calls: Vec<Vec<(Take, DateTime<Utc>)>> = vec![
        vec![(single(key()), at)],
        vec![(pair(key(), key()), at)],
        vec![(many(&(0..8).map(|_| key()).collect::<Vec<_>>()), at)],
        vec![(many(&[key(), second, key()]), at), (pair(key(), second), at), (single(key()), at)],
        (0..8).map(|_| (single(hot), at)).collect(),
        (0..16).map(|_| (single(key()), at)).collect(),
        vec![(pair(first, second), at), (single(first), at), (pair(key(), second), at), (single(key()), at)],
        vec![(named(uuid::Uuid::new_v4().as_bytes()), at)],
    ];
    let mut takes = 0;
    for call in calls {
        for decision in store.decide_all(&call).await {
            assert!(decision.expect("every decision is answered").is_granted());
        }
        takes += call.len() as u64;
    }
    let lease = LeaseRequest {
        spend: Spend::new(Scope::IngestNode, key(), 1.0, limit),
        at_least: 1.0,
        at_most: 10.0,
        refund: 0.0,
        refund_serial: 0,
    };
    assert!(store.lease(lease, at).await.expect("the lease is answered").is_some());
    takes + 1
}

/// Rows of `rate_budgets` and `named_limits` read by sequential scans and index entries read
/// from their indexes, by every session of this test's database but `observer`, once they
/// have all ended.
async fn rows_read(observer: &PgPool) -> (i64, i64) {
    // A backend reports its counters when it goes idle, at most once a second, and when it
    // exits, before it leaves pg_stat_activity; the store's sessions are its own (its take
    // connections), so wait for them to end.
    let others = "SELECT count(*) = 0 FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()";
    eventually(std::time::Duration::from_secs(10), "the store's sessions end", || async {
        sqlx::query_scalar::<_, bool>(others).fetch_one(observer).await.unwrap()
    })
    .await;
    sqlx::query("SELECT pg_stat_clear_snapshot()").execute(observer).await.unwrap();
    sqlx::query_as(
        "SELECT sum(t.seq_tup_read)::bigint,
                (SELECT sum(i.idx_tup_read)::bigint FROM pg_stat_user_indexes AS i WHERE i.relid IN ($1::regclass, $2::regclass))
         FROM pg_stat_user_tables AS t
         WHERE t.relid IN ($1::regclass, $2::regclass)",
    )
    .bind(TABLES[0])
    .bind(TABLES[1])
    .fetch_one(observer)
    .await
    .unwrap()
}

/// What the table looked like to the planner when a store's connection first decided, and how
/// the store reaches the database.
#[derive(Clone, Copy, PartialEq)]
enum Planned {
    /// As migrations leave it: never analyzed.
    Fresh,
    /// Analyzed while empty.
    AnalyzedEmpty,
    /// Analyzed while empty, with the store's takes each in a transaction of their own, as
    /// behind a transaction pooler (`Store::through_transaction_pooler`): each transaction
    /// prepares its statements afresh, so what is kept is the functions' plans, made under
    /// that transaction's `SET LOCAL`s.
    AnalyzedEmptyThroughAPooler,
}

/// Plans every decision statement on one connection while the tables are empty (as `planned`
/// says), fills them, decides once more on that connection, and returns the rows the database
/// read by sequential scans and from its indexes.
async fn rows_read_once_the_table_fills(
    pool_options: PgPoolOptions,
    connect_options: PgConnectOptions,
    planned: Planned,
) -> (i64, i64) {
    let observer =
        PgPoolOptions::new().max_connections(1).connect_with(connect_options.clone()).await.unwrap();
    for table in TABLES {
        // Nothing may replan the statements while the test runs: autovacuum's ANALYZE would.
        sqlx::query(&format!("ALTER TABLE {table} SET (autovacuum_enabled = false)"))
            .execute(&observer)
            .await
            .unwrap();
        if planned != Planned::Fresh {
            sqlx::query(&format!("ANALYZE {table}")).execute(&observer).await.unwrap();
        }
    }
    let store = if planned == Planned::AnalyzedEmptyThroughAPooler {
        let pool = pool_options.max_connections(1).connect_with(connect_options.statement_cache_capacity(0));
        Store::new(pool.await.unwrap()).through_transaction_pooler(&[])
    } else {
        Store::new(pool_options.max_connections(1).connect_with(connect_options).await.unwrap())
    };
    // A prepared statement is planned for its arguments five times before PostgreSQL settles
    // on its generic plan: plan every shape past that.
    for round in 0..6 {
        decide_every_shape(&store, instant() + Duration::seconds(round)).await;
    }
    sqlx::query(
        "INSERT INTO plexsphere.rate_budgets (scope, bucket_key, tokens, refilled_at)
         SELECT CASE WHEN i % 2 = 0 THEN 'ingest_node' ELSE 'ingest_domain' END, gen_random_uuid(), 1, now()
         FROM generate_series(1, $1) AS i",
    )
    .bind(FILLED)
    .execute(&observer)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO plexsphere.named_limits (limiter, key_hash, tat_us)
         SELECT 'login_attempt', decode(md5(i::text) || md5((-i)::text), 'hex'), 0 FROM generate_series(1, $1) AS i",
    )
    .bind(FILLED)
    .execute(&observer)
    .await
    .unwrap();
    decide_every_shape(&store, instant() + Duration::seconds(10)).await;
    store.close().await;
    rows_read(&observer).await
}

async fn assert_only_their_rows_read(
    pool_options: PgPoolOptions,
    connect_options: PgConnectOptions,
    planned: Planned,
) {
    let (scanned, index_entries) =
        rows_read_once_the_table_fills(pool_options, connect_options, planned).await;
    assert!(scanned < FILLED / 4, "{scanned} rows read by sequential scans: a decision scanned a table");
    assert!(
        index_entries < FILLED / 4,
        "{index_entries} index entries read: a decision read an index's range"
    );
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn decisions_planned_on_a_fresh_table_read_only_their_rows_once_it_fills(
    pool_options: PgPoolOptions,
    connect_options: PgConnectOptions,
) {
    assert_only_their_rows_read(pool_options, connect_options, Planned::Fresh).await;
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn decisions_planned_on_a_table_analyzed_empty_read_only_their_rows_once_it_fills(
    pool_options: PgPoolOptions,
    connect_options: PgConnectOptions,
) {
    assert_only_their_rows_read(pool_options, connect_options, Planned::AnalyzedEmpty).await;
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn decisions_through_a_transaction_pooler_read_only_their_rows_once_the_table_fills(
    pool_options: PgPoolOptions,
    connect_options: PgConnectOptions,
) {
    assert_only_their_rows_read(pool_options, connect_options, Planned::AnalyzedEmptyThroughAPooler).await;
}
