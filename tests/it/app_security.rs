//! The HTTP API under hostile or unlucky requests: every rejection is JSON, a panic is a 500
//! like any other, ambiguous headers are refused, and what carries a credential or a secret is
//! never cached.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use ratebudget::{Clock, ManualClock};
use reqwest::{Method, StatusCode};
use serde_json::json;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::support::helpers::instant;
use crate::support::replicas::{config, Answer, Replica, OPERATOR_TOKEN, SECRETS_KEY};

#[track_caller]
fn check(answer: &Answer, status: StatusCode, code: &str) {
    assert_eq!((answer.status, answer.code()), (status, code), "{answer:?}");
    assert!(answer.body["error"].as_str().is_some_and(|error| !error.is_empty()), "{answer:?}");
}

/// A clock that panics once armed. The limiters read it inside the handler, so arming it
/// makes the next budgeted request's handler panic, as a bug would.
#[derive(Debug)]
struct PanickingClock {
    inner: ManualClock,
    armed: AtomicBool,
}

impl Clock for PanickingClock {
    fn now(&self) -> DateTime<Utc> {
        assert!(!self.armed.load(Ordering::SeqCst), "the clock broke (a test armed it)");
        self.inner.now()
    }
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_handler_that_panics_answers_a_json_500_and_logs_it_once(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let logs = crate::support::logs::Logs::capture();
    let clock =
        Arc::new(PanickingClock { inner: ManualClock::new(instant()), armed: AtomicBool::new(false) });
    let replica = Replica::start(config(&connect, &[]), clock.clone()).await;
    let domain = replica.create_domain("d", None).await;
    let (_, token) = replica.enrol(&domain, "n").await;
    replica.put_secret(&domain, "key", "value").await;

    clock.armed.store(true, Ordering::SeqCst);
    let request_id = uuid::Uuid::new_v4().to_string();
    let answer = replica.get_as_request("/v1/secrets/key", Some(&token), &request_id).await;
    check(&answer, StatusCode::INTERNAL_SERVER_ERROR, "internal");
    assert!(!answer.body.to_string().contains("clock"), "the panic reached the client: {answer:?}");
    let lines = logs.lines_with(&request_id);
    assert_eq!(lines.len(), 1, "one line for the panic: {lines:#?}");
    assert!(lines[0].contains("ERROR") && lines[0].contains("the clock broke"), "{}", lines[0]);
    assert!(lines[0].contains(r#"route="/v1/secrets/{name}""#), "{}", lines[0]);

    // The replica goes on serving.
    clock.armed.store(false, Ordering::SeqCst);
    assert_eq!(replica.get("/v1/secrets/key", Some(&token)).await.status, StatusCode::OK);
    replica.stop().await;
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_doubled_authorization_or_request_id_header_is_refused(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let replica = Replica::start(config(&connect, &[]), Arc::new(ManualClock::new(instant()))).await;
    let operator = format!("Bearer {OPERATOR_TOKEN}");
    let body = Some(json!({ "name": "d" }).to_string().into_bytes());
    for headers in [
        vec![("authorization", operator.as_str()), ("authorization", operator.as_str())],
        vec![("authorization", operator.as_str()), ("authorization", "Bearer someone-else")],
        vec![("authorization", operator.as_str()), ("x-request-id", "a"), ("x-request-id", "b")],
    ] {
        let answer = replica.request_with_headers(Method::POST, "/v1/domains", &headers, body.clone()).await;
        check(&answer, StatusCode::BAD_REQUEST, "bad_request");
    }
    let answer = replica.request_with_headers(Method::POST, "/v1/domains", &[], body).await;
    check(&answer, StatusCode::UNAUTHORIZED, "unauthorized");
    replica.stop().await;
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn responses_carrying_a_token_or_a_secret_are_never_stored(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let replica = Replica::start(config(&connect, &[]), Arc::new(ManualClock::new(instant()))).await;
    let domain = replica.create_domain("d", None).await;
    let enrolment = replica
        .operator(Method::POST, &format!("/v1/domains/{domain}/nodes"), Some(json!({ "name": "n" })))
        .await;
    assert_eq!(enrolment.status, StatusCode::CREATED);
    assert_eq!(enrolment.headers["cache-control"], "no-store");
    let token = enrolment.body["token"].as_str().unwrap();
    replica.put_secret(&domain, "key", "value").await;
    let read = replica.get("/v1/secrets/key", Some(token)).await;
    assert_eq!(read.status, StatusCode::OK);
    assert_eq!(read.headers["cache-control"], "no-store");
    replica.stop().await;
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn secrets_rekey_seals_what_an_earlier_build_stored_in_plain_text(
    pool_options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let pool = pool_options.connect_with(connect.clone()).await.unwrap();
    let domain = uuid::Uuid::new_v4();
    for index in 0..3 {
        sqlx::query("INSERT INTO plexsphere.secrets (domain_id, name, value) VALUES ($1, $2, 'plain')")
            .bind(domain)
            .bind(format!("secret-{index}"))
            .execute(&pool)
            .await
            .unwrap();
    }
    let keys = app::config::SecretsKeys { secrets_key: Some(SECRETS_KEY.to_owned()), secrets_old_keys: None };
    let mut printed = Vec::new();
    app::cli::rekey_secrets(connect.clone(), keys.keyring().unwrap(), 2, &mut printed).await.unwrap();
    let printed = String::from_utf8(printed).unwrap();
    assert!(printed.contains("batch 2: 0 re-sealed from old keys, 1 sealed from plain text"), "{printed}");
    assert!(printed.contains("0 re-sealed, 3 sealed from plain text"), "{printed}");
    let plain: i64 = sqlx::query_scalar("SELECT count(*) FROM plexsphere.secrets WHERE value IS NOT NULL")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(plain, 0);

    // A value under a key neither knob names stops the rekey, naming the knobs.
    let other = app::config::SecretsKeys {
        secrets_key: Some("ERERERERERERERERERERERERERERERERERERERERERE=".to_owned()),
        secrets_old_keys: None,
    };
    let error =
        app::cli::rekey_secrets(connect, other.keyring().unwrap(), 2, &mut Vec::new()).await.unwrap_err();
    let error = format!("{error:#}");
    assert!(error.contains("PLEXSPHERE_SECRETS_OLD_KEYS") && error.contains("secret-0"), "{error}");
}
