//! Throughput and latency of `Store::take` (and the two-budget `Store::decide`) against a real
//! PostgreSQL.
//!
//! ```text
//! cargo bench -p ratebudget --bench take
//! ```
//!
//! recreates the database `plexsphere_bench` (migrated, with the rows of `bench/seed.sql`) and
//! prints a table: every workload at 1, 4, 16 and 64 concurrent callers, with asynchronous
//! commit as the limiter pool uses it (about 90 s). `--synchronous-commit on` measures the
//! other mode; `--seconds N` sets each row's measured time.
//!
//! `bench/compare.sh` runs one row at a time (`--workload W --clients N`, which prints one
//! line: `workload clients synchronous_commit takes_per_second p50_us p99_us`) beside pgbench
//! with the identical statement, after `--setup` has prepared the database.

use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeZone, Utc};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use ratebudget::{Budget, Coalescing, Decider, Key, Limit, Scope, Spend, Store, Take};
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
    /// One row only (for bench/compare.sh); the whole table when None.
    workload: Option<Workload>,
    clients: usize,
    seconds: u64,
    synchronous_commit: String,
    setup_only: bool,
    /// Coalesce concurrent takes (the store's default); without it every take is a statement
    /// of its own, as before coalescing.
    coalesce: bool,
    /// Overrides [`Coalescing::DEFAULT`]'s calls on the wire at once (with `--coalesce`).
    max_in_flight: Option<usize>,
}

const WORKLOADS: [Workload; 4] = [Workload::Random, Workload::Hot, Workload::Refused, Workload::Pair];
const CLIENTS: [usize; 4] = [1, 4, 16, 64];

const SEED: &str = include_str!("../../../bench/seed.sql");

fn parse_args() -> Args {
    let mut args = Args {
        database_url: "postgres://postgres@127.0.0.1:5432/plexsphere_bench".into(),
        workload: None,
        clients: 1,
        seconds: 4,
        synchronous_commit: "off".into(),
        setup_only: false,
        coalesce: false,
        max_in_flight: None,
    };
    let mut words = std::env::args().skip(1);
    while let Some(word) = words.next() {
        let mut value = || words.next().unwrap_or_else(|| panic!("{word} needs a value"));
        match word.as_str() {
            "--database-url" => args.database_url = value(),
            "--workload" => args.workload = Some(value().parse().unwrap()),
            "--setup" => args.setup_only = true,
            "--clients" => args.clients = value().parse().unwrap(),
            "--seconds" => args.seconds = value().parse().unwrap(),
            "--synchronous-commit" => args.synchronous_commit = value(),
            "--coalesce" => args.coalesce = true,
            "--max-in-flight" => args.max_in_flight = Some(value().parse().unwrap()),
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
    assert!(!ids.is_empty(), "no {scope} rows: run with --setup first");
    ids.into_iter().map(Key::from).collect()
}

#[path = "precheck.rs"]
#[allow(dead_code)]
mod precheck;

fn main() {
    let args = parse_args();
    // Two workers, like the service's runtime on this two-core machine.
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async {
        if args.setup_only {
            return setup(&args.database_url).await;
        }
        match args.workload {
            Some(workload) => {
                let row = measure(&args, workload, args.clients).await;
                #[allow(clippy::print_stdout)]
                {
                    println!("{row}");
                }
            }
            None => table(&args).await,
        }
    });
    if args.workload.is_none() && !args.setup_only {
        // The last rows: refusals the guard's pre-check gives without a statement, on one
        // core, beside governor's keyed limiter (its own database, its own runtime).
        let url = args.database_url.replace("plexsphere_bench", "plexsphere_bench_precheck");
        #[allow(clippy::print_stdout)]
        {
            println!();
            println!("{}", precheck::run(&url).rows());
        }
    }
}

/// Recreates the benchmark database, migrated and seeded.
async fn setup(database_url: &str) {
    use sqlx::{Connection, Executor};
    let options = PgConnectOptions::from_str(database_url).unwrap();
    let name = options.get_database().expect("the URL names the benchmark database").to_owned();
    let mut admin = sqlx::PgConnection::connect_with(&options.clone().database("postgres")).await.unwrap();
    admin.execute(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)").as_str()).await.unwrap();
    admin.execute(format!("CREATE DATABASE {name}").as_str()).await.unwrap();
    let mut connection = sqlx::PgConnection::connect_with(&options).await.unwrap();
    ratebudget::MIGRATOR.run(&mut connection).await.unwrap();
    // One statement at a time: VACUUM refuses to run inside the implicit transaction of a
    // multi-statement query.
    let is_code = |line: &str| !line.trim().is_empty() && !line.trim_start().starts_with("--");
    for statement in SEED.split(";\n").filter(|statement| statement.lines().any(is_code)) {
        connection.execute(statement).await.unwrap();
    }
}

#[allow(clippy::print_stdout)]
async fn table(args: &Args) {
    setup(&args.database_url).await;
    println!(
        "{:<8} {:>7} {:>6} {:>12} {:>9} {:>9}",
        "workload", "clients", "sync", "takes/s", "p50_us", "p99_us"
    );
    for workload in WORKLOADS {
        for clients in CLIENTS {
            let row = measure(args, workload, clients).await;
            println!(
                "{:<8} {:>7} {:>6} {:>12.0} {:>9} {:>9}",
                format!("{:?}", row.workload).to_lowercase(),
                row.clients,
                row.synchronous_commit,
                row.per_second,
                row.p50_us,
                row.p99_us
            );
        }
    }
}

/// One row of the table.
struct Row {
    workload: Workload,
    clients: usize,
    synchronous_commit: String,
    per_second: f64,
    p50_us: u32,
    p99_us: u32,
}

impl std::fmt::Display for Row {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:?} {} {} {:.0} {} {}",
            self.workload, self.clients, self.synchronous_commit, self.per_second, self.p50_us, self.p99_us
        )
    }
}

async fn measure(args: &Args, workload: Workload, clients: usize) -> Row {
    let options = PgConnectOptions::from_str(&args.database_url)
        .unwrap()
        .options([("synchronous_commit", args.synchronous_commit.as_str())]);
    // At most 64 connections, as a replica's pool would hold (PostgreSQL allows 100 here):
    // 256 callers share them.
    let pool =
        PgPoolOptions::new().max_connections(clients.min(64) as u32).connect_with(options).await.unwrap();
    let coalescing = match (args.coalesce, args.max_in_flight) {
        (false, _) => Coalescing::OFF,
        (true, None) => Coalescing::DEFAULT,
        (true, Some(max_in_flight)) => Coalescing { max_in_flight, ..Coalescing::DEFAULT },
    };
    let store = Store::new(pool.clone()).with_coalescing(coalescing);
    let nodes = Arc::new(keys(&pool, "ingest_node").await);
    let domains = Arc::new(keys(&pool, "ingest_domain").await);
    let hot = Key::from(uuid::Uuid::parse_str("00000000-0000-4000-8000-000000000001").unwrap());
    let exhausted = Key::from(uuid::Uuid::parse_str("00000000-0000-4000-8000-000000000002").unwrap());
    // Large enough that the random and hot workloads never refuse over a run.
    // Every take is decided at the seed rows' own instant (`now()`), so no bucket refills
    // during a run whatever the rate: the hot bucket never runs dry and the exhausted one
    // never recovers. The rate only has to make a valid limit (refilled within the hour).
    let plenty = Budget { per_second: 1e9, burst: 1e12 };
    let plenty_limit = Limit::try_from(plenty).unwrap();
    let never_refills = plenty;

    let warm_up = Duration::from_secs(1);
    let started = Instant::now();
    let measure_from = started + warm_up;
    let until = measure_from + Duration::from_secs(args.seconds);
    let callers: Vec<_> = (0..clients)
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
                            let first = Spend::new(Scope::IngestNode, node, 1.0, plenty_limit);
                            let second = Spend::new(Scope::IngestDomain, domain, 1.0, plenty_limit);
                            assert!(store
                                .decide(Take::Pair(first, second), now())
                                .await
                                .unwrap()
                                .is_granted());
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
    store.close().await;
    latencies_us.sort_unstable();
    let percentile =
        |p: f64| latencies_us[((latencies_us.len() as f64 * p) as usize).min(latencies_us.len() - 1)];
    Row {
        workload,
        clients,
        synchronous_commit: args.synchronous_commit.clone(),
        per_second: latencies_us.len() as f64 / args.seconds as f64,
        p50_us: percentile(0.50),
        p99_us: percentile(0.99),
    }
}
