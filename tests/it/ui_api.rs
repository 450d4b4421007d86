//! What the operator page reads (issue 15, item 2): `GET /v1/status` and `GET /v1/fill/{key}`
//! need the operator token and answer JSON errors like every operator route; the page at `/ui`
//! is served to anyone but holds no data, with no-store and a strict Content-Security-Policy.

use std::sync::Arc;

use ratebudget::ManualClock;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::support::helpers::instant;
use crate::support::replicas::{config, leader_backend, Answer, Replica};

async fn replica(connect: &PgConnectOptions) -> Replica {
    Replica::start(config(connect, &[]), Arc::new(ManualClock::new(instant()))).await
}

#[track_caller]
fn check(answer: &Answer, status: StatusCode, code: &str) {
    assert_eq!((answer.status, answer.code()), (status, code), "{answer:?}");
    assert!(answer.body["error"].as_str().is_some_and(|error| !error.is_empty()), "{answer:?}");
}

/// The bucket of `scope` in a `/v1/fill` answer.
#[track_caller]
fn bucket<'a>(fill: &'a Value, scope: &str) -> &'a Value {
    fill["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|bucket| bucket["scope"] == scope)
        .unwrap_or_else(|| panic!("no {scope} bucket in {fill}"))
}

fn scopes(fill: &Value) -> Vec<&str> {
    fill["buckets"].as_array().unwrap().iter().map(|bucket| bucket["scope"].as_str().unwrap()).collect()
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn the_operator_views_need_the_operator_token_and_the_page_holds_no_data(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let replica = replica(&connect).await;
    let domain = replica.create_domain("acme", None).await;
    let (_, node_token) = replica.enrol(&domain, "node-1").await;
    for path in ["/v1/status".to_owned(), format!("/v1/fill/{domain}")] {
        for bearer in [None, Some("wrong-token"), Some(node_token.as_str())] {
            check(&replica.get(&path, bearer).await, StatusCode::UNAUTHORIZED, "unauthorized");
        }
    }

    for (path, content_type) in [
        ("/ui", "text/html; charset=utf-8"),
        ("/ui/app.js", "text/javascript; charset=utf-8"),
        ("/ui/app.css", "text/css; charset=utf-8"),
    ] {
        let answer = replica.get(path, None).await;
        assert_eq!(answer.status, StatusCode::OK, "{path}: {answer:?}");
        assert_eq!(answer.header("content-type"), Some(content_type), "{path}");
        assert_eq!(answer.header("cache-control"), Some("no-store"), "{path}");
        assert_eq!(answer.header("content-security-policy"), Some(app::http::ui::CONTENT_SECURITY_POLICY));
        assert_eq!(answer.header("x-content-type-options"), Some("nosniff"), "{path}");
        // The page is the same for everyone: it names no Domain and holds no count.
        let text = answer.body.as_str().unwrap();
        assert!(!text.contains(&domain), "{path} holds data");
    }
    let policy = app::http::ui::CONTENT_SECURITY_POLICY;
    assert!(policy.contains("script-src 'self';") && !policy.contains("unsafe"), "{policy}");
    assert!(policy.contains("default-src 'none'") && policy.contains("frame-ancestors 'none'"), "{policy}");
    replica.stop().await;
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn fill_shows_a_nodes_and_a_domains_buckets_now_and_the_levels_its_decisions_left(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let replica = replica(&connect).await;
    let domain = replica.create_domain("acme", None).await;
    let (node, node_token) = replica.enrol(&domain, "node-1").await;
    replica.put_secret(&domain, "db-password", "hunter2").await;
    // The clock stands still: 20 reads empty the Node's burst of 20, the next 2 are refused.
    let mut statuses = Vec::new();
    for _ in 0..22 {
        statuses.push(replica.get("/v1/secrets/db-password", Some(&node_token)).await.status);
    }
    assert_eq!(statuses.iter().filter(|status| **status == StatusCode::OK).count(), 20, "{statuses:?}");

    let answer = replica.operator(Method::GET, &format!("/v1/fill/{node}"), None).await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    let fill = &answer.body;
    assert_eq!((fill["kind"].as_str(), fill["name"].as_str()), (Some("node"), Some("node-1")));
    assert_eq!(
        (fill["domain_id"].as_str(), fill["domain_name"].as_str()),
        (Some(domain.as_str()), Some("acme"))
    );
    assert_eq!((fill["slot_seconds"].as_u64(), fill["window_seconds"].as_u64()), (Some(10), Some(600)));
    assert_eq!(scopes(fill), ["secret_read_node", "ingest_node"]);
    let reads = bucket(fill, "secret_read_node");
    assert_eq!(
        (reads["tokens"].as_f64(), reads["burst"].as_f64(), reads["per_second"].as_f64(), &reads["stored"]),
        (Some(0.0), Some(20.0), Some(10.0), &json!(true))
    );
    // One slot (the clock stood still): what the last decision left, the lowest, the counts.
    let history = reads["history"].as_array().unwrap();
    assert_eq!(history.len(), 1, "{reads}");
    assert_eq!(
        (&history[0]["tokens"], &history[0]["min_tokens"], &history[0]["granted"], &history[0]["refused"]),
        (&json!(0.0), &json!(0.0), &json!(20), &json!(2))
    );
    // A bucket nobody spent from is full, and absent from the table.
    let ingest = bucket(fill, "ingest_node");
    assert_eq!((ingest["tokens"].as_f64(), &ingest["stored"]), (Some(1_048_576.0), &json!(false)));
    assert_eq!(ingest["history"], json!([]));

    // The Domain's buckets: its secret reads (20 granted of 200), its one issuance.
    let answer = replica.operator(Method::GET, &format!("/v1/fill/{domain}"), None).await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    let fill = &answer.body;
    assert_eq!((fill["kind"].as_str(), fill["tier"].as_str()), (Some("domain"), Some("standard")));
    assert_eq!(scopes(fill), ["secret_read_domain", "access_issuance_domain", "ingest_domain"]);
    assert_eq!(bucket(fill, "secret_read_domain")["tokens"].as_f64(), Some(180.0));
    assert_eq!(bucket(fill, "secret_read_domain")["history"][0]["granted"], json!(20));
    assert_eq!(bucket(fill, "access_issuance_domain")["tokens"].as_f64(), Some(9.0));

    // Bad and unknown keys, as JSON errors.
    check(
        &replica.operator(Method::GET, "/v1/fill/not-a-uuid", None).await,
        StatusCode::BAD_REQUEST,
        "bad_request",
    );
    let nobody = uuid::Uuid::new_v4();
    check(
        &replica.operator(Method::GET, &format!("/v1/fill/{nobody}"), None).await,
        StatusCode::NOT_FOUND,
        "unknown_key",
    );
    replica.stop().await;
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn status_shows_the_snapshot_version_the_leader_and_decisions_by_outcome(
    pool_options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let pool = pool_options.connect_with(connect.clone()).await.unwrap();
    let mut replica = replica(&connect).await;
    let domain = replica.create_domain("acme", None).await;
    let (_, node_token) = replica.enrol(&domain, "node-1").await;
    replica.put_secret(&domain, "db-password", "hunter2").await;
    let rule =
        json!({ "scope": "secret_read_node", "selector": { "domain": domain }, "rate": 1, "burst": 3 });
    let answer = replica.operator(Method::PUT, "/v1/rules/acme-reads", Some(rule)).await;
    assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");
    for _ in 0..5 {
        replica.get("/v1/secrets/db-password", Some(&node_token)).await;
    }
    tokio::time::timeout(std::time::Duration::from_secs(10), replica.leadership.wait_until(true))
        .await
        .expect("the only replica leads");

    let answer = replica.operator(Method::GET, "/v1/status", None).await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    let status = &answer.body;
    assert_eq!(status["rules"]["loaded"], json!(true));
    assert_eq!(status["rules"]["snapshot_version"], json!(1), "one rule change: {status}");
    assert_eq!(status["leader"]["this_replica"], json!(true));
    assert_eq!(status["leader"]["holder_known"], json!(true));
    let holder = leader_backend(&pool).await.expect("someone holds the lock");
    assert_eq!(status["leader"]["holder"]["pid"], json!(holder));
    let count = |scope: &str, outcome: &str| {
        status["decisions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|row| row["scope"] == scope && row["outcome"] == outcome)
            .map_or(0, |row| row["count"].as_u64().unwrap())
    };
    // The rule's burst of 3 grants three reads; the other two are refused, by the store or
    // by the pre-check that remembers its answer.
    assert_eq!(count("secret_read_node", "granted"), 3, "{status}");
    assert_eq!(
        count("secret_read_node", "refused") + count("secret_read_node", "precheck_refused"),
        2,
        "{status}"
    );
    assert_eq!(count("access_issuance_domain", "granted"), 1, "{status}");
    assert_eq!(status["store_failing"], json!(false));
    replica.stop().await;
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn fill_counts_a_shadow_rules_refusals_apart_from_refusals(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    // Issue 21: the operator page's "refused" column counted reads a SHADOW rule refused, which
    // were admitted. They are counted apart.
    let replica = replica(&connect).await;
    let domain = replica.create_domain("acme", None).await;
    let (node, node_token) = replica.enrol(&domain, "node-1").await;
    replica.put_secret(&domain, "db-password", "hunter2").await;
    let rule = json!({
        "scope": "secret_read_node", "selector": { "domain": domain }, "rate": 1, "burst": 3, "mode": "SHADOW"
    });
    assert_eq!(
        replica.operator(Method::PUT, "/v1/rules/acme-shadow", Some(rule)).await.status,
        StatusCode::CREATED
    );
    for _ in 0..5 {
        assert_eq!(replica.get("/v1/secrets/db-password", Some(&node_token)).await.status, StatusCode::OK);
    }
    let fill = replica.operator(Method::GET, &format!("/v1/fill/{node}"), None).await.body;
    let slot = &bucket(&fill, "secret_read_node")["history"][0];
    assert_eq!(
        (&slot["granted"], &slot["refused"], &slot["shadow_refused"]),
        (&json!(3), &json!(0), &json!(2)),
        "{fill}"
    );
    replica.stop().await;
}
