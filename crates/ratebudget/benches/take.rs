//! Throughput and latency of `Store::take` (and `Store::take_pair`) against a real PostgreSQL.
//!
//! Run by `bench/compare.sh`, which seeds the database and runs pgbench with the identical
//! statement beside it. Alone:
//!
//! ```text
//! cargo bench -p ratebudget --bench take -- --database-url postgres://postgres@127.0.0.1:5432/plexsphere_bench \
//!     --workload random --clients 16 --seconds 5 --synchronous-commit off
//! ```
//!
//! It prints one line: `workload clients synchronous_commit takes_per_second p50_us p99_us`.
//! The database must hold the rows `bench/seed.sql` writes.

use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeZone, Utc};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use ratebudget::{Budget, Key, PairDecision, Scope, Spend, Store};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

/// What every caller does in a loop.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Workload {
    /// A take from one of 100,000 Node buckets, uniformly at random; always granted.
    Random,
    /// A take from one bucket shared by every caller; always granted.
    Hot,
    /// A take from one exhausted bucket that never refills; always refused.
    Refused,
    /// A take from a random Node bucket and a random one of 1,000 Domain buckets, together.
    Pair,
}

impl FromStr for Workload {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "random" => Ok(Workload::Random),
            "hot" => Ok(Workload::Hot),
            "refused" => Ok(Workload::Refused),
            "pair" => Ok(Workload::Pair),
            other => Err(format!("unknown workload {other:?}: random, hot, refused or pair")),
        }
    }
}

struct Args {
    database_url: String,
    workload: Workload,
    clients: usize,
    seconds: u64,
    synchronous_commit: String,
}

fn parse_args() -> Args {
    let mut args = Args {
        database_url: "postgres://postgres@127.0.0.1:5432/plexsphere_bench".into(),
        workload: Workload::Random,
        clients: 1,
        seconds: 5,
        synchronous_commit: "off".into(),
    };
    let mut words = std::env::args().skip(1);
    while let Some(word) = words.next() {
        let mut value = || words.next().unwrap_or_else(|| panic!("{word} needs a value"));
        match word.as_str() {
            "--database-url" => args.database_url = value(),
            "--workload" => args.workload = value().parse().unwrap(),
            "--clients" => args.clients = value().parse().unwrap(),
            "--seconds" => args.seconds = value().parse().unwrap(),
            "--synchronous-commit" => args.synchronous_commit = value(),
            // cargo bench passes --bench to every bench target.
            "--bench" => {}
            other => panic!("unknown argument {other:?}"),
        }
    }
    args
}

/// The instant every take is made at. Fixed, as in the pgbench script, so both sides do
/// exactly the same arithmetic; refills play no part in what is measured.
fn now() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap()
}

/// The seeded keys: `md5(i)::uuid` for i in 1..=count, as `bench/seed.sql` writes them.
async fn keys(pool: &sqlx::PgPool, scope: &str) -> Vec<Key> {
    let ids: Vec<uuid::Uuid> = sqlx::query_scalar(
        "SELECT bucket_key FROM plexsphere.rate_budgets WHERE scope = $1 ORDER BY bucket_key",
    )
    .bind(scope)
    .fetch_all(pool)
    .await
    .unwrap();
    assert!(!ids.is_empty(), "no {scope} rows: run bench/seed.sql first");
    ids.into_iter().map(Key::from).collect()
}

fn main() {
    let args = parse_args();
    let runtime = if std::env::var("BENCH_RUNTIME").as_deref() == Ok("current") {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
    } else {
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
    };
    runtime.block_on(run(args));
}

async fn run(args: Args) {
    let options = PgConnectOptions::from_str(&args.database_url)
        .unwrap()
        .options([("synchronous_commit", args.synchronous_commit.as_str())]);
    let pool = PgPoolOptions::new().max_connections(args.clients as u32).connect_with(options).await.unwrap();
    let store = Store::new(pool.clone());
    let nodes = Arc::new(keys(&pool, "ingest_node").await);
    let domains = Arc::new(keys(&pool, "ingest_domain").await);
    let hot = Key::from(uuid::Uuid::parse_str("00000000-0000-4000-8000-000000000001").unwrap());
    let exhausted = Key::from(uuid::Uuid::parse_str("00000000-0000-4000-8000-000000000002").unwrap());
    // Large enough that the random and hot workloads never refuse over a run.
    let plenty = Budget { per_second: 1.0, burst: 1e12 };
    let never_refills = Budget { per_second: 0.0, burst: 1e12 };

    let warm_up = Duration::from_secs(1);
    let started = Instant::now();
    let measure_from = started + warm_up;
    let until = measure_from + Duration::from_secs(args.seconds);
    let workload = args.workload;
    let callers: Vec<_> = (0..args.clients)
        .map(|caller| {
            let (store, nodes, domains) = (store.clone(), nodes.clone(), domains.clone());
            tokio::spawn(async move {
                let mut rng = SmallRng::seed_from_u64(caller as u64);
                let mut latencies_us = Vec::with_capacity(64 * 1024);
                loop {
                    let began = Instant::now();
                    if began >= until {
                        return latencies_us;
                    }
                    let node = nodes[rng.random_range(0..nodes.len())];
                    match workload {
                        Workload::Random => {
                            assert!(store.take(Scope::IngestNode, node, 1.0, plenty, now()).await.unwrap());
                        }
                        Workload::Hot => {
                            assert!(store
                                .take(Scope::SecretReadNode, hot, 1.0, plenty, now())
                                .await
                                .unwrap());
                        }
                        Workload::Refused => {
                            let taken =
                                store.take(Scope::SecretReadNode, exhausted, 1.0, never_refills, now()).await;
                            assert!(!taken.unwrap());
                        }
                        Workload::Pair => {
                            let domain = domains[rng.random_range(0..domains.len())];
                            let first =
                                Spend { scope: Scope::IngestNode, key: node, cost: 1.0, budget: plenty };
                            let second =
                                Spend { scope: Scope::IngestDomain, key: domain, cost: 1.0, budget: plenty };
                            assert_eq!(
                                store.take_pair(first, second, now()).await.unwrap(),
                                PairDecision::Granted
                            );
                        }
                    }
                    if began >= measure_from {
                        latencies_us.push(began.elapsed().as_micros() as u32);
                    }
                }
            })
        })
        .collect();
    let mut latencies_us = Vec::new();
    for caller in callers {
        latencies_us.extend(caller.await.unwrap());
    }
    latencies_us.sort_unstable();
    let percentile =
        |p: f64| latencies_us[((latencies_us.len() as f64 * p) as usize).min(latencies_us.len() - 1)];
    let per_second = latencies_us.len() as f64 / args.seconds as f64;
    #[allow(clippy::print_stdout)]
    {
        println!(
            "{:?} {} {} {:.0} {} {}",
            workload,
            args.clients,
            args.synchronous_commit,
            per_second,
            percentile(0.50),
            percentile(0.99)
        );
    }
}
