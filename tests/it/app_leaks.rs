//! Nothing leaks: a full scenario with every log line captured at debug level, and no token,
//! secret value or key may appear in the logs, in an error body or in the metrics.

use std::sync::Arc;

use ratebudget::ManualClock;
use reqwest::{Method, StatusCode};
use serde_json::json;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;

use crate::support::helpers::instant;
use crate::support::logs::Logs;
use crate::support::replicas::{config, Answer, Replica};

/// Base64 of 32 bytes of 0x5c and of 0x6d: the keys of this scenario.
const OLD_KEY: &str = "XFxcXFxcXFxcXFxcXFxcXFxcXFxcXFxcXFxcXFxcXFw=";
const NEW_KEY: &str = "bW1tbW1tbW1tbW1tbW1tbW1tbW1tbW1tbW1tbW1tbW0=";

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn no_token_secret_value_or_key_reaches_the_logs_error_bodies_or_metrics(
    pool_options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let (logs, _guard) = Logs::capture_this_thread(tracing::Level::DEBUG);
    let pool: PgPool = pool_options.connect_with(connect.clone()).await.unwrap();
    let alice = format!("alice-{}", uuid::Uuid::new_v4().simple());
    let bob = format!("bob-{}", uuid::Uuid::new_v4().simple());
    let value = format!("the-secret-value-{}", uuid::Uuid::new_v4().simple());
    let operators = format!("alice:{alice},bob:{bob}");
    let knobs = |key: &'static str, old: &'static str| {
        config(
            &connect,
            &[
                ("PLEXSPHERE_OPERATOR_TOKENS", operators.as_str()),
                ("PLEXSPHERE_SECRETS_KEY", key),
                ("PLEXSPHERE_SECRETS_OLD_KEYS", old),
                ("PLEXSPHERE_SECRET_READ_NODE_BURST", "3"),
            ],
        )
    };
    let clock = Arc::new(ManualClock::new(instant()));
    let mut answers: Vec<Answer> = Vec::new();

    // Before the rotation: a Domain, a Node, a secret sealed under the old key, reads until
    // refused, a batch, bad input of every kind, and tokens that are almost right.
    let replica = Replica::start(knobs(OLD_KEY, ""), clock.clone()).await;
    let as_alice = |method: Method, path: String, body: Option<serde_json::Value>| {
        let token = alice.clone();
        let replica = &replica;
        async move {
            replica.request(method, &path, Some(&token), body.map(|body| body.to_string().into_bytes())).await
        }
    };
    let domain = as_alice(Method::POST, "/v1/domains".into(), Some(json!({ "name": "acme" }))).await;
    let domain = domain.body["id"].as_str().unwrap().to_owned();
    let enrolled =
        as_alice(Method::POST, format!("/v1/domains/{domain}/nodes"), Some(json!({ "name": "n" }))).await;
    let (node, token) = (
        enrolled.body["id"].as_str().unwrap().to_owned(),
        enrolled.body["token"].as_str().unwrap().to_owned(),
    );
    let put = format!("/v1/domains/{domain}/secrets/db-password");
    answers.push(as_alice(Method::PUT, put.clone(), Some(json!({ "value": value }))).await);
    for _ in 0..5 {
        answers.push(replica.get("/v1/secrets/db-password", Some(&token)).await);
    }
    assert!(answers.iter().any(|answer| answer.status == StatusCode::TOO_MANY_REQUESTS));
    answers.push(
        replica.request(Method::POST, "/v1/ingest", Some(&token), Some(value.clone().into_bytes())).await,
    );
    // The operator page's views name Nodes and Domains and count decisions, never a token.
    answers.push(as_alice(Method::GET, "/v1/status".into(), None).await);
    answers.push(as_alice(Method::GET, format!("/v1/fill/{node}"), None).await);
    for bearer in
        [format!("{token}x"), token[..token.len() - 1].to_owned(), format!("{alice}x"), alice[1..].to_owned()]
    {
        answers.push(replica.get("/v1/secrets/db-password", Some(&bearer)).await);
        answers.push(replica.request(Method::GET, "/v1/audit", Some(&bearer), None).await);
    }
    answers.push(as_alice(Method::PUT, put.clone(), Some(json!({ "value": format!("{value}\u{0}") }))).await);
    answers.push(as_alice(Method::PUT, put.clone(), Some(json!({ "valeur": value }))).await);
    answers.push(
        replica
            .request(Method::PUT, &put, Some(&alice), Some(format!("{{\"value\": \"{value}").into_bytes()))
            .await,
    );
    replica.stop().await;

    // The rotation: a new key, the old one only opening, then rekey, then a 500 whose cause is
    // in the log (the secret table gone).
    let mut printed = Vec::new();
    let keys = app::config::SecretsKeys {
        secrets_key: Some(NEW_KEY.to_owned()),
        secrets_old_keys: Some(OLD_KEY.to_owned()),
    };
    app::cli::rekey_secrets(connect.clone(), keys.keyring().unwrap(), 10, &mut printed).await.unwrap();
    // Time passes: the Node's reads are refilled.
    clock.advance(chrono::TimeDelta::seconds(60));
    let replica = Replica::start(knobs(NEW_KEY, OLD_KEY), clock).await;
    let read = replica.get("/v1/secrets/db-password", Some(&token)).await;
    assert_eq!(read.body["value"], value.as_str(), "{read:?}");
    answers.push(
        replica
            .request(Method::DELETE, &format!("/v1/domains/{domain}/nodes/{node}"), Some(&bob), None)
            .await,
    );
    answers.push(replica.get("/v1/secrets/db-password", Some(&token)).await);
    sqlx::query("ALTER TABLE plexsphere.secrets RENAME TO secrets_gone").execute(&pool).await.unwrap();
    answers.push(
        replica
            .request(Method::PUT, &put, Some(&bob), Some(json!({ "value": value }).to_string().into_bytes()))
            .await,
    );
    assert!(answers.iter().any(|answer| answer.status == StatusCode::INTERNAL_SERVER_ERROR));
    let audit = replica.request(Method::GET, "/v1/audit", Some(&bob), None).await;
    let metrics = replica.get("/metrics", None).await;
    replica.stop().await;

    let logged = logs.text();
    // The capture saw the scenario, at debug level, with its callers named.
    assert!(
        logged.contains("DEBUG") && logged.contains("operator=alice") && logged.contains(&node),
        "{logged}"
    );
    let error_bodies: Vec<String> = answers
        .iter()
        .filter(|answer| !answer.status.is_success())
        .map(|answer| answer.body.to_string())
        .collect();
    assert!(error_bodies.len() >= 10, "{error_bodies:#?}");
    let places = [
        ("the logs", logged),
        ("an error body", error_bodies.join("\n")),
        ("the metrics", metrics.body.to_string()),
        ("the audit log", audit.body.to_string()),
        ("the rekey's output", String::from_utf8(printed).unwrap()),
    ];
    let secrets = [
        ("the node token", token.as_str()),
        ("the node token's random part", &token[4..]),
        ("alice's token", alice.as_str()),
        ("bob's token", bob.as_str()),
        ("the secret value", value.as_str()),
        ("the old key", OLD_KEY),
        ("the new key", NEW_KEY),
        ("the old key's bytes", "5c5c5c5c5c5c5c5c"),
        ("the new key's bytes", "6d6d6d6d6d6d6d6d"),
    ];
    for (place, text) in &places {
        for (what, secret) in &secrets {
            assert!(!text.contains(secret), "{what} appears in {place}");
        }
    }
}
