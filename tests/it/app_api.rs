//! The HTTP API's contract through one replica: authentication, bad input, unknown things,
//! isolation between Domains, and the operator's view of a budget.

use std::sync::Arc;

use ratebudget::ManualClock;
use reqwest::{Method, StatusCode};
use serde_json::json;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;

use crate::support::helpers::instant;
use crate::support::replicas::{config, Replica};

async fn replica(connect: &PgConnectOptions) -> Replica {
    Replica::start(config(connect, &[]), Arc::new(ManualClock::new(instant()))).await
}

#[track_caller]
fn check(answer: &crate::support::replicas::Answer, status: StatusCode, code: &str) {
    assert_eq!((answer.status, answer.code()), (status, code), "{answer:?}");
    assert!(answer.body["error"].as_str().is_some_and(|error| !error.is_empty()), "{answer:?}");
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn operator_routes_need_the_operator_token(_: PgPoolOptions, connect: PgConnectOptions) {
    let replica = replica(&connect).await;
    let body = Some(json!({ "name": "d" }).to_string().into_bytes());
    for bearer in [None, Some("wrong-token"), Some("operator-token-for-tests-012345678")] {
        let answer = replica.request(Method::POST, "/v1/domains", bearer, body.clone()).await;
        check(&answer, StatusCode::UNAUTHORIZED, "unauthorized");
    }
    // A Node's token is not the operator's.
    let domain = replica.create_domain("d", None).await;
    let (_, node_token) = replica.enrol(&domain, "n").await;
    let answer = replica.request(Method::POST, "/v1/domains", Some(&node_token), body).await;
    check(&answer, StatusCode::UNAUTHORIZED, "unauthorized");
    replica.stop().await;
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn bad_input_is_a_400_and_writes_nothing(pool_options: PgPoolOptions, connect: PgConnectOptions) {
    let pool: PgPool = pool_options.connect_with(connect.clone()).await.unwrap();
    let replica = replica(&connect).await;
    let post = |path: &'static str, body: &'static str| {
        replica.request(
            Method::POST,
            path,
            Some(crate::support::replicas::OPERATOR_TOKEN),
            Some(body.as_bytes().to_vec()),
        )
    };
    for body in [
        "{not json",
        "{}",
        r#"{"name": ""}"#,
        r#"{"name": "d", "issuance_per_second": 1}"#,
        r#"{"name": "d", "issuance_per_second": 0, "issuance_burst": 5}"#,
        r#"{"name": "d", "issuance_per_second": 1, "issuance_burst": 0.5}"#,
        r#"{"name": "d", "colour": "blue"}"#,
        // Passed the old `burst / rate` check and tripped the table's CHECK (a 500).
        r#"{"name": "d", "issuance_per_second": 544.7026188767409, "issuance_burst": 1960929.4279562673}"#,
        // Refill arithmetic this large would overflow float8 in the database.
        r#"{"name": "d", "issuance_per_second": 1e300, "issuance_burst": 5}"#,
    ] {
        check(&post("/v1/domains", body).await, StatusCode::BAD_REQUEST, "bad_request");
    }
    let domains: i64 =
        sqlx::query_scalar("SELECT count(*) FROM plexsphere.domains").fetch_one(&pool).await.unwrap();
    assert_eq!(domains, 0);

    check(
        &post("/v1/domains/not-a-uuid/nodes", r#"{"name": "n"}"#).await,
        StatusCode::BAD_REQUEST,
        "bad_request",
    );
    let answer = replica.operator(Method::GET, "/v1/budgets/12345", None).await;
    check(&answer, StatusCode::BAD_REQUEST, "bad_request");
    // A path segment that is not UTF-8 once decoded is a JSON 400 too, not axum's plain text.
    let answer = replica.operator(Method::GET, "/v1/budgets/%FF", None).await;
    check(&answer, StatusCode::BAD_REQUEST, "bad_request");
    let domain = replica.create_domain("d", None).await;
    let answer = replica
        .operator(
            Method::PUT,
            &format!("/v1/domains/{domain}/secrets/bad%20name"),
            Some(json!({ "value": "v" })),
        )
        .await;
    check(&answer, StatusCode::BAD_REQUEST, "bad_request");
    let secrets: i64 =
        sqlx::query_scalar("SELECT count(*) FROM plexsphere.secrets").fetch_one(&pool).await.unwrap();
    assert_eq!(secrets, 0);

    // An empty batch would cost nothing: a Node could write rows without limit.
    let (_, token) = replica.enrol(&domain, "n").await;
    let answer = replica.request(Method::POST, "/v1/ingest", Some(&token), Some(Vec::new())).await;
    check(&answer, StatusCode::BAD_REQUEST, "empty_batch");
    let batches: i64 =
        sqlx::query_scalar("SELECT count(*) FROM plexsphere.ingest_batches").fetch_one(&pool).await.unwrap();
    assert_eq!(batches, 0);
    replica.stop().await;
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn unknown_domains_secrets_and_routes_are_404(_: PgPoolOptions, connect: PgConnectOptions) {
    let replica = replica(&connect).await;
    let nobody = uuid::Uuid::new_v4();
    let answer = replica
        .operator(Method::POST, &format!("/v1/domains/{nobody}/nodes"), Some(json!({ "name": "n" })))
        .await;
    check(&answer, StatusCode::NOT_FOUND, "unknown_domain");
    let answer = replica
        .operator(Method::PUT, &format!("/v1/domains/{nobody}/secrets/key"), Some(json!({ "value": "v" })))
        .await;
    check(&answer, StatusCode::NOT_FOUND, "unknown_domain");

    let domain = replica.create_domain("d", None).await;
    let (_, token) = replica.enrol(&domain, "n").await;
    check(
        &replica.get("/v1/secrets/never-written", Some(&token)).await,
        StatusCode::NOT_FOUND,
        "unknown_secret",
    );
    check(&replica.get("/v2/anything", None).await, StatusCode::NOT_FOUND, "not_found");
    replica.stop().await;
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn node_routes_need_a_node_token(_: PgPoolOptions, connect: PgConnectOptions) {
    let replica = replica(&connect).await;
    let domain = replica.create_domain("d", None).await;
    replica.put_secret(&domain, "key", "value").await;
    let forged = format!("psn_{}", "A".repeat(43));
    for bearer in
        [None, Some("garbage"), Some(forged.as_str()), Some(crate::support::replicas::OPERATOR_TOKEN)]
    {
        check(&replica.get("/v1/secrets/key", bearer).await, StatusCode::UNAUTHORIZED, "unauthorized");
        let answer = replica.request(Method::POST, "/v1/ingest", bearer, Some(b"x".to_vec())).await;
        check(&answer, StatusCode::UNAUTHORIZED, "unauthorized");
    }
    replica.stop().await;
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_node_reads_only_its_own_domains_secrets(_: PgPoolOptions, connect: PgConnectOptions) {
    let replica = replica(&connect).await;
    let (first, second) =
        (replica.create_domain("first", None).await, replica.create_domain("second", None).await);
    replica.put_secret(&first, "db-password", "first's").await;
    replica.put_secret(&second, "db-password", "second's").await;
    replica.put_secret(&first, "only-first", "x").await;
    let (_, token) = replica.enrol(&second, "n").await;

    let answer = replica.get("/v1/secrets/db-password", Some(&token)).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.body, json!({ "name": "db-password", "value": "second's" }));
    check(
        &replica.get("/v1/secrets/only-first", Some(&token)).await,
        StatusCode::NOT_FOUND,
        "unknown_secret",
    );

    // Overwriting is a PUT like the first write.
    replica.put_secret(&second, "db-password", "rotated").await;
    assert_eq!(replica.get("/v1/secrets/db-password", Some(&token)).await.body["value"], "rotated");
    replica.stop().await;
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn the_operator_reads_a_budget_over_http_and_with_the_cli(_: PgPoolOptions, connect: PgConnectOptions) {
    let replica = replica(&connect).await;
    let domain = replica.create_domain("d", None).await;
    let (node, token) = replica.enrol(&domain, "n").await;
    replica.put_secret(&domain, "key", "value").await;
    for _ in 0..3 {
        assert_eq!(replica.get("/v1/secrets/key", Some(&token)).await.status, StatusCode::OK);
    }
    let answer = replica.operator(Method::GET, &format!("/v1/budgets/{domain}"), None).await;
    assert_eq!(
        answer.body,
        json!([
            { "scope": "access_issuance_domain", "tokens": 9.0, "refilled_at": "2026-11-30T12:00:00Z" },
            { "scope": "secret_read_domain", "tokens": 197.0, "refilled_at": "2026-11-30T12:00:00Z" },
        ])
    );
    let nobody = uuid::Uuid::new_v4();
    assert_eq!(replica.operator(Method::GET, &format!("/v1/budgets/{nobody}"), None).await.body, json!([]));

    let mut printed = Vec::new();
    app::cli::show_budgets(connect.clone(), node.parse().unwrap(), &mut printed).await.unwrap();
    let printed = String::from_utf8(printed).unwrap();
    assert!(printed.contains("secret_read_node"), "{printed}");
    assert!(printed.contains("17.000"), "{printed}");
    assert!(printed.contains("2026-11-30T12:00:00+00:00"), "{printed}");
    replica.stop().await;
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn probes_and_metrics_answer(_: PgPoolOptions, connect: PgConnectOptions) {
    let replica = replica(&connect).await;
    assert_eq!(replica.get("/healthz", None).await.status, StatusCode::OK);
    assert_eq!(replica.get("/readyz", None).await.status, StatusCode::OK);
    let domain = replica.create_domain("d", Some((1.0, 1.0))).await;
    replica.enrol(&domain, "n").await;
    let refused = replica
        .operator(Method::POST, &format!("/v1/domains/{domain}/nodes"), Some(json!({ "name": "m" })))
        .await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    let metrics = replica.get("/metrics", None).await.body.as_str().unwrap().to_owned();
    for line in [
        "plexsphere_rate_budget_decisions_total{scope=\"access_issuance_domain\",outcome=\"granted\"} 1",
        // The grant left the bucket empty, so this replica's pre-check refused without a
        // statement.
        "plexsphere_rate_budget_decisions_total{scope=\"access_issuance_domain\",outcome=\"precheck_refused\"} 1",
    ] {
        assert!(metrics.lines().any(|l| l == line), "missing {line} in\n{metrics}");
    }
    assert!(metrics.lines().any(|l| l.starts_with("plexsphere_leader ")), "{metrics}");
    replica.stop().await;
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_500_is_one_log_line_naming_the_route_the_request_and_the_cause_chain(
    pool_options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let logs = crate::support::logs::Logs::capture();
    let pool: PgPool = pool_options.connect_with(connect.clone()).await.unwrap();
    let replica = replica(&connect).await;
    let domain = replica.create_domain("d", None).await;
    let (node, token) = replica.enrol(&domain, "n").await;
    // Sabotage the database: the secret store's table is gone, so the read fails below the
    // limiter, inside the secrets context.
    sqlx::query("ALTER TABLE plexsphere.secrets RENAME TO secrets_gone").execute(&pool).await.unwrap();

    let request_id = uuid::Uuid::new_v4().to_string();
    let answer = replica.get_as_request("/v1/secrets/db-password", Some(&token), &request_id).await;
    check(&answer, StatusCode::INTERNAL_SERVER_ERROR, "internal");
    assert!(!answer.body.to_string().contains("secrets_gone"), "the cause reached the client: {answer:?}");

    let lines = logs.lines_with(&request_id);
    assert_eq!(lines.len(), 1, "one line for the failure: {lines:#?}");
    let line = &lines[0];
    for expected in [
        "ERROR",
        r#"route="/v1/secrets/{name}""#,
        &format!("node_id={node}"),
        &format!("domain_id={domain}"),
        // The chain, outermost first, down to the database's own words.
        "secret could not be read: secret store could not answer: ",
        "plexsphere.secrets\" does not exist",
    ] {
        assert!(line.contains(expected), "{expected:?} missing from {line}");
    }
    assert!(!line.contains(&token), "the token reached the log: {line}");
    replica.stop().await;
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_domain_name_in_use_is_a_409_naming_the_domain_that_has_it(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    // Issue 21: a second Domain named "acme" was created without complaint, and a walk-through
    // run twice could not tell its two Domains apart.
    let replica = replica(&connect).await;
    let first = replica.create_domain("acme", None).await;
    let again = replica.operator(Method::POST, "/v1/domains", Some(json!({ "name": "acme" }))).await;
    assert_eq!((again.status, again.code()), (StatusCode::CONFLICT, "domain_name_taken"), "{again:?}");
    assert!(again.body["error"].as_str().unwrap().contains(&first), "{again:?}");

    // With its own issuance policy, the override rule it would have had is not left behind.
    let with_policy = json!({ "name": "acme", "issuance_per_second": 5, "issuance_burst": 10 });
    let again = replica.operator(Method::POST, "/v1/domains", Some(with_policy)).await;
    assert_eq!(again.status, StatusCode::CONFLICT, "{again:?}");
    let rules = replica.operator(Method::GET, "/v1/rules", None).await;
    assert_eq!(rules.body, json!([]), "{rules:?}");
    // Another name is fine, and only the Domains created are in the audit log.
    replica.create_domain("acme-2", None).await;
    let audit = replica.operator(Method::GET, "/v1/audit", None).await;
    let created =
        audit.body.as_array().unwrap().iter().filter(|entry| entry["action"] == "domain.create").count();
    assert_eq!(created, 2);
    replica.stop().await;
}
