//! One hot bucket, 64 callers, in-process through the library (issue 25): decisions a second
//! with leases on, and statements per 1,000 grants, beside the same guard without leases
//! (coalescing only); then a rule the callers saturate, whose admissions over the run must be
//! within 1% of `rate × seconds + burst` and never above it.
//!
//! ```text
//! cargo bench -p ratebudget --bench lease -- --database-url postgres://postgres@127.0.0.1:5432/plexsphere_bench_lease
//! ```
//!
//! Knobs: `--seconds` (10), `--callers` (64), `--lease-ms` (100). It recreates the database
//! with `ratebudget::MIGRATOR` alone. Callers read the clock for every take (the system's:
//! `SystemClock`), as a service does. "statements" counts every call the guard made of the
//! store (takes and leases): coalescing may have sent fewer.

use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use ratebudget::{
    Clock, Decider, Decision, Key, LeaseRequest, Leased, Limit, Name, Spend, Store, SystemClock, Take,
    Undecided,
};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, Executor};

/// The store, counting every call the guard makes of it.
#[derive(Debug)]
struct Counted {
    store: Store,
    calls: AtomicU64,
}

#[async_trait]
impl Decider for Counted {
    async fn decide(&self, take: Take, now: DateTime<Utc>) -> Result<Decision, Undecided> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.store.decide(take, now).await
    }

    async fn lease(&self, request: LeaseRequest, now: DateTime<Utc>) -> Result<Option<Leased>, Undecided> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.store.lease(request, now).await
    }
}

struct Run {
    decisions: u64,
    granted: u64,
    statements: u64,
    seconds: f64,
}

async fn run(
    pool: &sqlx::PgPool,
    limit: Limit,
    lease: Option<Duration>,
    callers: usize,
    seconds: f64,
) -> Run {
    let counted = Arc::new(Counted { store: Store::new(pool.clone()), calls: AtomicU64::new(0) });
    let guard = ratebudget::GuardBuilder::shared(counted.clone())
        .decision_timeout(Duration::from_secs(5))
        .leases(lease.unwrap_or_default())
        .build();
    let guard = Arc::new(guard);
    let spend = Spend::new(Name::new("bench_hot").unwrap(), Key::from(uuid::Uuid::new_v4()), 1.0, limit);
    let stop = Arc::new(AtomicBool::new(false));
    let (decisions, granted) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let started = Instant::now();
    let tasks: Vec<_> = (0..callers)
        .map(|_| {
            let (guard, stop, decisions, granted) =
                (guard.clone(), stop.clone(), decisions.clone(), granted.clone());
            tokio::spawn(async move {
                let (mut decided, mut admitted) = (0, 0);
                while !stop.load(Ordering::Relaxed) {
                    let decision = guard.decide(Take::Single(spend), SystemClock.now()).await.unwrap();
                    decided += 1;
                    admitted += u64::from(decision.is_granted());
                    // A caller that never waits would hold its worker for ever.
                    if decided % 64 == 0 {
                        tokio::task::yield_now().await;
                    }
                }
                decisions.fetch_add(decided, Ordering::Relaxed);
                granted.fetch_add(admitted, Ordering::Relaxed);
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.unwrap();
    }
    Run {
        decisions: decisions.load(Ordering::Relaxed),
        granted: granted.load(Ordering::Relaxed),
        statements: counted.calls.load(Ordering::Relaxed),
        seconds: started.elapsed().as_secs_f64(),
    }
}

#[allow(clippy::print_stdout)]
fn main() {
    let mut database_url = "postgres://postgres@127.0.0.1:5432/plexsphere_bench_lease".to_owned();
    let (mut seconds, mut callers, mut lease_ms) = (10.0, 64, 100);
    let mut words = std::env::args().skip(1);
    while let Some(word) = words.next() {
        match word.as_str() {
            "--database-url" => database_url = words.next().expect("--database-url needs a value"),
            "--seconds" => seconds = words.next().expect("--seconds needs a value").parse().unwrap(),
            "--callers" => callers = words.next().expect("--callers needs a value").parse().unwrap(),
            "--lease-ms" => lease_ms = words.next().expect("--lease-ms needs a value").parse().unwrap(),
            "--bench" => {}
            other => panic!("unknown argument {other:?}"),
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let options = PgConnectOptions::from_str(&database_url).unwrap();
        let name = options.get_database().expect("the URL names the benchmark database").to_owned();
        let mut admin = sqlx::PgConnection::connect_with(&options.clone().database("postgres")).await.unwrap();
        admin.execute(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)").as_str()).await.unwrap();
        admin.execute(format!("CREATE DATABASE {name}").as_str()).await.unwrap();
        // The limiter's commit mode (docs/adr/0004).
        let options = options.options([("synchronous_commit", "off")]);
        let pool = PgPoolOptions::new().max_connections(8).connect_with(options).await.unwrap();
        ratebudget::MIGRATOR.run(&pool).await.unwrap();

        let lease = Duration::from_millis(lease_ms);
        println!("one hot bucket, {callers} callers, {seconds} s each, lease {lease_ms} ms");
        println!(
            "{:<34} {:>14} {:>14} {:>22}",
            "run", "decisions/s", "grants", "statements/1000 grants"
        );
        let fast = Limit::new(10_000_000.0, 1_000_000.0).unwrap();
        for (label, lease) in [("10M/s rule, coalesced only", None), ("10M/s rule, leased", Some(lease))] {
            let run = run(&pool, fast, lease, callers, seconds).await;
            println!(
                "{label:<34} {:>14.0} {:>14} {:>22.3}",
                run.decisions as f64 / run.seconds,
                run.granted,
                run.statements as f64 * 1000.0 / run.granted.max(1) as f64
            );
        }
        let slow = Limit::new(1_000.0, 1_000.0).unwrap();
        for (label, lease) in [("1000/s rule, coalesced only", None), ("1000/s rule, leased", Some(lease))] {
            let run = run(&pool, slow, lease, callers, seconds).await;
            let bound = slow.per_second() * run.seconds + slow.burst();
            println!(
                "{label:<34} {:>14.0} {:>14} {:>22.3}   admitted {:.2}% of rate x {:.2} s + burst ({bound:.0})",
                run.decisions as f64 / run.seconds,
                run.granted,
                run.statements as f64 * 1000.0 / run.granted.max(1) as f64,
                run.granted as f64 * 100.0 / bound,
                run.seconds,
            );
        }
    });
}
