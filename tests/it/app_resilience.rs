//! The service in front of a store that is flooded, stuck or reset: the pre-check keeps a
//! flood off the database, fail modes keep (or refuse to keep) working while the store is
//! stuck, waits and header fields are exact, and a reset reaches every replica.

use std::sync::Arc;
use std::time::{Duration, Instant};

use app::runtime::leader::LeaderTiming;
use app::startup::TimeSource;
use app::startup::Wiring;
use ratebudget::ManualClock;
use reqwest::{Method, StatusCode};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection};

use crate::support::helpers::instant;
use crate::support::replicas::{config, eventually, Replica};

/// Leader timing that asks once at start and then stays quiet, so background statements do
/// not blur a count of the statements requests cost.
const QUIET_LEADER: LeaderTiming = LeaderTiming {
    retry: Duration::from_secs(3600),
    ping: Duration::from_secs(3600),
    timeout: Duration::from_secs(5),
};

/// Transactions committed in the test's database so far, by PostgreSQL's own statistics.
///
/// A backend publishes its counts when it exits (and otherwise at most once a second while
/// idle), so this is read only after every other session on the database is gone.
async fn committed(measure: &mut PgConnection) -> i64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let others: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        .fetch_one(&mut *measure)
        .await
        .unwrap();
        if others == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{others} sessions still on the database");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    sqlx::query("SELECT pg_stat_clear_snapshot()").execute(&mut *measure).await.unwrap();
    sqlx::query_scalar("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")
        .fetch_one(&mut *measure)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_flood_of_reads_past_the_burst_costs_the_database_almost_nothing(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let mut measure = PgConnection::connect_with(&connect).await.unwrap();
    let clock = Arc::new(ManualClock::new(instant()));
    let wiring = || Wiring { time: TimeSource::Given(clock.clone()), leader_timing: QUIET_LEADER };

    // Set up, and spend the Node's burst of 20, on one replica; then stop it.
    let replica = Replica::start_with(config(&connect, &[]), wiring()).await;
    let domain = replica.create_domain("d", None).await;
    let (_, token) = replica.enrol(&domain, "n").await;
    replica.put_secret(&domain, "key", "value").await;
    for _ in 0..20 {
        assert_eq!(replica.get("/v1/secrets/key", Some(&token)).await.status, StatusCode::OK);
    }
    replica.stop().await;
    let before = committed(&mut measure).await;

    // A fresh replica (its pre-check knows nothing yet) takes a flood of 1,000 reads.
    let replica = Replica::start_with(config(&connect, &[]), wiring()).await;
    for _ in 0..1000 {
        let answer = replica.get("/v1/secrets/key", Some(&token)).await;
        assert_eq!(answer.status, StatusCode::TOO_MANY_REQUESTS, "{answer:?}");
    }
    replica.stop().await;
    let statements = committed(&mut measure).await - before;

    // One credential lookup, one refusal from the store, the leader's election and first
    // sweep, and this test's own reads of the statistics: a handful, not a thousand.
    assert!(statements <= 50, "1,000 refused reads cost {statements} statements");
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn with_the_table_locked_a_local_scope_answers_in_time_a_closed_one_500_and_both_recover(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let clock = Arc::new(ManualClock::new(instant()));
    let knobs = [
        ("PLEXSPHERE_DECISION_TIMEOUT_MS", "250"),
        ("PLEXSPHERE_SECRET_READ_NODE_FAIL_MODE", "local"),
        ("PLEXSPHERE_SECRET_READ_DOMAIN_FAIL_MODE", "local"),
    ];
    let replica = Replica::start_with(
        config(&connect, &knobs),
        Wiring { time: TimeSource::Given(clock), leader_timing: QUIET_LEADER },
    )
    .await;
    let domain = replica.create_domain("d", None).await;
    let (_, token) = replica.enrol(&domain, "n").await;
    replica.put_secret(&domain, "key", "value").await;
    let ingest = || replica.request(Method::POST, "/v1/ingest", Some(&token), Some(b"cpu=1".to_vec()));
    assert_eq!(ingest().await.status, StatusCode::ACCEPTED);

    // Another session holds the table: every take waits on it, the guard's reads included.
    let mut locker = PgConnection::connect_with(&connect).await.unwrap();
    sqlx::query("BEGIN").execute(&mut locker).await.unwrap();
    sqlx::query("LOCK TABLE plexsphere.rate_budgets IN ACCESS EXCLUSIVE MODE")
        .execute(&mut locker)
        .await
        .unwrap();

    for _ in 0..5 {
        let started = Instant::now();
        let answer = replica.get("/v1/secrets/key", Some(&token)).await;
        let took = started.elapsed();
        assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
        assert!(took < Duration::from_millis(250 + 500), "a local scope answered after {took:?}");
        let answer = ingest().await;
        assert_eq!((answer.status, answer.code()), (StatusCode::INTERNAL_SERVER_ERROR, "internal"));
    }
    let metrics = replica.get("/metrics", None).await.body.as_str().unwrap().to_owned();
    assert!(
        metrics.contains("plexsphere_rate_budget_fallback_active{scope=\"secret_read_node\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("outcome=\"fallback_granted\""), "{metrics}");

    sqlx::query("COMMIT").execute(&mut locker).await.unwrap();
    // Nothing to restart: the circuit's next probe finds the store answering again.
    eventually(Duration::from_secs(5), "ingest recovers", || async {
        ingest().await.status == StatusCode::ACCEPTED
    })
    .await;
    eventually(Duration::from_secs(5), "reads decide from the store again", || async {
        let metrics = replica.get("/metrics", None).await.body.as_str().unwrap().to_owned();
        metrics.contains("plexsphere_rate_budget_fallback_active{scope=\"secret_read_node\"} 0")
    })
    .await;
    assert_eq!(replica.get("/v1/secrets/key", Some(&token)).await.status, StatusCode::OK);
    replica.stop().await;
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn retry_after_is_exact_at_token_boundaries(_: PgPoolOptions, connect: PgConnectOptions) {
    let clock = Arc::new(ManualClock::new(instant()));
    // One read every two seconds, two back to back.
    let knobs =
        [("PLEXSPHERE_SECRET_READ_NODE_PER_SECOND", "0.5"), ("PLEXSPHERE_SECRET_READ_NODE_BURST", "2")];
    let replica = Replica::start(config(&connect, &knobs), clock.clone()).await;
    let domain = replica.create_domain("d", None).await;
    let (_, token) = replica.enrol(&domain, "n").await;
    replica.put_secret(&domain, "key", "value").await;
    let read = || replica.get("/v1/secrets/key", Some(&token));

    assert_eq!(read().await.status, StatusCode::OK);
    assert_eq!(read().await.status, StatusCode::OK);
    for (advance_ms, retry_after) in [(0, 2), (1000, 1), (999, 1)] {
        clock.advance(chrono::Duration::milliseconds(advance_ms));
        let answer = read().await;
        assert_eq!((answer.status, answer.retry_after), (StatusCode::TOO_MANY_REQUESTS, Some(retry_after)));
    }
    // Exactly two seconds after the burst was spent, one read is covered.
    clock.advance(chrono::Duration::milliseconds(1));
    assert_eq!(read().await.status, StatusCode::OK);

    // Told to wait 2 s, a client that waits exactly 2 s is admitted.
    let answer = read().await;
    assert_eq!(answer.retry_after, Some(2));
    clock.advance(chrono::Duration::seconds(2));
    assert_eq!(read().await.status, StatusCode::OK);
    replica.stop().await;
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn budgeted_responses_carry_the_binding_budgets_ratelimit_fields(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let clock = Arc::new(ManualClock::new(instant()));
    // The Domain has more reads left than the Node until the Node has spent 3 of its 20.
    let knobs =
        [("PLEXSPHERE_SECRET_READ_DOMAIN_PER_SECOND", "10"), ("PLEXSPHERE_SECRET_READ_DOMAIN_BURST", "20")];
    let replica = Replica::start(config(&connect, &knobs), clock.clone()).await;
    let domain = replica.create_domain("d", None).await;
    let (_, first) = replica.enrol(&domain, "first").await;
    let (_, second) = replica.enrol(&domain, "second").await;
    replica.put_secret(&domain, "key", "value").await;

    let answer = replica.get("/v1/secrets/key", Some(&first)).await;
    assert_eq!(answer.status, StatusCode::OK);
    // 19 left of each: a tie, reported as the Node's.
    assert_eq!(answer.header("ratelimit-policy"), Some("\"secret_read_node\";q=20;w=2"));
    assert_eq!(answer.header("ratelimit"), Some("\"secret_read_node\";r=19;t=1"));

    for _ in 0..3 {
        replica.get("/v1/secrets/key", Some(&second)).await;
    }
    // The first Node has 18 left after this read, its Domain 15: the Domain binds.
    let answer = replica.get("/v1/secrets/key", Some(&first)).await;
    assert_eq!(answer.header("ratelimit-policy"), Some("\"secret_read_domain\";q=20;w=2"));
    assert_eq!(answer.header("ratelimit"), Some("\"secret_read_domain\";r=15;t=1"));

    for _ in 0..15 {
        replica.get("/v1/secrets/key", Some(&second)).await;
    }
    let refused = replica.get("/v1/secrets/key", Some(&first)).await;
    assert_eq!(
        (refused.status, refused.code()),
        (StatusCode::TOO_MANY_REQUESTS, "domain_secret_read_rate_limited")
    );
    // Empty, 20 tokens at 10 a second: full in 2 s.
    assert_eq!(refused.header("ratelimit"), Some("\"secret_read_domain\";r=0;t=2"));
    assert_eq!(refused.header("ratelimit-policy"), Some("\"secret_read_domain\";q=20;w=2"));

    // Unbudgeted routes carry none.
    assert_eq!(replica.get("/healthz", None).await.header("ratelimit"), None);
    replica.stop().await;
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_reset_through_one_replica_clears_every_replicas_precheck(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let clock = Arc::new(ManualClock::new(instant()));
    let knobs = [("PLEXSPHERE_SECRET_READ_NODE_BURST", "2")];
    let a = Replica::start(config(&connect, &knobs), clock.clone()).await;
    let b = Replica::start(config(&connect, &knobs), clock.clone()).await;
    let domain = a.create_domain("d", None).await;
    let (node, token) = a.enrol(&domain, "n").await;
    a.put_secret(&domain, "key", "value").await;
    for _ in 0..2 {
        assert_eq!(b.get("/v1/secrets/key", Some(&token)).await.status, StatusCode::OK);
    }
    // B's pre-check now knows the bucket is empty, and the clock stands still.
    assert_eq!(b.get("/v1/secrets/key", Some(&token)).await.status, StatusCode::TOO_MANY_REQUESTS);

    let reset = a.operator(Method::DELETE, &format!("/v1/budgets/secret_read_node/{node}"), None).await;
    assert_eq!((reset.status, reset.body.clone()), (StatusCode::OK, serde_json::json!({ "existed": true })));
    eventually(Duration::from_secs(2), "B hears of the reset", || async {
        b.get("/v1/secrets/key", Some(&token)).await.status == StatusCode::OK
    })
    .await;
    assert_eq!(b.get("/v1/secrets/key", Some(&token)).await.status, StatusCode::OK, "minted full: two reads");
    assert_eq!(b.get("/v1/secrets/key", Some(&token)).await.status, StatusCode::TOO_MANY_REQUESTS);

    let again = a
        .operator(Method::DELETE, &format!("/v1/budgets/secret_read_node/{}", uuid::Uuid::new_v4()), None)
        .await;
    assert_eq!(again.body, serde_json::json!({ "existed": false }));
    let bad = a.operator(Method::DELETE, &format!("/v1/budgets/secret_read_cluster/{node}"), None).await;
    assert_eq!((bad.status, bad.code()), (StatusCode::BAD_REQUEST, "bad_request"));
    a.stop().await;
    b.stop().await;
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn metrics_name_every_outcome_duration_and_pool(_: PgPoolOptions, connect: PgConnectOptions) {
    let clock = Arc::new(ManualClock::new(instant()));
    let replica =
        Replica::start(config(&connect, &[("PLEXSPHERE_SECRET_READ_NODE_BURST", "1")]), clock).await;
    let domain = replica.create_domain("d", None).await;
    let (_, token) = replica.enrol(&domain, "n").await;
    replica.put_secret(&domain, "key", "value").await;
    replica.get("/v1/secrets/key", Some(&token)).await;
    replica.get("/v1/secrets/key", Some(&token)).await;
    let metrics = replica.get("/metrics", None).await.body.as_str().unwrap().to_owned();
    for expected in [
        "plexsphere_rate_budget_decisions_total{scope=\"secret_read_node\",outcome=\"granted\"} 1",
        "plexsphere_rate_budget_decisions_total{scope=\"secret_read_node\",outcome=\"precheck_refused\"} 1",
        "plexsphere_rate_budget_take_duration_seconds_count{scope=\"secret_read_node\"} 2",
        "plexsphere_rate_budget_fallback_active{scope=\"ingest_domain\"} 0",
        "plexsphere_db_connections_in_use{pool=\"limiter\"}",
        "plexsphere_db_connections_waiting{pool=\"limiter\"} 0",
        "plexsphere_db_connections_in_use{pool=\"api\"}",
    ] {
        assert!(metrics.contains(expected), "missing {expected} in\n{metrics}");
    }
    replica.stop().await;
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn an_open_circuit_whose_probe_lost_its_client_returns_to_the_store_and_admits_the_burst_again(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    // Issue 20's acceptance. Secret reads fail OPEN; the table is locked, so replica A's takes
    // time out and its circuit opens; the client of the take that probes the store hangs up
    // mid-take; the lock is released. Before the fix A never asked the store again (the probe's
    // mark stayed), admitting every read without limit.
    let clock = Arc::new(ManualClock::new(instant()));
    let knobs = [
        ("PLEXSPHERE_DECISION_TIMEOUT_MS", "250"),
        ("PLEXSPHERE_SECRET_READ_NODE_FAIL_MODE", "open"),
        ("PLEXSPHERE_SECRET_READ_DOMAIN_FAIL_MODE", "open"),
    ];
    let wiring = || Wiring { time: TimeSource::Given(clock.clone()), leader_timing: QUIET_LEADER };
    let a = Replica::start_with(config(&connect, &knobs), wiring()).await;
    let b = Replica::start_with(config(&connect, &knobs), wiring()).await;
    let domain = a.create_domain("d", None).await;
    let (_, outage) = a.enrol(&domain, "read-during-the-outage").await;
    let (_, traffic) = a.enrol(&domain, "read-after-it").await;
    let (_, counted) = a.enrol(&domain, "counted").await;
    a.put_secret(&domain, "key", "value").await;

    let mut locker = PgConnection::connect_with(&connect).await.unwrap();
    sqlx::query("BEGIN").execute(&mut locker).await.unwrap();
    sqlx::query("LOCK TABLE plexsphere.rate_budgets IN ACCESS EXCLUSIVE MODE")
        .execute(&mut locker)
        .await
        .unwrap();
    for _ in 0..3 {
        assert_eq!(a.get("/v1/secrets/key", Some(&outage)).await.status, StatusCode::OK, "admitted open");
    }
    let failing = "plexsphere_rate_budget_fallback_active{scope=\"secret_read_node\"}";
    assert_eq!(a.metric(failing).await, Some(1.0));

    // While the circuit is open, reads skip the store at once; the one that probes waits on
    // the table, and its client hangs up on it.
    let impatient = reqwest::Client::builder().timeout(Duration::from_millis(150)).build().unwrap();
    let url = format!("{}/v1/secrets/key", a.base());
    let errors = "plexsphere_rate_budget_decisions_total{scope=\"secret_read_node\",outcome=\"error\"}";
    let errors_before = a.metric(errors).await.unwrap_or(0.0);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        assert!(Instant::now() < deadline, "no read probed the store");
        match impatient.get(&url).bearer_auth(&outage).send().await {
            Ok(answer) => assert_eq!(answer.status(), StatusCode::OK),
            Err(error) if error.is_timeout() => break,
            Err(error) => panic!("{error}"),
        }
    }
    // The replica dropped that take undecided (it counts it as an error).
    eventually(Duration::from_secs(2), "the hung-up probe is dropped", || async {
        a.metric(errors).await.unwrap_or(0.0) > errors_before
    })
    .await;
    sqlx::query("COMMIT").execute(&mut locker).await.unwrap();

    // Within two seconds A decides from the store again...
    eventually(Duration::from_secs(2), "replica A asks the store again", || async {
        assert_eq!(a.get("/v1/secrets/key", Some(&traffic)).await.status, StatusCode::OK);
        a.metric(failing).await == Some(0.0)
    })
    .await;
    // ...and a Node is admitted exactly its burst of 20 across both replicas.
    let mut admitted = 0;
    for i in 0..30 {
        let replica = if i % 2 == 0 { &a } else { &b };
        let answer = replica.get("/v1/secrets/key", Some(&counted)).await;
        match answer.status {
            StatusCode::OK => admitted += 1,
            StatusCode::TOO_MANY_REQUESTS => {}
            _ => panic!("{answer:?}"),
        }
    }
    assert_eq!(admitted, 20);
    a.stop().await;
    b.stop().await;
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_replica_whose_first_load_of_the_rules_outlasts_the_database_time_tries_again_before_it_serves(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    // Another session holds the rules table a little longer than one database time (1 s
    // here), as a busy server answering a new replica's first statements late would. The
    // replica must come up with its rules loaded: ready, and deciding from its first request,
    // not answering 500 until its listener loads them.
    let mut locker = PgConnection::connect_with(&connect).await.unwrap();
    sqlx::query("BEGIN").execute(&mut locker).await.unwrap();
    sqlx::query("LOCK TABLE plexsphere.rules IN ACCESS EXCLUSIVE MODE").execute(&mut locker).await.unwrap();
    let release = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(1200)).await;
        sqlx::query("COMMIT").execute(&mut locker).await.unwrap();
        locker
    });

    let clock = Arc::new(ManualClock::new(instant()));
    let replica = Replica::start_with(
        config(&connect, &[]),
        Wiring { time: TimeSource::Given(clock), leader_timing: QUIET_LEADER },
    )
    .await;
    let ready = replica.get("/readyz", None).await;
    assert_eq!(ready.status, StatusCode::OK, "{ready:?}");
    let domain = replica.create_domain("d", None).await;
    let (_, token) = replica.enrol(&domain, "n").await;
    let answer = replica.request(Method::POST, "/v1/ingest", Some(&token), Some(b"cpu=1".to_vec())).await;
    assert_eq!(answer.status, StatusCode::ACCEPTED, "{answer:?}");
    drop(release.await.unwrap());
    replica.stop().await;
}
