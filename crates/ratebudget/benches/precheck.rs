//! Refusals the pre-check gives without a statement, on one core, beside governor's keyed
//! in-memory limiter running the same loop: what a flood from clients past their budget
//! costs a replica once the store has said no.
//!
//! ```text
//! cargo bench -p ratebudget --bench precheck -- --database-url postgres://postgres@127.0.0.1:5432/plexsphere_bench_precheck
//! ```
//!
//! The take benchmark's table (`cargo bench -p ratebudget --bench take`) ends with these rows.
//!
//! It recreates that database, spends the burst of 10,000 buckets through a [`Guard`] (so the
//! guard knows each is empty), then times a loop of takes over those keys on a
//! single-threaded runtime, with the clock standing still so that none refills. It counts
//! where every measured decision came from, and fails if any reached the store: the
//! "statements" column is that count.

use std::num::NonZeroU32;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeZone, Utc};
use ratebudget::{
    Decider, Decision, Guard, Key, Limit, Observer, Scope, Source, Spend, Store, Take, Undecided,
};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, Executor};

const KEYS: usize = 10_000;
const MEASURED: usize = 2_000_000;

/// Counts decisions by source.
#[derive(Debug, Default)]
struct Sources {
    store: AtomicU64,
    precheck: AtomicU64,
}

impl Observer for Sources {
    fn decided(
        &self,
        _: &Take,
        _: DateTime<Utc>,
        outcome: Result<(&Decision, Source), &Undecided>,
        _: Duration,
    ) {
        match outcome {
            Ok((_, Source::Precheck)) => self.precheck.fetch_add(1, Ordering::Relaxed),
            _ => self.store.fetch_add(1, Ordering::Relaxed),
        };
    }
    fn abandoned(&self, _: &Take, _: Duration) {}
    fn store_failing(&self, _: bool) {}
}

/// What one run measured: refusals a second by the guard's pre-check and by governor, and
/// how many measured takes reached the store (always 0, or the run fails).
pub(crate) struct PrecheckRun {
    pub(crate) ours: f64,
    pub(crate) governor: f64,
    pub(crate) statements: u64,
}

impl PrecheckRun {
    /// The run as rows of the take benchmark's table.
    pub(crate) fn rows(&self) -> String {
        format!(
            "{:<34} {:>14} {:>22}\n{:<34} {:>14.0} {:>22}\n{:<34} {:>14.0} {:>22}\nratio ours/governor: {:.2}",
            "limiter (one core, 10k keys)",
            "refusals/s",
            "database statements",
            "ratebudget Guard pre-check",
            self.ours,
            self.statements,
            "governor keyed (DashMap, in memory)",
            self.governor,
            "-",
            self.ours / self.governor
        )
    }
}

#[allow(dead_code, clippy::print_stdout)]
fn main() {
    let mut database_url = "postgres://postgres@127.0.0.1:5432/plexsphere_bench_precheck".to_owned();
    let mut words = std::env::args().skip(1);
    while let Some(word) = words.next() {
        match word.as_str() {
            "--database-url" => database_url = words.next().expect("--database-url needs a value"),
            "--bench" => {}
            other => panic!("unknown argument {other:?}"),
        }
    }
    println!("{}", run(&database_url).rows());
}

/// Measures the pre-check and governor on `database_url` (recreated), on one core.
pub(crate) fn run(database_url: &str) -> PrecheckRun {
    // One core: a current-thread runtime, and the loop below never yields to the database.
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let options = PgConnectOptions::from_str(database_url).unwrap();
    let (guard, sources, keys) = runtime.block_on(prepare(&options));
    let limit = Limit::new(10.0, 20.0).unwrap();
    let now = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap();

    let before_store = sources.store.load(Ordering::Relaxed);
    let started = Instant::now();
    runtime.block_on(async {
        for i in 0..MEASURED {
            let spend = Spend::new(Scope::SecretReadNode, keys[i % KEYS], 1.0, limit);
            let decision = guard.decide(Take::Single(spend), now).await.unwrap();
            assert!(!decision.is_granted());
        }
    });
    let ours = MEASURED as f64 / started.elapsed().as_secs_f64();
    let statements = sources.store.load(Ordering::Relaxed) - before_store;
    assert_eq!(statements, 0, "measured takes reached the store");

    // governor's keyed limiter, the same quota, the same keys, each already spent, on a clock
    // that stands still as ours does.
    let quota =
        governor::Quota::per_second(NonZeroU32::new(10).unwrap()).allow_burst(NonZeroU32::new(20).unwrap());
    let governor: governor::RateLimiter<Key, _, _, governor::middleware::NoOpMiddleware<_>> =
        governor::RateLimiter::new(
            quota,
            governor::state::keyed::DefaultKeyedStateStore::<Key>::default(),
            governor::clock::FakeRelativeClock::default(),
        );
    for key in &keys {
        while governor.check_key(key).is_ok() {}
    }
    let started = Instant::now();
    for i in 0..MEASURED {
        assert!(governor.check_key(&keys[i % KEYS]).is_err());
    }
    let theirs = MEASURED as f64 / started.elapsed().as_secs_f64();
    PrecheckRun { ours, governor: theirs, statements }
}

async fn prepare(options: &PgConnectOptions) -> (Guard, Arc<Sources>, Vec<Key>) {
    let name = options.get_database().expect("the URL names the benchmark database").to_owned();
    let mut admin = sqlx::PgConnection::connect_with(&options.clone().database("postgres")).await.unwrap();
    admin.execute(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)").as_str()).await.unwrap();
    admin.execute(format!("CREATE DATABASE {name}").as_str()).await.unwrap();
    let pool = PgPoolOptions::new().max_connections(4).connect_with(options.clone()).await.unwrap();
    ratebudget::MIGRATOR.run(&pool).await.unwrap();

    let sources = Arc::new(Sources::default());
    let guard = Guard::builder(Store::new(pool.clone()))
        .decision_timeout(Duration::from_secs(5))
        .capacity(2 * KEYS as u64)
        .observer(sources.clone())
        .build();
    let limit = Limit::new(10.0, 20.0).unwrap();
    let now = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap();
    let keys: Vec<Key> = (0..KEYS).map(|_| Key::from(uuid::Uuid::new_v4())).collect();
    for key in &keys {
        let take = Take::Single(Spend::new(Scope::SecretReadNode, *key, 20.0, limit));
        assert!(guard.decide(take, now).await.unwrap().is_granted());
    }
    (guard, sources, keys)
}
