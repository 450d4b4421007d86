//! The database misbehaves under load: restarted, its backends killed mid-take, its rows held
//! so the limiter's connections run out, stalled while clients hang up; and the service is
//! killed right after it acknowledged a write (issue 12, items 4 and 6).
//!
//! Whatever happens, a request that could not be decided answers 500, never 429 (the budgets
//! here are so large that any 429 could only come from the fault), and the service recovers
//! without a restart.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ratebudget::SystemClock;
use reqwest::{Method, StatusCode};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;

use crate::support::cluster::{free_port, PrivateCluster};
use crate::support::process::{database_url, Launch};
use crate::support::proxy::{Mode, Proxy};
use crate::support::replicas::{config, eventually, Api, Replica};

/// Budgets no load in these tests can spend: a 429 can only come from a fault.
const BOUNDLESS: [(&str, &str); 4] = [
    ("PLEXSPHERE_SECRET_READ_NODE_PER_SECOND", "1000000"),
    ("PLEXSPHERE_SECRET_READ_NODE_BURST", "1000000"),
    ("PLEXSPHERE_SECRET_READ_DOMAIN_PER_SECOND", "1000000"),
    ("PLEXSPHERE_SECRET_READ_DOMAIN_BURST", "1000000"),
];

/// What a loaded machine may add to a deadline before the test calls it missed.
const SLACK: Duration = Duration::from_millis(1500);

/// One answer as a client saw it: when it came, and its status (`None`: no HTTP answer).
type Outcome = (Duration, Option<StatusCode>);

/// Readers, one per token, reading in a loop until `stop`; what each saw, in order.
fn readers(
    api: &Api,
    tokens: &[String],
    started: Instant,
    stop: &Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<Vec<Outcome>>> {
    tokens
        .iter()
        .map(|token| {
            let (api, token, stop) = (api.clone(), token.clone(), stop.clone());
            tokio::spawn(async move {
                let mut seen = Vec::new();
                while !stop.load(Ordering::SeqCst) {
                    let status = api.try_get("/v1/secrets/api-key", &token).await.ok();
                    seen.push((started.elapsed(), status));
                }
                seen
            })
        })
        .collect()
}

async fn collect(readers: Vec<tokio::task::JoinHandle<Vec<Outcome>>>) -> Vec<Outcome> {
    let mut all = Vec::new();
    for reader in readers {
        all.extend(reader.await.unwrap());
    }
    all.sort_by_key(|(at, _)| *at);
    all
}

/// A Domain with a secret and `nodes` Nodes; their tokens.
async fn fleet(api: &Api, nodes: usize) -> Vec<String> {
    let domain = api.create_domain("faults", None).await;
    api.put_secret(&domain, "api-key", "s3cr3t").await;
    let mut tokens = Vec::new();
    for i in 0..nodes {
        tokens.push(api.enrol(&domain, &format!("node-{i}")).await.1);
    }
    tokens
}

#[track_caller]
fn assert_only_ok_or_500(outcomes: &[Outcome]) {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for (_, status) in outcomes {
        *counts.entry(status.map_or("no answer".to_owned(), |status| status.to_string())).or_default() += 1;
    }
    let ok = counts.get("200 OK").copied().unwrap_or_default();
    let failed = counts.get("500 Internal Server Error").copied().unwrap_or_default();
    assert_eq!(ok + failed, outcomes.len(), "only 200 and 500 may answer: {counts:?}");
}

/// Runs a blocking call (a pg_ctl) without stalling the runtime the replicas run on.
async fn blocking<T: Send + 'static>(call: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(call).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_restarted_under_load_costs_500s_only_and_the_service_recovers_by_itself() {
    let cluster = Arc::new(PrivateCluster::start("127.0.0.1", free_port(), None));
    cluster.migrate().await;
    let replica =
        Replica::start(config(&cluster.tcp_options("127.0.0.1"), &BOUNDLESS), Arc::new(SystemClock)).await;
    let tokens = fleet(&replica, 8).await;

    let (started, stop) = (Instant::now(), Arc::new(AtomicBool::new(false)));
    let load = readers(&replica, &tokens, started, &stop);
    eventually(Duration::from_secs(5), "the load is answered", || async {
        started.elapsed() > Duration::from_secs(1)
    })
    .await;
    let restarting = started.elapsed();
    blocking({
        let cluster = cluster.clone();
        move || {
            cluster.stop_server();
            cluster.start_server();
        }
    })
    .await;
    let restarted = started.elapsed();
    // Load goes on for five seconds after the database is back: recovery must happen in them.
    eventually(Duration::from_secs(10), "five seconds of load after the restart", || async {
        started.elapsed() > restarted + Duration::from_secs(5)
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    let outcomes = collect(load).await;

    assert_only_ok_or_500(&outcomes);
    let failures: Vec<_> = outcomes.iter().filter(|(_, status)| *status != Some(StatusCode::OK)).collect();
    assert!(!failures.is_empty(), "the restart was not noticed");
    let last_failure = failures.last().unwrap().0;
    let recovered_after = last_failure.saturating_sub(restarted);
    eprintln!(
        "database restarted (pg_ctl stop -m fast; start) in {:?}: {} of {} reads answered 500, the last {:?} after it was back",
        restarted - restarting,
        failures.len(),
        outcomes.len(),
        recovered_after
    );
    assert!(recovered_after < Duration::from_secs(3), "recovery took {recovered_after:?}");
    replica.stop().await;
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn backends_killed_mid_take_cost_500s_only_and_the_next_requests_succeed(
    pool_options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let pool = pool_options.connect_with(connect.clone()).await.unwrap();
    let replica = Replica::start(config(&connect, &BOUNDLESS), Arc::new(SystemClock)).await;
    let tokens = fleet(&replica, 6).await;
    let (started, stop) = (Instant::now(), Arc::new(AtomicBool::new(false)));
    let load = readers(&replica, &tokens, started, &stop);

    // Every 100 ms for 3 s, end every backend of this replica in this test's database (the
    // shared cluster serves other tests: only our own database's are touched).
    let mut killed = 0_i64;
    for _ in 0..30 {
        let ended: i64 = sqlx::query_scalar(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
             WHERE datname = current_database() AND pid <> pg_backend_pid()
               AND application_name IN ('plexsphere-limiter', 'plexsphere-api')",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        killed += ended;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let killing_stopped = started.elapsed();
    eventually(Duration::from_secs(5), "two seconds of load after the kills", || async {
        started.elapsed() > killing_stopped + Duration::from_secs(2)
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    let outcomes = collect(load).await;

    assert_only_ok_or_500(&outcomes);
    let failed = outcomes.iter().filter(|(_, status)| *status != Some(StatusCode::OK)).count();
    let last_failure =
        outcomes.iter().rev().find(|(_, status)| *status != Some(StatusCode::OK)).map(|(at, _)| *at);
    eprintln!(
        "{killed} backends killed in 3 s under load: {failed} of {} reads answered 500, the last {:?} after the kills stopped",
        outcomes.len(),
        last_failure.map(|at| at.saturating_sub(killing_stopped))
    );
    assert!(killed > 0);
    // Each killed connection fails at most the statement it carried; once the kills stop, the
    // next statements run on fresh connections.
    if let Some(at) = last_failure {
        assert!(at < killing_stopped + Duration::from_secs(1), "still failing {at:?}");
    }
    replica.stop().await;
}

/// The Node's bucket rows, locked by a transaction of the test's own until it is dropped.
async fn hold_buckets(pool: &PgPool) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut transaction = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM plexsphere.rate_budgets FOR UPDATE").execute(&mut *transaction).await.unwrap();
    transaction
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn an_exhausted_limiter_pool_waits_its_bound_and_answers_500(
    pool_options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let pool = pool_options.connect_with(connect.clone()).await.unwrap();
    let timeout = Duration::from_millis(500);
    let knobs = [("PLEXSPHERE_DATABASE_MAX_CONNECTIONS", "2"), ("PLEXSPHERE_DATABASE_TIMEOUT_MS", "500")];
    let replica =
        Replica::start(config(&connect, &[&BOUNDLESS[..], &knobs].concat()), Arc::new(SystemClock)).await;
    let tokens = fleet(&replica, 1).await;
    let token = &tokens[0];
    assert_eq!(replica.get("/v1/secrets/api-key", Some(token)).await.status, StatusCode::OK);

    // Every take now waits on a row lock: the two take connections block on it, and the other
    // requests wait for one of them.
    let held = hold_buckets(&pool).await;
    let started = Instant::now();
    let reads = (0..12).map(|_| async {
        let sent = Instant::now();
        let answer = replica.get("/v1/secrets/api-key", Some(token)).await;
        (answer.status, answer.code().to_owned(), sent.elapsed())
    });
    let answers = futures::future::join_all(reads).await;
    for (status, code, took) in &answers {
        assert_eq!((*status, code.as_str()), (StatusCode::INTERNAL_SERVER_ERROR, "internal"));
        assert!(*took < timeout + SLACK, "answered after {took:?}");
    }
    let slowest = answers.iter().map(|(_, _, took)| *took).max().unwrap();
    eprintln!("12 reads against 2 blocked take connections: all 500, the slowest after {slowest:?} (timeout {timeout:?}, all done in {:?})", started.elapsed());
    held.rollback().await.unwrap();
    eventually(Duration::from_secs(2), "reads succeed once the rows are free", || async {
        replica.get("/v1/secrets/api-key", Some(token)).await.status == StatusCode::OK
    })
    .await;
    replica.stop().await;
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn clients_hanging_up_on_a_stalled_database_never_push_connections_past_the_documented_maximum(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let upstream = {
        use std::net::ToSocketAddrs;
        (connect.get_host(), connect.get_port()).to_socket_addrs().unwrap().next().unwrap()
    };
    let proxy = Proxy::start(upstream).await;
    let through_proxy = connect.clone().host("127.0.0.1").port(proxy.address().port());
    let max = 4;
    let knobs = [("PLEXSPHERE_DATABASE_MAX_CONNECTIONS", "4"), ("PLEXSPHERE_DATABASE_TIMEOUT_MS", "400")];
    let replica =
        Replica::start(config(&through_proxy, &[&BOUNDLESS[..], &knobs].concat()), Arc::new(SystemClock))
            .await;
    let tokens = fleet(&replica, 8).await;
    // README, PLEXSPHERE_DATABASE_MAX_CONNECTIONS: the request pool and the take connections
    // (max each), the background pool's five (two listeners among them), the leader's one.
    // (The limiter pool's own connections serve operator budget reads only, and this test
    // makes none.)
    let documented = 2 * max + 6;

    proxy.set(Mode::Stalled);
    let client = reqwest::Client::new();
    let started = Instant::now();
    let mut hung_up = 0;
    // Waves of 40 clients, each giving up after 20 to 300 ms, for 3 s.
    let mut wave = 0_u64;
    while started.elapsed() < Duration::from_secs(3) {
        let requests = tokens.iter().cycle().take(40).enumerate().map(|(i, token)| {
            let patience = Duration::from_millis(20 + (wave * 37 + i as u64 * 53) % 280);
            client
                .get(format!("{}/v1/secrets/api-key", replica.base()))
                .bearer_auth(token)
                .timeout(patience)
                .send()
        });
        for answer in futures::future::join_all(requests).await {
            if answer.is_err() {
                hung_up += 1;
            }
        }
        wave += 1;
        assert!(
            proxy.open_connections() <= documented,
            "{} connections open, documented maximum {documented}",
            proxy.open_connections()
        );
    }
    let peak = proxy.peak_connections();
    eprintln!("{hung_up} clients hung up mid-request on a stalled database: at most {peak} connections open at once (documented maximum {documented})");
    assert!(hung_up > 100, "{hung_up}");
    assert!(peak <= documented, "{peak} connections open at once, documented maximum {documented}");

    proxy.set(Mode::Open);
    eventually(Duration::from_secs(10), "reads succeed once the database answers", || async {
        replica.get("/v1/secrets/api-key", Some(&tokens[0])).await.status == StatusCode::OK
    })
    .await;
    replica.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_was_acknowledged_survives_the_service_killed_and_the_database_crashed_right_after() {
    let cluster = Arc::new(PrivateCluster::start("127.0.0.1", free_port(), None));
    cluster.migrate().await;
    let url = database_url(&cluster.tcp_options("127.0.0.1"));
    let pool = || async {
        PgPoolOptions::new().max_connections(1).connect_with(cluster.socket_options()).await.unwrap()
    };
    // The service answers, then it is killed with SIGKILL and the database crashes (every
    // server process killed, nothing flushed or checkpointed) before anything else happens.
    let kill_both = |service: crate::support::process::ServiceProcess| {
        let cluster = cluster.clone();
        async move {
            service.signal("KILL");
            blocking(move || {
                cluster.crash();
                cluster.start_server();
            })
            .await;
            drop(service);
        }
    };

    let service = Launch::serve(&url).start().await;
    let api = service.api();
    let domain = api.create_domain("durable", None).await;
    let (_, token) = api.enrol(&domain, "node-0").await;
    let path = format!("/v1/domains/{domain}/secrets/db-password");
    let put = api.operator(Method::PUT, &path, Some(serde_json::json!({ "value": "hunter2" }))).await;
    assert_eq!(put.status, StatusCode::NO_CONTENT);
    kill_both(service).await;
    // Sealed (issue 13): the row holds the 7 bytes of "hunter2" and the 16 of the AEAD tag.
    let sealed: Option<i32> = sqlx::query_scalar(
        "SELECT octet_length(ciphertext) FROM plexsphere.secrets WHERE domain_id = $1::uuid AND name = 'db-password'",
    )
    .bind(&domain)
    .fetch_optional(&pool().await)
    .await
    .unwrap();
    assert_eq!(sealed, Some(7 + 16), "a secret answered 204 was lost");

    let service = Launch::serve(&url).start().await;
    let path = format!("/v1/domains/{domain}/nodes");
    let enrolled =
        service.api().operator(Method::POST, &path, Some(serde_json::json!({ "name": "node-1" }))).await;
    assert_eq!(enrolled.status, StatusCode::CREATED);
    kill_both(service).await;
    let node: Option<uuid::Uuid> = sqlx::query_scalar("SELECT id FROM plexsphere.nodes WHERE id = $1::uuid")
        .bind(enrolled.body["id"].as_str().unwrap())
        .fetch_optional(&pool().await)
        .await
        .unwrap();
    assert!(node.is_some(), "a Node answered 201 was lost");

    let service = Launch::serve(&url).start().await;
    let batch =
        service.api().request(Method::POST, "/v1/ingest", Some(&token), Some(b"cpu=0.42".to_vec())).await;
    assert_eq!(batch.status, StatusCode::ACCEPTED);
    kill_both(service).await;
    let stored: Option<uuid::Uuid> =
        sqlx::query_scalar("SELECT id FROM plexsphere.ingest_batches WHERE id = $1::uuid")
            .bind(batch.body["id"].as_str().unwrap())
            .fetch_optional(&pool().await)
            .await
            .unwrap();
    assert!(stored.is_some(), "a batch answered 202 was lost");
}
