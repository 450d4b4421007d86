//! Two replicas of the application on one database: they share every budget, exactly one
//! leads, and the leader sweeps.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use ratebudget::{Clock, ManualClock, SystemClock};
use reqwest::{Method, StatusCode};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;

use crate::support::helpers::instant;
use crate::support::replicas::{config, eventually, leader_backend, Replica};

async fn two_replicas(
    connect: &PgConnectOptions,
    knobs: &[(&str, &str)],
    clock: Arc<dyn Clock>,
) -> [Replica; 2] {
    [
        Replica::start(config(connect, knobs), clock.clone()).await,
        Replica::start(config(connect, knobs), clock).await,
    ]
}

async fn count_rows(pool: &PgPool, scope: &str, key: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM plexsphere.rate_budgets WHERE scope = $1 AND bucket_key = $2::uuid",
    )
    .bind(scope)
    .bind(key)
    .fetch_one(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn concurrent_secret_reads_through_two_replicas_admit_exactly_the_nodes_burst(
    pool_options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let pool = pool_options.connect_with(connect.clone()).await.unwrap();
    // The clock stands still, so nothing refills while the reads race: the burst is all there is.
    let clock = Arc::new(ManualClock::new(instant()));
    let [a, b] = two_replicas(
        &connect,
        &[("PLEXSPHERE_SECRET_READ_NODE_BURST", "7"), ("PLEXSPHERE_SECRET_READ_DOMAIN_BURST", "1000")],
        clock,
    )
    .await;
    let domain = a.create_domain("fleet", None).await;
    let (node, token) = a.enrol(&domain, "node-1").await;
    b.put_secret(&domain, "db-password", "hunter2").await;

    let reads = (0..40).map(|i| {
        let replica = if i % 2 == 0 { &a } else { &b };
        replica.get("/v1/secrets/db-password", Some(&token))
    });
    let answers = futures::future::join_all(reads).await;
    let granted: Vec<_> = answers.iter().filter(|answer| answer.status == StatusCode::OK).collect();
    let refused: Vec<_> =
        answers.iter().filter(|answer| answer.status == StatusCode::TOO_MANY_REQUESTS).collect();
    assert_eq!(granted.len(), 7, "{answers:?}");
    assert_eq!(refused.len(), 33, "{answers:?}");
    assert_eq!(granted[0].body["value"], "hunter2");
    for answer in &refused {
        assert_eq!(answer.code(), "node_secret_read_rate_limited");
        // Default rate 10/s: one read is covered within 0.1 s, so the header says 1.
        assert_eq!(answer.retry_after, Some(1));
    }
    assert_eq!(count_rows(&pool, "secret_read_node", &node).await, 1);
    assert_eq!(count_rows(&pool, "secret_read_domain", &domain).await, 1);

    a.stop().await;
    b.stop().await;
}

async fn enrol(replica: &Replica, domain: &str, i: usize) -> crate::support::replicas::Answer {
    let path = format!("/v1/domains/{domain}/nodes");
    replica.operator(Method::POST, &path, Some(serde_json::json!({ "name": format!("node-{i}") }))).await
}

async fn post(replica: &Replica, token: &str, bytes: usize) -> crate::support::replicas::Answer {
    replica.request(Method::POST, "/v1/ingest", Some(token), Some(vec![b'x'; bytes])).await
}

async fn swept(replica: &Replica) -> bool {
    let text = replica.get("/metrics", None).await.body.as_str().unwrap().to_owned();
    text.lines().any(|line| line.starts_with("plexsphere_rate_budget_sweeps_total{outcome=\"ok\"}"))
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn issuance_follows_a_domains_own_policy_and_the_default_otherwise(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let clock = Arc::new(ManualClock::new(instant()));
    let [a, b] = two_replicas(
        &connect,
        &[("PLEXSPHERE_ACCESS_ISSUANCE_PER_SECOND", "0.5"), ("PLEXSPHERE_ACCESS_ISSUANCE_BURST", "3")],
        clock.clone(),
    )
    .await;
    let own = a.create_domain("own-policy", Some((0.25, 2.0))).await;
    let default = a.create_domain("default-policy", None).await;

    // Alternate replicas: the budget is the Domain's, not a replica's.
    for i in 0..2 {
        assert_eq!(enrol(if i % 2 == 0 { &a } else { &b }, &own, i).await.status, StatusCode::CREATED);
    }
    let refused = enrol(&b, &own, 2).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS, "{refused:?}");
    assert_eq!(refused.code(), "issuance_rate_limited");
    assert_eq!(refused.retry_after, Some(4), "one issuance at 0.25/s");

    for i in 0..3 {
        assert_eq!(enrol(if i % 2 == 0 { &a } else { &b }, &default, i).await.status, StatusCode::CREATED);
    }
    let refused = enrol(&a, &default, 3).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.retry_after, Some(2), "one issuance at the default 0.5/s");

    // After four seconds each has refilled one issuance, and only one.
    clock.advance(chrono::Duration::seconds(4));
    assert_eq!(enrol(&a, &own, 10).await.status, StatusCode::CREATED);
    assert_eq!(enrol(&b, &own, 11).await.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(enrol(&a, &default, 10).await.status, StatusCode::CREATED);
    assert_eq!(enrol(&b, &default, 11).await.status, StatusCode::CREATED);
    assert_eq!(enrol(&a, &default, 12).await.status, StatusCode::TOO_MANY_REQUESTS);

    a.stop().await;
    b.stop().await;
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn ingest_spends_wire_bytes_from_the_node_and_domain_quotas(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let clock = Arc::new(ManualClock::new(instant()));
    let [a, b] = two_replicas(
        &connect,
        &[
            ("PLEXSPHERE_INGEST_NODE_BYTES_PER_SECOND", "100"),
            ("PLEXSPHERE_INGEST_NODE_BYTES_BURST", "1000"),
            ("PLEXSPHERE_INGEST_DOMAIN_BYTES_PER_SECOND", "100"),
            ("PLEXSPHERE_INGEST_DOMAIN_BYTES_BURST", "1500"),
            ("PLEXSPHERE_INGEST_MAX_BATCH_BYTES", "1000"),
        ],
        clock.clone(),
    )
    .await;
    let domain = a.create_domain("telemetry", None).await;
    let (node, token) = a.enrol(&domain, "node-1").await;
    let (_, other_token) = a.enrol(&domain, "node-2").await;

    let accepted = post(&a, &token, 600).await;
    assert_eq!(accepted.status, StatusCode::ACCEPTED, "{accepted:?}");
    assert_eq!(accepted.body["bytes"], 600);
    let refused = post(&b, &token, 500).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.code(), "node_ingest_quota_exceeded");
    assert_eq!(refused.retry_after, Some(1), "the 100 bytes missing at 100 bytes/s");
    assert_eq!(post(&b, &token, 400).await.status, StatusCode::ACCEPTED);

    // The node is spent to the byte; the domain has 500 of its 1500 left.
    let budgets = a.operator(Method::GET, &format!("/v1/budgets/{node}"), None).await;
    assert_eq!(
        budgets.body,
        serde_json::json!([{ "scope": "ingest_node", "tokens": 0.0, "refilled_at": "2026-11-30T12:00:00Z" }])
    );
    let refused = post(&a, &other_token, 600).await;
    assert_eq!(refused.code(), "domain_ingest_quota_exceeded", "{refused:?}");
    assert_eq!(post(&a, &other_token, 500).await.status, StatusCode::ACCEPTED);

    let too_large = post(&a, &token, 1001).await;
    assert_eq!(too_large.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(too_large.code(), "payload_too_large");

    a.stop().await;
    b.stop().await;
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn exactly_one_replica_leads_and_leadership_moves_when_it_stops(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let [a, b] = two_replicas(&connect, &[], Arc::new(SystemClock)).await;
    let within = Duration::from_secs(10);
    eventually(within, "one replica leads", || async {
        a.leadership.is_leader() || b.leadership.is_leader()
    })
    .await;
    // A few more elections go by; the follower must stay a follower while the leader lives.
    for _ in 0..5 {
        let gauges = (a.leader_gauge().await, b.leader_gauge().await);
        assert!(gauges == (1, 0) || gauges == (0, 1), "gauges {gauges:?}");
        assert_eq!(a.leadership.is_leader(), gauges.0 == 1);
        tokio::time::sleep(crate::support::replicas::FAST_LEADER.retry).await;
    }

    let (leader, mut follower) = if a.leadership.is_leader() { (a, b) } else { (b, a) };
    leader.stop().await;
    tokio::time::timeout(within, follower.leadership.wait_until(true))
        .await
        .expect("the follower takes over");
    assert_eq!(follower.leader_gauge().await, 1);

    // And a replica that joins later follows.
    let late = Replica::start(config(&connect, &[]), Arc::new(SystemClock)).await;
    for _ in 0..3 {
        tokio::time::sleep(crate::support::replicas::FAST_LEADER.retry).await;
        assert_eq!(late.leader_gauge().await, 0);
    }
    follower.stop().await;
    late.stop().await;
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn when_the_leaders_session_dies_another_replica_leads_within_15_s_on_production_timing(
    pool_options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let pool = pool_options.connect_with(connect.clone()).await.unwrap();
    let start = || Replica::start_with(config(&connect, &[]), app::startup::Wiring::production());
    let (a, b) = (start().await, start().await);
    let within = Duration::from_secs(15);
    eventually(within, "one replica leads", || async {
        a.leadership.is_leader() || b.leadership.is_leader()
    })
    .await;
    let (leader, mut follower) = if a.leadership.is_leader() { (a, b) } else { (b, a) };
    let session = leader_backend(&pool).await.expect("the leader holds the lock");

    // The server ends the leader's session, as it would for a crashed connection or an
    // operator's pg_terminate_backend; the replica itself keeps running.
    let terminated: bool =
        sqlx::query_scalar("SELECT pg_terminate_backend($1)").bind(session).fetch_one(&pool).await.unwrap();
    assert!(terminated);
    let mut old = leader.leadership.clone();
    tokio::time::timeout(within, old.wait_until(false)).await.expect("the old leader stops claiming");
    tokio::time::timeout(within, follower.leadership.wait_until(true))
        .await
        .expect("the follower takes over");
    assert_eq!(leader.leader_gauge().await, 0);
    assert_eq!(follower.leader_gauge().await, 1);
    assert_ne!(leader_backend(&pool).await, Some(session));

    leader.stop().await;
    follower.stop().await;
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn the_leaders_sweep_deletes_buckets_idle_for_over_an_hour_and_keeps_the_rest(
    pool_options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let pool = pool_options.connect_with(connect.clone()).await.unwrap();
    let now = Utc::now();
    let insert = |scope: &'static str, idle: chrono::Duration| {
        let key = uuid::Uuid::new_v4();
        let pool = pool.clone();
        async move {
            sqlx::query("INSERT INTO plexsphere.rate_budgets VALUES ($1, $2, 1, $3)")
                .bind(scope)
                .bind(key)
                .bind(now - idle)
                .execute(&pool)
                .await
                .unwrap();
            key
        }
    };
    let stale = [
        insert("ingest_node", chrono::Duration::hours(2)).await,
        insert("secret_read_domain", chrono::Duration::minutes(61)).await,
    ];
    let fresh = [
        insert("ingest_node", chrono::Duration::minutes(59)).await,
        insert("secret_read_node", chrono::Duration::seconds(1)).await,
    ];

    let [a, b] =
        two_replicas(&connect, &[("PLEXSPHERE_SWEEP_INTERVAL_SECS", "1")], Arc::new(SystemClock)).await;
    let remaining = || async {
        sqlx::query_scalar::<_, uuid::Uuid>("SELECT bucket_key FROM plexsphere.rate_budgets")
            .fetch_all(&pool)
            .await
            .unwrap()
    };
    eventually(Duration::from_secs(15), "the stale buckets are swept", || async {
        remaining().await.len() == fresh.len()
    })
    .await;
    let mut left = remaining().await;
    left.sort();
    let mut expected = fresh.to_vec();
    expected.sort();
    assert_eq!(left, expected);
    assert!(stale.iter().all(|key| !left.contains(key)));

    // Only the leader swept: the follower's sweep counter never moved.
    let (leader, follower) = if a.leadership.is_leader() { (&a, &b) } else { (&b, &a) };
    // The sweep counts itself once its whole pass is done (rule usage is pruned after the
    // buckets), so the buckets may be gone a moment before the counter moves.
    eventually(Duration::from_secs(15), "the leader counts its sweep", || swept(leader)).await;
    assert!(!swept(follower).await);

    a.stop().await;
    b.stop().await;
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_secret_read_again_costs_no_round_trip_and_a_change_reaches_every_replica(
    pool_options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let pool = pool_options.connect_with(connect.clone()).await.unwrap();
    let [a, b] = two_replicas(&connect, &[], Arc::new(SystemClock)).await;
    let domain = a.create_domain("d", None).await;
    let (_, token) = a.enrol(&domain, "n").await;
    a.put_secret(&domain, "db-password", "first").await;
    eventually(Duration::from_secs(5), "B hears of changed secrets", || async {
        b.metric("plexsphere_secret_change_listener_connected").await == Some(1.0)
    })
    .await;
    let read = || b.get("/v1/secrets/db-password", Some(&token));
    assert_eq!(read().await.body["value"], "first");

    // With the table out of reach, B still answers from what it read: no round trip.
    sqlx::query("ALTER TABLE plexsphere.secrets RENAME TO secrets_away").execute(&pool).await.unwrap();
    let cached = read().await;
    assert_eq!((cached.status, cached.body["value"].as_str()), (StatusCode::OK, Some("first")));
    sqlx::query("ALTER TABLE plexsphere.secrets_away RENAME TO secrets").execute(&pool).await.unwrap();

    // A write through A is announced; B reads the new value within a second.
    a.put_secret(&domain, "db-password", "second").await;
    eventually(Duration::from_secs(1), "B reads the new value", || async {
        read().await.body["value"] == "second"
    })
    .await;
    a.stop().await;
    b.stop().await;
}
