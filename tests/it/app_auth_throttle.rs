//! Failed authentications throttled per client address across replicas: a flood of made-up
//! tokens costs the database next to nothing, and valid callers are never throttled.

use std::sync::Arc;
use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ratebudget::ManualClock;
use reqwest::StatusCode;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection};

use crate::support::helpers::instant;
use crate::support::replicas::{config, Replica, OPERATOR_TOKEN};

/// Replicas behind a proxy on loopback, whose X-Forwarded-For is believed; reads budgets large
/// enough never to bind, and the default failure budget (20, then one every 5 s).
const KNOBS: [(&str, &str); 3] = [
    ("PLEXSPHERE_TRUSTED_PROXIES", "127.0.0.1"),
    ("PLEXSPHERE_SECRET_READ_NODE_BURST", "1000"),
    ("PLEXSPHERE_SECRET_READ_DOMAIN_BURST", "2000"),
];

/// A token of the right shape that was never issued.
fn made_up_token() -> String {
    format!("psn_{}", URL_SAFE_NO_PAD.encode(rand::random::<[u8; 32]>()))
}

/// Index scans on the credentials' token index so far: one per credential lookup. Read after
/// every replica stopped, since a backend publishes its counts when it exits.
async fn credential_lookups(connect: &PgConnectOptions) -> i64 {
    let mut connection = PgConnection::connect_with(connect).await.unwrap();
    let others = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()";
    crate::support::replicas::eventually(Duration::from_secs(10), "every other session ends", || async {
        let mut connection = PgConnection::connect_with(connect).await.unwrap();
        sqlx::query_scalar::<_, i64>(others).fetch_one(&mut connection).await.unwrap() <= 1
    })
    .await;
    sqlx::query_scalar(
        "SELECT idx_scan FROM pg_stat_user_indexes WHERE schemaname = 'plexsphere' AND indexrelname = 'nodes_token_hash_key'",
    )
    .fetch_one(&mut connection)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn two_thousand_made_up_tokens_from_one_address_cost_at_most_the_burst_and_fifty_lookups(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let clock = Arc::new(ManualClock::new(instant()));
    let a = Replica::start(config(&connect, &KNOBS), clock.clone()).await;
    let b = Replica::start(config(&connect, &KNOBS), clock.clone()).await;
    let domain = a.create_domain("d", None).await;
    let (_, valid) = a.enrol(&domain, "n").await;
    a.put_secret(&domain, "key", "value").await;

    let mut answers = Vec::new();
    for i in 0..2000 {
        let replica = if i % 2 == 0 { &a } else { &b };
        let answer = replica.get_from("/v1/secrets/key", Some(&made_up_token()), "198.51.100.7").await;
        answers.push((answer.status, answer.code().to_owned(), answer.retry_after));
        if i % 50 == 0 {
            // A valid Node on another address reads normally throughout.
            let read = replica.get_from("/v1/secrets/key", Some(&valid), "198.51.100.8").await;
            assert_eq!(read.status, StatusCode::OK, "{read:?}");
        }
    }
    // The clock stands still: exactly the burst of 20 failures, then only refusals.
    let unauthorized =
        answers.iter().take_while(|(status, _, _)| *status == StatusCode::UNAUTHORIZED).count();
    assert_eq!(unauthorized, 20);
    for (status, code, retry_after) in &answers[20..] {
        assert_eq!((*status, code.as_str()), (StatusCode::TOO_MANY_REQUESTS, "auth_rate_limited"));
        assert_eq!(*retry_after, Some(5), "one failure every five seconds");
    }
    a.stop().await;
    b.stop().await;
    let lookups = credential_lookups(&connect).await;
    // At least the 20 failures, each a lookup (so the statistics are really read), and the
    // valid Node's first on each replica; at most the burst and fifty.
    assert!((22..=20 + 50).contains(&lookups), "{lookups} credential lookups for 2,000 made-up tokens");
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn replicas_share_one_failure_budget_per_address_and_never_throttle_a_valid_token(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let clock = Arc::new(ManualClock::new(instant()));
    let knobs =
        [KNOBS[0], ("PLEXSPHERE_AUTH_FAILURE_BURST", "4"), ("PLEXSPHERE_AUTH_FAILURE_PER_SECOND", "0.5")];
    let a = Replica::start(config(&connect, &knobs), clock.clone()).await;
    let b = Replica::start(config(&connect, &knobs), clock.clone()).await;
    let domain = a.create_domain("d", None).await;
    let (_, valid) = a.enrol(&domain, "n").await;
    a.put_secret(&domain, "key", "value").await;
    // B learns the valid token before its address is throttled.
    assert_eq!(b.get_from("/v1/secrets/key", Some(&valid), "203.0.113.1").await.status, StatusCode::OK);

    // Two wrong operator guesses on A, two made-up Node tokens on B: one budget of four.
    let forwarded = "203.0.113.1";
    for replica in [&a, &a] {
        let answer =
            replica.get_from("/v1/budgets/not-a-uuid", Some("not-the-operator-token"), forwarded).await;
        assert_eq!(answer.status, StatusCode::UNAUTHORIZED);
    }
    for replica in [&b, &b] {
        let answer = replica.get_from("/v1/secrets/key", Some(&made_up_token()), forwarded).await;
        assert_eq!(answer.status, StatusCode::UNAUTHORIZED);
    }
    for replica in [&a, &b] {
        let answer = replica.get_from("/v1/secrets/key", Some(&made_up_token()), forwarded).await;
        assert_eq!((answer.status, answer.code()), (StatusCode::TOO_MANY_REQUESTS, "auth_rate_limited"));
        assert_eq!(answer.retry_after, Some(2));
        let answer = replica.get_from("/v1/budgets/not-a-uuid", Some("still-guessing"), forwarded).await;
        assert_eq!(answer.status, StatusCode::TOO_MANY_REQUESTS);
    }
    // The operator's own token and a token B already knows are never throttled.
    let operator = a.get_from(&format!("/v1/budgets/{domain}"), Some(OPERATOR_TOKEN), forwarded).await;
    assert_eq!(operator.status, StatusCode::OK);
    assert_eq!(b.get_from("/v1/secrets/key", Some(&valid), forwarded).await.status, StatusCode::OK);
    // Another address is untouched; and after the wait, the first may try again.
    assert_eq!(
        a.get_from("/v1/secrets/key", Some(&made_up_token()), "203.0.113.2").await.status,
        StatusCode::UNAUTHORIZED
    );
    clock.advance(chrono::Duration::seconds(2));
    assert_eq!(
        b.get_from("/v1/secrets/key", Some(&made_up_token()), forwarded).await.status,
        StatusCode::UNAUTHORIZED
    );

    let metrics = a.get("/metrics", None).await.body.as_str().unwrap().to_owned();
    assert!(
        metrics
            .contains("plexsphere_named_limit_decisions_total{limiter=\"auth_failure\",outcome=\"granted\"}"),
        "{metrics}"
    );
    a.stop().await;
    b.stop().await;
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_throttled_address_is_told_its_failure_budget_and_still_reaches_what_needs_no_credential(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let clock = Arc::new(ManualClock::new(instant()));
    let knobs =
        [KNOBS[0], ("PLEXSPHERE_AUTH_FAILURE_BURST", "2"), ("PLEXSPHERE_AUTH_FAILURE_PER_SECOND", "0.5")];
    let replica = Replica::start(config(&connect, &knobs), clock.clone()).await;
    let guesser = "198.51.100.20";
    let first = replica.get_from("/v1/audit", Some("a-wrong-guess"), guesser).await;
    assert_eq!(first.status, StatusCode::UNAUTHORIZED);
    assert_eq!(first.header("www-authenticate"), Some("Bearer"));
    assert_eq!(first.header("ratelimit"), Some("\"auth_failure\";r=1;t=2"));
    assert_eq!(
        replica.get_from("/v1/audit", Some("a-wrong-guess"), guesser).await.status,
        StatusCode::UNAUTHORIZED
    );

    let refused = replica.get_from("/v1/audit", Some("a-wrong-guess"), guesser).await;
    assert_eq!((refused.status, refused.code()), (StatusCode::TOO_MANY_REQUESTS, "auth_rate_limited"));
    assert_eq!(refused.retry_after, Some(2));
    assert_eq!(refused.header("ratelimit-policy"), Some("\"auth_failure\";q=2;w=4"));
    assert_eq!(refused.header("ratelimit"), Some("\"auth_failure\";r=0;t=4"));
    // Only authenticated routes are throttled: the probes, an unknown route and a wrong method
    // answer as they always do.
    assert_eq!(replica.get_from("/healthz", None, guesser).await.status, StatusCode::OK);
    assert_eq!(
        replica.get_from("/v1/nowhere", Some("a-wrong-guess"), guesser).await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        replica.get_from("/v1/ingest", Some("a-wrong-guess"), guesser).await.status,
        StatusCode::METHOD_NOT_ALLOWED
    );
    replica.stop().await;
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn readiness_probes_the_database_at_most_once_a_second(_: PgPoolOptions, connect: PgConnectOptions) {
    // Count every connection the probe takes from its pool.
    let acquired = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = acquired.clone();
    let pool = PgPoolOptions::new()
        .before_acquire(move |_, _| {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Box::pin(async { Ok(true) })
        })
        .connect_with(connect)
        .await
        .unwrap();
    let readiness = app::runtime::readiness::Readiness::new(pool, Duration::from_secs(1));
    let answers = futures::future::join_all((0..200).map(|_| readiness.check())).await;
    assert!(answers.iter().all(Result::is_ok));
    assert_eq!(acquired.load(std::sync::atomic::Ordering::SeqCst), 1, "200 answers, one probe");
}
