//! Revocation and operators: a revoked Node's token stops working on every replica within a
//! second, several named operators act side by side, and every operator action is in the
//! append-only audit log under its operator's name.

use std::sync::Arc;
use std::time::Duration;

use ratebudget::ManualClock;
use reqwest::{Method, StatusCode};
use serde_json::json;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;

use crate::support::helpers::instant;
use crate::support::replicas::{config, eventually, Answer, Replica, OPERATOR_TOKEN};

const ALICE: &str = "alice-token-0123456789abcdef";
const BOB: &str = "bob-token-0123456789abcdef";

#[track_caller]
fn check(answer: &Answer, status: StatusCode, code: &str) {
    assert_eq!((answer.status, answer.code()), (status, code), "{answer:?}");
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_revoked_token_stops_working_on_every_replica_within_a_second(
    pool_options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let pool: PgPool = pool_options.connect_with(connect.clone()).await.unwrap();
    let clock = Arc::new(ManualClock::new(instant()));
    let (a, b) = (
        Replica::start(config(&connect, &[]), clock.clone()).await,
        Replica::start(config(&connect, &[]), clock).await,
    );
    let domain = a.create_domain("d", None).await;
    let (node, token) = a.enrol(&domain, "n").await;
    let (_, other_token) = a.enrol(&domain, "m").await;
    a.put_secret(&domain, "key", "value").await;
    // Each replica's listener is connected, so its cache is in use; each then authenticates the
    // token and holds it for 10 s.
    for replica in [&a, &b] {
        eventually(Duration::from_secs(5), "the revocation listener is connected", || async {
            replica.gauge("plexsphere_revocation_listener_connected").await == 1
        })
        .await;
        assert_eq!(replica.get("/v1/secrets/key", Some(&token)).await.status, StatusCode::OK);
    }

    let revoked = a.operator(Method::DELETE, &format!("/v1/domains/{domain}/nodes/{node}"), None).await;
    assert_eq!(revoked.status, StatusCode::NO_CONTENT, "{revoked:?}");
    // Where it was revoked: at once.
    check(&a.get("/v1/secrets/key", Some(&token)).await, StatusCode::UNAUTHORIZED, "unauthorized");
    // Elsewhere: as soon as the announcement arrives, well within a second, not the cache's 10 s.
    eventually(Duration::from_secs(1), "the other replica refuses the revoked token", || async {
        b.get("/v1/secrets/key", Some(&token)).await.status == StatusCode::UNAUTHORIZED
    })
    .await;
    let answer = b.request(Method::POST, "/v1/ingest", Some(&token), Some(b"x".to_vec())).await;
    check(&answer, StatusCode::UNAUTHORIZED, "unauthorized");
    // The Domain's other Node is untouched.
    assert_eq!(b.get("/v1/secrets/key", Some(&other_token)).await.status, StatusCode::OK);

    // Again, or in another Domain: no such Node.
    let again = b.operator(Method::DELETE, &format!("/v1/domains/{domain}/nodes/{node}"), None).await;
    check(&again, StatusCode::NOT_FOUND, "unknown_node");
    let elsewhere = b.create_domain("e", None).await;
    let (other_node, _) = b.enrol(&domain, "o").await;
    let wrong_domain =
        b.operator(Method::DELETE, &format!("/v1/domains/{elsewhere}/nodes/{other_node}"), None).await;
    check(&wrong_domain, StatusCode::NOT_FOUND, "unknown_node");
    let nodes: i64 =
        sqlx::query_scalar("SELECT count(*) FROM plexsphere.nodes").fetch_one(&pool).await.unwrap();
    assert_eq!(nodes, 2);
    a.stop().await;
    b.stop().await;
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_node_deleted_by_hand_is_revoked_everywhere_too(
    pool_options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let pool: PgPool = pool_options.connect_with(connect.clone()).await.unwrap();
    let replica = Replica::start(config(&connect, &[]), Arc::new(ManualClock::new(instant()))).await;
    let domain = replica.create_domain("d", None).await;
    let (_, token) = replica.enrol(&domain, "n").await;
    replica.put_secret(&domain, "key", "value").await;
    eventually(Duration::from_secs(5), "the revocation listener is connected", || async {
        replica.gauge("plexsphere_revocation_listener_connected").await == 1
    })
    .await;
    assert_eq!(replica.get("/v1/secrets/key", Some(&token)).await.status, StatusCode::OK);
    sqlx::query("TRUNCATE plexsphere.nodes").execute(&pool).await.unwrap();
    eventually(Duration::from_secs(1), "the replica refuses the token", || async {
        replica.get("/v1/secrets/key", Some(&token)).await.status == StatusCode::UNAUTHORIZED
    })
    .await;
    replica.stop().await;
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn named_operators_act_side_by_side_and_each_action_is_audited_under_its_name(
    pool_options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let pool: PgPool = pool_options.connect_with(connect.clone()).await.unwrap();
    let operators = format!("alice:{ALICE},bob:{BOB}");
    let replica = Replica::start(
        config(&connect, &[("PLEXSPHERE_OPERATOR_TOKENS", &operators)]),
        Arc::new(ManualClock::new(instant())),
    )
    .await;
    let as_operator = |token: &'static str, method: Method, path: String, body: Option<serde_json::Value>| {
        let body = body.map(|body| body.to_string().into_bytes());
        let replica = &replica;
        async move { replica.request(method, &path, Some(token), body).await }
    };
    let created = as_operator(ALICE, Method::POST, "/v1/domains".into(), Some(json!({ "name": "d" }))).await;
    assert_eq!(created.status, StatusCode::CREATED);
    let domain = created.body["id"].as_str().unwrap().to_owned();
    let enrolled =
        as_operator(BOB, Method::POST, format!("/v1/domains/{domain}/nodes"), Some(json!({ "name": "n" })))
            .await;
    let (node, token) = (enrolled.body["id"].as_str().unwrap(), enrolled.body["token"].as_str().unwrap());
    let put = as_operator(
        ALICE,
        Method::PUT,
        format!("/v1/domains/{domain}/secrets/db-password"),
        Some(json!({ "value": "hunter2-correct-horse" })),
    )
    .await;
    assert_eq!(put.status, StatusCode::NO_CONTENT);
    let revoked = as_operator(BOB, Method::DELETE, format!("/v1/domains/{domain}/nodes/{node}"), None).await;
    assert_eq!(revoked.status, StatusCode::NO_CONTENT);
    // A refused action is not recorded: it did not happen.
    let refused = as_operator(BOB, Method::DELETE, format!("/v1/domains/{domain}/nodes/{node}"), None).await;
    check(&refused, StatusCode::NOT_FOUND, "unknown_node");
    // A token no knob names is nobody's.
    let nobody = replica.request(Method::GET, "/v1/audit", Some("carol-token-0123456789abcdef"), None).await;
    check(&nobody, StatusCode::UNAUTHORIZED, "unauthorized");

    let log = as_operator(ALICE, Method::GET, "/v1/audit".into(), None).await;
    assert_eq!(log.status, StatusCode::OK, "{log:?}");
    let entries = log.body.as_array().unwrap();
    let summary: Vec<(&str, &str)> = entries
        .iter()
        .map(|entry| (entry["actor"].as_str().unwrap(), entry["action"].as_str().unwrap()))
        .collect();
    assert_eq!(
        summary,
        [("bob", "node.revoke"), ("alice", "secret.put"), ("bob", "node.enrol"), ("alice", "domain.create")]
    );
    assert_eq!(entries[0]["node_id"], node);
    assert_eq!(entries[1]["secret_name"], "db-password");
    assert_eq!(entries[3]["domain_id"], domain.as_str());
    assert!(entries.iter().all(|entry| entry["at"].is_string()));
    let text = log.body.to_string();
    for secret in [token, "hunter2-correct-horse", ALICE, BOB] {
        assert!(!text.contains(secret), "the audit log shows {secret}: {text}");
    }

    // Paging back from an id, and a bad query is a JSON 400.
    let last_id = entries[1]["id"].as_i64().unwrap();
    let older = as_operator(ALICE, Method::GET, format!("/v1/audit?before={last_id}&limit=1"), None).await;
    assert_eq!(older.body.as_array().unwrap().len(), 1);
    assert_eq!(older.body[0]["action"], "node.enrol");
    for query in ["limit=0", "limit=1001", "limit=x", "before=1.5", "colour=blue"] {
        let answer = as_operator(ALICE, Method::GET, format!("/v1/audit?{query}"), None).await;
        check(&answer, StatusCode::BAD_REQUEST, "bad_request");
    }

    // Append-only, for the service's own database user too.
    for change in [
        "UPDATE plexsphere.audit_events SET actor = 'mallory'",
        "DELETE FROM plexsphere.audit_events",
        "TRUNCATE plexsphere.audit_events",
    ] {
        let error = sqlx::query(change).execute(&pool).await.unwrap_err();
        assert!(error.to_string().contains("append-only"), "{change}: {error}");
    }
    replica.stop().await;
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn the_single_operator_token_acts_as_operator(_: PgPoolOptions, connect: PgConnectOptions) {
    let replica = Replica::start(config(&connect, &[]), Arc::new(ManualClock::new(instant()))).await;
    replica.create_domain("d", None).await;
    let log = replica.request(Method::GET, "/v1/audit", Some(OPERATOR_TOKEN), None).await;
    assert_eq!(log.body[0]["actor"], "operator", "{log:?}");
    replica.stop().await;
}
