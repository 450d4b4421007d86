//! plexsphere as a rate-limit service (issue 23): rules for another service, decided over
//! Envoy's gRPC protocol (through an independent Python grpcio client, `support::grpc`) and
//! over `POST /v1/decide`: the seed's Contoso example, precedence, SHADOW, two descriptors
//! all or nothing, a rule changed through another replica, one bucket for both protocols,
//! who may ask, the compiled snapshot, and the metrics.

use std::sync::Arc;
use std::time::Duration;

use ratebudget::ManualClock;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::support::grpc;
use crate::support::helpers::instant;
use crate::support::replicas::{config, eventually, Answer, Api, Replica};

mod token_budgets;

const DECIDE_TOKEN: &str = "envoy-decide-token-0123456789";

/// A replica serving the decide API over HTTP and gRPC, on a clock that stands still (so a
/// bucket never refills during a test).
async fn service(connect: &PgConnectOptions, clock: Arc<ManualClock>, knobs: &[(&str, &str)]) -> Replica {
    let token = format!("envoy:{DECIDE_TOKEN}");
    let mut all =
        vec![("PLEXSPHERE_DECIDE_TOKENS", token.as_str()), ("PLEXSPHERE_GRPC_LISTEN", "127.0.0.1:0")];
    all.extend_from_slice(knobs);
    Replica::start(config(connect, &all), clock).await
}

/// Writes a rule of `service` through the operator API.
async fn rule(api: &Api, id: &str, body: Value) -> Answer {
    let answer = api.operator(Method::PUT, &format!("/v1/rules/{id}"), Some(body)).await;
    assert!(answer.status.is_success(), "{answer:?}");
    answer
}

fn directory_rule(api_name: &str, selector: &Value, per_second: f64, priority: i64) -> Value {
    json!({
        "service": "directory", "api": api_name, "selector": selector,
        "rate": per_second, "burst": per_second, "priority": priority,
    })
}

/// A ShouldRateLimit call of one descriptor.
fn one(entries: &[(&str, &str)], hits: u64) -> Value {
    let entries: Vec<Value> = entries.iter().map(|(key, value)| json!([key, value])).collect();
    json!({ "token": DECIDE_TOKEN, "domain": "directory", "hits_addend": hits, "descriptors": [{ "entries": entries }] })
}

/// The same request as JSON for `POST /v1/decide`.
fn http_one(entries: &[(&str, &str)], hits: u64) -> Value {
    let entries: Vec<Value> =
        entries.iter().map(|(key, value)| json!({ "key": key, "value": value })).collect();
    json!({ "domain": "directory", "hits_addend": hits, "descriptors": [{ "entries": entries }] })
}

async fn http_decide(api: &Api, body: &Value) -> Answer {
    api.request(Method::POST, "/v1/decide", Some(DECIDE_TOKEN), Some(body.to_string().into_bytes())).await
}

fn overall(answer: &Value) -> &str {
    assert_eq!(answer["grpc"], "OK", "{answer}");
    answer["response"]["overall_code"].as_str().unwrap()
}

fn status(answer: &Value, index: usize) -> &Value {
    &answer["response"]["statuses"][index]
}

const USERS: (&str, &str) = ("api", "GET /v1/users");

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn the_seeds_contoso_example_over_envoys_protocol(_: PgPoolOptions, connect: PgConnectOptions) {
    let clock = Arc::new(ManualClock::new(instant()));
    let replica = service(&connect, clock, &[]).await;
    let grpc = replica.grpc.unwrap();
    // A premium template of 50 a second for the API, each premium tenant its own (`"*"`: a
    // bucket per value), and Contoso's override of 100.
    rule(
        &replica,
        "dir-users-premium",
        directory_rule("GET /v1/users", &json!({ "sku": "premium", "tenant": "*" }), 50.0, 0),
    )
    .await;
    rule(
        &replica,
        "dir-users-contoso",
        directory_rule("GET /v1/users", &json!({ "tenant": "contoso" }), 100.0, 0),
    )
    .await;

    let contoso = [USERS, ("sku", "premium"), ("tenant", "contoso")];
    let fabrikam = [USERS, ("sku", "premium"), ("tenant", "fabrikam")];
    let unknown = [USERS, ("sku", "free"), ("tenant", "tailspin")];
    let answers = grpc::calls(
        grpc,
        json!([
            one(&contoso, 100),
            one(&contoso, 1),
            one(&fabrikam, 50),
            one(&fabrikam, 1),
            one(&unknown, 1000)
        ]),
    )
    .await;

    // Contoso's override governs Contoso: its whole 100, then over the limit.
    assert_eq!(overall(&answers[0]), "OK");
    let granted = status(&answers[0], 0);
    assert_eq!(granted["code"], "OK");
    assert_eq!(
        granted["current_limit"],
        json!({ "name": "dir-users-contoso", "requests_per_unit": 100, "unit": "SECOND" })
    );
    assert_eq!(granted["limit_remaining"], 0);
    // Empty, it refills to full in a second.
    assert_eq!(granted["duration_until_reset_ms"], 1000);
    assert_eq!(overall(&answers[1]), "OVER_LIMIT");
    assert_eq!(status(&answers[1], 0)["code"], "OVER_LIMIT");
    let headers: Vec<(String, String)> =
        serde_json::from_value(answers[1]["response"]["response_headers_to_add"].clone()).unwrap();
    assert!(headers.contains(&("retry-after".into(), "1".into())), "{headers:?}");
    assert!(
        headers.contains(&("ratelimit".into(), "\"dir-users-contoso\";r=0;t=1".into())),
        "the HTTP API's fields: {headers:?}"
    );

    // Another premium tenant inherits the template, in a bucket of its own.
    assert_eq!(overall(&answers[2]), "OK");
    assert_eq!(status(&answers[2], 0)["current_limit"]["name"], "dir-users-premium");
    assert_eq!(status(&answers[2], 0)["current_limit"]["requests_per_unit"], 50);
    assert_eq!(overall(&answers[3]), "OVER_LIMIT");

    // A tenant no rule selects is unlimited: no limit, whatever it asks for.
    assert_eq!(overall(&answers[4]), "OK");
    assert_eq!(status(&answers[4], 0)["current_limit"], Value::Null);
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn the_most_specific_entry_wins_then_a_named_api_then_priority_then_the_smaller_id(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let clock = Arc::new(ManualClock::new(instant()));
    let replica = service(&connect, clock, &[]).await;
    let grpc = replica.grpc.unwrap();
    // Each rule a different rate, so the limit a status reports names the rule that governed.
    rule(&replica, "everything", directory_rule("*", &json!({}), 1000.0, 0)).await;
    rule(&replica, "users-any-sku", directory_rule("GET /v1/users", &json!({ "sku": "*" }), 900.0, 0)).await;
    rule(&replica, "any-api-premium", directory_rule("*", &json!({ "sku": "premium" }), 800.0, 0)).await;
    rule(&replica, "users-premium", directory_rule("GET /v1/users", &json!({ "sku": "premium" }), 700.0, 0))
        .await;
    rule(
        &replica,
        "users-premium-urgent",
        directory_rule("GET /v1/users", &json!({ "sku": "premium" }), 600.0, 5),
    )
    .await;
    rule(&replica, "any-api-tenant-b", directory_rule("*", &json!({ "tenant": "contoso" }), 500.0, 0)).await;
    rule(&replica, "any-api-tenant-a", directory_rule("*", &json!({ "tenant": "contoso" }), 400.0, 0)).await;
    rule(
        &replica,
        "groups-region",
        directory_rule("GET /v1/groups", &json!({ "region": "eu", "sku": "premium" }), 300.0, 0),
    )
    .await;

    let table: [(&[(&str, &str)], &str); 7] = [
        // The latest entry a rule names wins, whatever the API or priority: the tenant's.
        (&[USERS, ("sku", "premium"), ("tenant", "contoso")], "any-api-tenant-a"),
        // Among rules naming the same entry: the named API over *, then the higher priority.
        (&[USERS, ("sku", "premium"), ("tenant", "fabrikam")], "users-premium-urgent"),
        // `*` matches any value of its key; a named API still beats `*` at the same entry.
        (&[USERS, ("sku", "free")], "users-any-sku"),
        (&[("api", "GET /v1/orders"), ("sku", "premium")], "any-api-premium"),
        // Every pair of a selector must be there: region and sku, or the rule does not match.
        (&[("api", "GET /v1/groups"), ("sku", "premium")], "any-api-premium"),
        (&[("api", "GET /v1/groups"), ("region", "eu"), ("sku", "premium")], "groups-region"),
        // No entry named by any rule: the empty selector's rule.
        (&[("api", "GET /v1/orders"), ("colour", "blue")], "everything"),
    ];
    let requests: Vec<Value> = table.iter().map(|(entries, _)| one(entries, 1)).collect();
    let answers = grpc::calls(grpc, Value::Array(requests)).await;
    for ((entries, expected), answer) in table.iter().zip(&answers) {
        assert_eq!(status(answer, 0)["current_limit"]["name"], *expected, "{entries:?}: {answer}");
    }
    // The smaller id wins a tie of everything else: -a over -b.
    let snapshot =
        replica.request(Method::GET, "/v1/snapshot?service=directory", Some(DECIDE_TOKEN), None).await;
    assert_eq!(snapshot.status, StatusCode::OK, "{snapshot:?}");
    let ids: Vec<&str> = snapshot.body["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|rule| rule["rule_id"].as_str().unwrap())
        .collect();
    assert!(
        ids.iter().position(|id| *id == "any-api-tenant-a")
            < ids.iter().position(|id| *id == "any-api-tenant-b")
    );
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_shadow_rule_admits_and_counts_what_it_would_refuse(_: PgPoolOptions, connect: PgConnectOptions) {
    let clock = Arc::new(ManualClock::new(instant()));
    let replica = service(&connect, clock, &[("PLEXSPHERE_RULE_USAGE_FLUSH_INTERVAL_MS", "100")]).await;
    let grpc = replica.grpc.unwrap();
    let mut shadow = directory_rule("GET /v1/users", &json!({ "tenant": "*" }), 2.0, 0);
    shadow["mode"] = json!("SHADOW");
    rule(&replica, "users-shadow", shadow).await;
    let contoso = [USERS, ("tenant", "contoso")];
    let answers =
        grpc::calls(grpc, json!([one(&contoso, 1), one(&contoso, 1), one(&contoso, 1), one(&contoso, 1)]))
            .await;
    for answer in &answers {
        assert_eq!(overall(answer), "OK", "SHADOW admits: {answer}");
    }
    // Granted twice (the burst), and twice it would have refused.
    eventually(Duration::from_secs(5), "the shadow rule's usage is flushed", || async {
        let usage = replica
            .operator(Method::GET, "/v1/rules/users-shadow/usage?since=2000-01-01T00:00:00Z", None)
            .await;
        let sum = |field: &str| {
            usage.body.as_array().unwrap().iter().map(|minute| minute[field].as_u64().unwrap()).sum::<u64>()
        };
        (sum("granted"), sum("refused"), sum("shadow_refused")) == (2, 0, 2)
    })
    .await;
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn two_descriptors_are_decided_all_or_nothing(_: PgPoolOptions, connect: PgConnectOptions) {
    let clock = Arc::new(ManualClock::new(instant()));
    let replica = service(&connect, clock, &[]).await;
    let grpc = replica.grpc.unwrap();
    rule(&replica, "per-tenant", directory_rule("*", &json!({ "tenant": "*" }), 5.0, 0)).await;
    rule(&replica, "per-user", directory_rule("*", &json!({ "user": "*" }), 2.0, 0)).await;
    let both = |hits: u64| {
        json!({ "token": DECIDE_TOKEN, "domain": "directory", "hits_addend": hits, "descriptors": [
            { "entries": [["tenant", "contoso"]] },
            { "entries": [["user", "alice"]] },
        ]})
    };
    let tenant_only = |hits: u64| one(&[("tenant", "contoso")], hits);
    let answers = grpc::calls(grpc, json!([both(2), both(2), tenant_only(3), tenant_only(1)])).await;
    // 2 of 5 and 2 of 2: both granted, what each left reported.
    assert_eq!(overall(&answers[0]), "OK");
    assert_eq!(
        (
            status(&answers[0], 0)["limit_remaining"].clone(),
            status(&answers[0], 1)["limit_remaining"].clone()
        ),
        (json!(3), json!(0))
    );
    // The user's bucket is empty: the request is over the limit, and the tenant's bucket,
    // which alone would have admitted it, is not debited.
    assert_eq!(overall(&answers[1]), "OVER_LIMIT");
    assert_eq!(status(&answers[1], 0)["code"], "OK");
    assert_eq!(status(&answers[1], 1)["code"], "OVER_LIMIT");
    // So the tenant still has exactly 3: granted, then over.
    assert_eq!(overall(&answers[2]), "OK");
    assert_eq!(status(&answers[2], 0)["limit_remaining"], 0);
    assert_eq!(overall(&answers[3]), "OVER_LIMIT");
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_rule_changed_through_another_replica_governs_within_a_second(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let clock = Arc::new(ManualClock::new(instant()));
    let a = service(&connect, clock.clone(), &[]).await;
    let b = service(&connect, clock.clone(), &[]).await;
    let grpc = b.grpc.unwrap();
    let contoso = [USERS, ("tenant", "contoso")];
    // The client asks b again and again, from before the rule exists until b decides by it.
    let mut polling = one(&contoso, 1);
    polling["until_rule"] = json!("contoso");
    polling["deadline_ms"] = json!(20_000);
    let client = tokio::spawn(grpc::call(grpc, polling));
    let unlimited = "plexsphere_decide_decisions_total{service=\"other\",outcome=\"ok\"}";
    eventually(Duration::from_secs(20), "the client is asking b", || async {
        b.metric(unlimited).await.is_some()
    })
    .await;
    let written = std::time::SystemTime::now();
    rule(&a, "contoso", directory_rule("GET /v1/users", &json!({ "tenant": "contoso" }), 10.0, 0)).await;
    let answer = client.await.unwrap();
    let seen_at =
        answer["seen_at"].as_f64().unwrap_or_else(|| panic!("b never decided by the rule: {answer}"));
    let written = written.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    assert!(seen_at - written < 1.0, "b decided by the rule {:.3} s after it was written", seen_at - written);
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn http_and_grpc_spend_one_bucket(_: PgPoolOptions, connect: PgConnectOptions) {
    let clock = Arc::new(ManualClock::new(instant()));
    let replica = service(&connect, clock, &[]).await;
    let grpc = replica.grpc.unwrap();
    rule(&replica, "contoso", directory_rule("GET /v1/users", &json!({ "tenant": "contoso" }), 10.0, 0))
        .await;
    let contoso = [USERS, ("tenant", "contoso")];

    let first = http_decide(&replica, &http_one(&contoso, 6)).await;
    assert_eq!(first.status, StatusCode::OK, "{first:?}");
    assert_eq!(first.body["overall_code"], "OK");
    assert_eq!(first.body["statuses"][0]["limit_remaining"], 4);
    assert_eq!(first.body["statuses"][0]["rule_id"], "contoso");
    assert_eq!(first.body["statuses"][0]["current_limit"]["unit"], "SECOND");
    // What HTTP left, gRPC sees: 4, then nothing.
    let answers = grpc::calls(grpc, json!([one(&contoso, 4), one(&contoso, 1)])).await;
    assert_eq!(status(&answers[0], 0)["limit_remaining"], 0);
    assert_eq!(overall(&answers[1]), "OVER_LIMIT");
    // And what gRPC spent, HTTP sees: over the limit, still a 200, with when it refills.
    let over = http_decide(&replica, &http_one(&contoso, 1)).await;
    assert_eq!(over.status, StatusCode::OK);
    assert_eq!(over.body["overall_code"], "OVER_LIMIT");
    assert_eq!(over.body["statuses"][0]["duration_until_reset_ms"], 1000);
    assert!(over.body["response_headers_to_add"]
        .as_array()
        .unwrap()
        .contains(&json!({ "key": "retry-after", "value": "1" })));

    let decided = |outcome: &str| {
        format!("plexsphere_decide_decisions_total{{service=\"directory\",outcome=\"{outcome}\"}}")
    };
    assert_eq!(replica.metric(&decided("ok")).await, Some(2.0));
    assert_eq!(replica.metric(&decided("over_limit")).await, Some(2.0));
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn only_callers_with_a_decide_token_are_answered(_: PgPoolOptions, connect: PgConnectOptions) {
    let clock = Arc::new(ManualClock::new(instant()));
    let replica = service(&connect, clock.clone(), &[]).await;
    let grpc = replica.grpc.unwrap();
    let contoso = [USERS, ("tenant", "contoso")];
    let mut anonymous = one(&contoso, 1);
    anonymous["token"] = Value::Null;
    let mut wrong = one(&contoso, 1);
    wrong["token"] = json!("not-the-token-0123456789");
    let mut operator = one(&contoso, 1);
    operator["token"] = json!(crate::support::replicas::OPERATOR_TOKEN);
    let answers = grpc::calls(grpc, json!([anonymous, wrong, operator])).await;
    for answer in &answers {
        assert_eq!(answer["grpc"], "UNAUTHENTICATED", "{answer}");
    }
    let http = replica
        .request(Method::POST, "/v1/decide", None, Some(http_one(&contoso, 1).to_string().into_bytes()))
        .await;
    assert_eq!(http.status, StatusCode::UNAUTHORIZED);
    // Requests malformed as messages are refused by name and spend nothing: no domain, a
    // descriptor without entries.
    let malformed = grpc::calls(
        grpc,
        json!([
            { "token": DECIDE_TOKEN, "domain": "", "descriptors": [{ "entries": [["tenant", "contoso"]] }] },
            { "token": DECIDE_TOKEN, "domain": "directory", "descriptors": [{ "entries": [] }] },
        ]),
    )
    .await;
    for answer in &malformed {
        assert_eq!(answer["grpc"], "INVALID_ARGUMENT", "{answer}");
    }
    // This project's own budgets are not decided for callers.
    let own = http_decide(&replica, &json!({ "domain": "plexsphere", "descriptors": [] })).await;
    assert_eq!((own.status, own.code()), (StatusCode::FORBIDDEN, "forbidden"), "{own:?}");
    let unknown_field = http_decide(&replica, &json!({ "domain": "directory", "descriptor": [] })).await;
    assert_eq!(unknown_field.status, StatusCode::BAD_REQUEST, "{unknown_field:?}");

    // Without the knob the decide API is off.
    let plain = Replica::start(config(&connect, &[]), clock).await;
    let off = http_decide(&plain, &http_one(&contoso, 1)).await;
    assert_eq!((off.status, off.code()), (StatusCode::NOT_FOUND, "decide_off"));
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_load_balancer_reads_a_services_snapshot_and_is_told_when_it_has_not_changed(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let clock = Arc::new(ManualClock::new(instant()));
    let replica = service(&connect, clock, &[]).await;
    rule(
        &replica,
        "dir-users-premium",
        directory_rule("GET /v1/users", &json!({ "sku": "premium" }), 50.0, 0),
    )
    .await;
    rule(&replica, "billing-all", json!({ "service": "billing", "selector": {}, "rate": 5.0, "burst": 5.0 }))
        .await;
    let read = |etag: Option<String>| {
        let replica = &replica;
        async move {
            let mut request = reqwest::Client::new()
                .get(format!("{}/v1/snapshot?service=directory", replica.base()))
                .bearer_auth(DECIDE_TOKEN);
            if let Some(etag) = etag {
                request = request.header("if-none-match", etag);
            }
            request.send().await.unwrap()
        }
    };
    let first = read(None).await;
    assert_eq!(first.status(), StatusCode::OK);
    let etag = first.headers()["etag"].to_str().unwrap().to_owned();
    let body: Value = first.json().await.unwrap();
    assert_eq!(body["service"], "directory");
    assert_eq!(etag, format!("\"{}\"", body["revision"]));
    let rules = body["rules"].as_array().unwrap();
    assert_eq!(rules.len(), 1, "another service's rules are not in it: {body}");
    assert_eq!(rules[0]["api"], "GET /v1/users");
    assert_eq!(rules[0]["selector"], json!({ "sku": "premium" }));
    assert_eq!(read(Some(etag.clone())).await.status(), StatusCode::NOT_MODIFIED);
    // A change moves the revision on.
    rule(&replica, "dir-users-free", directory_rule("GET /v1/users", &json!({ "sku": "free" }), 5.0, 0))
        .await;
    assert_eq!(read(Some(etag)).await.status(), StatusCode::OK);
    // Operators may read it too; nobody else.
    let operator = replica.operator(Method::GET, "/v1/snapshot?service=directory", None).await;
    assert_eq!(operator.status, StatusCode::OK);
    assert_eq!(replica.get("/v1/snapshot?service=directory", None).await.status, StatusCode::UNAUTHORIZED);
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_service_rule_is_versioned_checked_and_rolled_back_like_ours(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let clock = Arc::new(ManualClock::new(instant()));
    let replica = service(&connect, clock, &[]).await;
    let created =
        rule(&replica, "r", directory_rule("GET /v1/users", &json!({ "tenant": "contoso" }), 10.0, 0)).await;
    assert_eq!(created.body["service"], "directory");
    assert_eq!(created.body["api"], "GET /v1/users");
    assert!(created.body.get("scope").is_none(), "{:?}", created.body);
    // Each field checked by name.
    for (body, field) in [
        (
            json!({ "service": "directory", "selector": { "api": "x" }, "rate": 1.0, "burst": 1.0 }),
            "selector",
        ),
        (
            json!({ "service": "directory", "selector": { "tenant": 5 }, "rate": 1.0, "burst": 1.0 }),
            "selector",
        ),
        (json!({ "service": "bad service", "selector": {}, "rate": 1.0, "burst": 1.0 }), "service"),
        (json!({ "service": "directory", "api": "", "selector": {}, "rate": 1.0, "burst": 1.0 }), "api"),
        (
            json!({ "service": "directory", "scope": "ingest_node", "selector": {}, "rate": 1.0, "burst": 1.0 }),
            "scope",
        ),
        (
            json!({ "service": "directory", "selector": {}, "rate": 1.0, "burst": 1.0, "algorithm": "GCRA" }),
            "algorithm",
        ),
        (json!({ "scope": "ingest_node", "api": "x", "selector": {}, "rate": 1.0, "burst": 1.0 }), "api"),
    ] {
        let answer = replica.operator(Method::PUT, "/v1/rules/bad", Some(body.clone())).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{body}: {answer:?}");
        assert!(answer.body["error"].as_str().unwrap().contains(field), "{body}: {answer:?}");
    }
    // Replaced under If-Match, then rolled back to version 1.
    let replaced = replica
        .operator_if_match(
            Method::PUT,
            "/v1/rules/r",
            Some(directory_rule("*", &json!({ "tenant": "contoso", "region": "*" }), 20.0, 3)),
            Some("\"1\""),
        )
        .await;
    assert_eq!(replaced.status, StatusCode::OK, "{replaced:?}");
    assert_eq!(replaced.body["selector"], json!({ "region": "*", "tenant": "contoso" }));
    let rolled = replica.operator(Method::POST, "/v1/rules/r/rollback", Some(json!({ "version": 1 }))).await;
    assert_eq!(rolled.status, StatusCode::OK, "{rolled:?}");
    assert_eq!(
        (rolled.body["api"].clone(), rolled.body["rate"].clone()),
        (json!("GET /v1/users"), json!(10.0))
    );
    let history = replica.operator(Method::GET, "/v1/rules/r/history", None).await;
    let apis: Vec<&str> =
        history.body.as_array().unwrap().iter().map(|version| version["api"].as_str().unwrap()).collect();
    assert_eq!(apis, ["GET /v1/users", "*", "GET /v1/users"]);
    let listed = replica.operator(Method::GET, "/v1/rules?service=directory", None).await;
    assert_eq!(listed.body.as_array().unwrap().len(), 1);
    let ours = replica.operator(Method::GET, "/v1/rules?service=plexsphere", None).await;
    assert!(ours.body.as_array().unwrap().iter().all(|rule| rule["service"] == "plexsphere"));
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_closed_rule_whose_store_cannot_answer_is_unavailable_and_open_admits(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    use crate::support::proxy::{Mode, Proxy};
    use std::net::ToSocketAddrs;
    let upstream = (connect.get_host(), connect.get_port()).to_socket_addrs().unwrap().next().unwrap();
    let proxy = Proxy::start(upstream).await;
    let through_proxy = connect.clone().host("127.0.0.1").port(proxy.address().port());
    let replica = service(&through_proxy, Arc::new(ManualClock::new(instant())), &[]).await;
    let grpc = replica.grpc.unwrap();
    rule(&replica, "closed", directory_rule("GET /v1/users", &json!({ "tenant": "*" }), 10.0, 0)).await;
    let mut open = directory_rule("GET /v1/orders", &json!({ "tenant": "*" }), 10.0, 0);
    open["fail_mode"] = json!("OPEN");
    rule(&replica, "open", open).await;
    let users = [USERS, ("tenant", "contoso")];
    let orders = [("api", "GET /v1/orders"), ("tenant", "contoso")];
    assert_eq!(overall(&grpc::call(grpc, one(&users, 1)).await), "OK");

    proxy.set(Mode::Severed);
    // CLOSED: not a refusal but an error, so Envoy's failure_mode_deny decides.
    let answers = grpc::calls(grpc, json!([one(&users, 1), one(&orders, 1)])).await;
    assert_eq!(answers[0]["grpc"], "UNAVAILABLE", "{}", answers[0]);
    // OPEN: admitted without a decision.
    assert_eq!(overall(&answers[1]), "OK");
    let http = http_decide(&replica, &http_one(&users, 1)).await;
    assert_eq!((http.status, http.code()), (StatusCode::INTERNAL_SERVER_ERROR, "internal"), "{http:?}");
    let errors = "plexsphere_decide_decisions_total{service=\"directory\",outcome=\"error\"}";
    assert_eq!(replica.metric(errors).await, Some(2.0));
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn two_leasing_replicas_grant_a_hot_tenant_its_burst_and_never_more(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    // Issue 25: with leases on, a hot tenant's decisions are granted from each replica's
    // memory; across both, never more than the burst (the clock stands still: nothing refills).
    let clock = Arc::new(ManualClock::new(instant()));
    let leases = [("PLEXSPHERE_LEASE_MS", "1000")];
    let a = service(&connect, clock.clone(), &leases).await;
    let b = service(&connect, clock, &leases).await;
    rule(&a, "hot-tenant", directory_rule("*", &json!({ "tenant": "*" }), 2000.0, 0)).await;
    eventually(Duration::from_secs(1), "b has the rule", || async {
        let snapshot = b.get("/v1/snapshot?service=directory", Some(DECIDE_TOKEN)).await;
        snapshot.body["rules"].as_array().is_some_and(|rules| !rules.is_empty())
    })
    .await;
    // Sixteen callers on each replica, one request after another, 3,000 in all.
    let request = http_one(&[USERS, ("tenant", "hot")], 1);
    let callers: Vec<_> = (0..32)
        .map(|caller| {
            let replica = if caller % 2 == 0 { (*a).clone() } else { (*b).clone() };
            let request = request.clone();
            tokio::spawn(async move {
                let mut granted = 0;
                for _ in 0..3000 / 32 + 1 {
                    let answer = http_decide(&replica, &request).await;
                    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
                    granted += usize::from(answer.body["overall_code"] == "OK");
                }
                granted
            })
        })
        .collect();
    let mut ok = 0;
    for caller in callers {
        ok += caller.await.unwrap();
    }
    let (mut from_leases, mut leased, mut refunded) = (0.0, 0.0, 0.0);
    for replica in [&a, &b] {
        let metrics = replica.get("/metrics", None).await.body;
        let text = metrics.as_str().unwrap_or_default().to_owned();
        let sum = |family: &str| {
            text.lines()
                .filter(|line| line.starts_with(family))
                .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>()
        };
        from_leases += sum("plexsphere_rate_budget_leased_grants_total");
        leased += sum("plexsphere_rate_budget_leased_tokens_total");
        refunded += sum("plexsphere_rate_budget_lease_refunded_tokens_total");
    }
    eprintln!("{ok} granted of a burst of 2000, {from_leases} from leases; {leased} tokens leased, {refunded} given back");
    assert!(ok <= 2000, "{ok} granted of a burst of 2000");
    assert!(ok >= 1900, "{ok} granted: leases held back more than 5% of the burst");
    assert!(from_leases > 500.0, "{from_leases} grants from leases");
    let status = a.operator(Method::GET, "/v1/status", None).await;
    assert!(status.body["leased"].is_array(), "{status:?}");
}

/// The worst excess over `burst + rate × (B − A)` among the windows [A, B] that hold whole
/// admissions as their clients saw them, (sent, answered) in seconds: positive is over.
fn worst_window_seen(admissions: &mut [(f64, f64)], rate: f64, burst: f64) -> f64 {
    admissions.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut worst = f64::MIN;
    for (i, &(start, _)) in admissions.iter().enumerate() {
        let mut ends: Vec<f64> = admissions[i..].iter().map(|(_, answered)| *answered).collect();
        ends.sort_by(f64::total_cmp);
        for (m, &end) in ends.iter().enumerate() {
            worst = worst.max((m + 1) as f64 - (burst + rate * (end - start)));
        }
    }
    worst
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn three_leasing_replicas_saturating_a_hot_tenant_stay_within_its_budget_and_a_reset_ends_their_leases(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    // Issue 25's acceptance: three real replicas with leases on, a hot tenant saturated by 48
    // callers on the system clock: no window the clients saw over the bound, at most 1% fewer
    // grants than the rule's rate in the steady middle of the run; then a reset of a bucket
    // they hold leases of ends every lease within a second.
    let clock: Arc<dyn ratebudget::Clock> = Arc::new(ratebudget::SystemClock);
    let token = format!("envoy:{DECIDE_TOKEN}");
    let knobs = [("PLEXSPHERE_DECIDE_TOKENS", token.as_str()), ("PLEXSPHERE_LEASE_MS", "200")];
    let mut replicas = Vec::new();
    for _ in 0..3 {
        replicas.push(Replica::start(config(&connect, &knobs), clock.clone()).await);
    }
    let (rate, burst) = (300.0, 100.0);
    let saturated = json!({ "service": "directory", "api": "*", "selector": { "tenant": "*" }, "rate": rate, "burst": burst });
    rule(&replicas[0], "saturated", saturated).await;
    eventually(Duration::from_secs(2), "every replica has the rule", || async {
        let mut all = true;
        for replica in &replicas {
            let snapshot = replica.get("/v1/snapshot?service=directory", Some(DECIDE_TOKEN)).await;
            all &= snapshot.body["rules"].as_array().is_some_and(|rules| !rules.is_empty());
        }
        all
    })
    .await;

    let started = std::time::Instant::now();
    let run = Duration::from_secs(3);
    let request = http_one(&[USERS, ("tenant", "hot")], 1);
    // The offered load: four times the rule's rate, spread over the callers, each sending on a
    // fixed schedule (an open loop, as a proxy's clients are). That saturates the bucket, and
    // it leaves the replicas their CPU: callers sending back to back as fast as refusals come
    // back starved the replicas' lease work on this 2-core
    // machine and so measured the CPU the test itself took, not the leases.
    let callers_count = 48;
    let every = Duration::from_secs_f64(callers_count as f64 / (4.0 * rate));
    let callers: Vec<_> = (0..callers_count)
        .map(|caller| {
            let replica = (*replicas[caller % 3]).clone();
            let request = request.clone();
            tokio::spawn(async move {
                let mut admitted = Vec::new();
                let mut schedule = tokio::time::interval(every);
                while started.elapsed() < run {
                    schedule.tick().await;
                    let sent = started.elapsed().as_secs_f64();
                    let answer = http_decide(&replica, &request).await;
                    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
                    if answer.body["overall_code"] == "OK" {
                        admitted.push((sent, started.elapsed().as_secs_f64()));
                    }
                }
                admitted
            })
        })
        .collect();
    let mut admissions = Vec::new();
    for caller in callers {
        admissions.extend(caller.await.unwrap());
    }
    let worst = worst_window_seen(&mut admissions, rate, burst);
    // The steady middle: after the burst is spent, before the run's end. A client knows only
    // that its grant was made between sending and its answer, so the grants the middle may
    // hold are those whose span meets it. Counting by the answer alone failed on 2 busy
    // cores at 442 of 450 in a run whose spans allowed 458: a stalled caller moves its
    // answers across the window's edge, and the bucket does not lose them. Leases that lose
    // 3% of their tokens still fail this at about 430.
    let (middle_starts, middle_ends) = (1.0, 2.5);
    let may_hold = |&&(sent, answered): &&(f64, f64)| answered >= middle_starts && sent < middle_ends;
    let must_hold = |&&(sent, answered): &&(f64, f64)| sent >= middle_starts && answered < middle_ends;
    let most = admissions.iter().filter(may_hold).count() as f64;
    let least = admissions.iter().filter(must_hold).count();
    let expected = rate * (middle_ends - middle_starts);
    eprintln!(
        "{} admitted in {run:?} at {rate}/s, burst {burst}; {least} to {most} in the 1.5 s middle (rate x 1.5 s = {expected}); worst window {worst:.2}",
        admissions.len(),
    );
    assert!(worst <= 0.0, "a window held {worst} admissions over the bound");
    assert!(most >= 0.99 * expected, "at most {most} admitted in the middle: more than 1% under the rate");

    // A bucket they lease, not yet spent: a big burst, a few hot decisions through each.
    let roomy = json!({ "service": "directory", "api": "*", "selector": { "tenant": "roomy" }, "rate": 10, "burst": 10000, "priority": 1 });
    rule(&replicas[0], "roomy", roomy).await;
    let roomy_request = http_one(&[USERS, ("tenant", "roomy")], 1);
    for replica in &replicas {
        eventually(Duration::from_secs(2), "the replica leases the roomy tenant", || async {
            for _ in 0..20 {
                http_decide(replica, &roomy_request).await;
            }
            let status = replica.operator(Method::GET, "/v1/status", None).await;
            status.body["leased"].as_array().is_some_and(|leased| {
                leased.iter().any(|lease| lease["held"].as_f64().unwrap_or_default() > 0.0)
            })
        })
        .await;
    }
    let status = replicas[0].operator(Method::GET, "/v1/status", None).await;
    let lease = status.body["leased"]
        .as_array()
        .unwrap()
        .iter()
        .max_by(|a, b| {
            a["held"].as_f64().unwrap_or_default().total_cmp(&b["held"].as_f64().unwrap_or_default())
        })
        .unwrap()
        .clone();
    let store = ratebudget::Store::new(
        PgPoolOptions::new().max_connections(1).connect_with(connect.clone()).await.unwrap(),
    );
    let name = ratebudget::Name::new(lease["budget"].as_str().unwrap()).unwrap();
    let key = ratebudget::Key::from(lease["key"].as_str().unwrap().parse::<uuid::Uuid>().unwrap());
    let reset_at = std::time::Instant::now();
    assert!(store.reset(name, key).await.unwrap());
    for replica in &replicas {
        eventually(Duration::from_secs(1), "the reset ends the replica's lease", || async {
            let status = replica.operator(Method::GET, "/v1/status", None).await;
            !status.body["leased"].as_array().unwrap().iter().any(|held| held["key"] == lease["key"])
        })
        .await;
    }
    eprintln!("every lease of the bucket ended {:?} after the reset", reset_at.elapsed());
    for replica in replicas {
        replica.stop().await;
    }
}

/// Issue 32, item 1 (over-admission): the runtime key hashed every entry, so a caller varying
/// an entry the governing rule ignores (`sku`, from a client header) got a fresh, full bucket
/// each time. The audit's reproduction, through Python's grpcio client: now the rule's own
/// entries key its bucket, and `sku=x1` .. `sku=x6` are over the limit with the rest.
#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn entries_the_governing_rule_does_not_name_never_split_its_bucket(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let clock = Arc::new(ManualClock::new(instant()));
    let replica = service(&connect, clock, &[]).await;
    let grpc = replica.grpc.unwrap();
    let contoso = json!({
        "service": "directory", "api": "GET /v1/users", "selector": { "tenant": "contoso" },
        "rate": 1, "per_ms": 60000, "burst": 2,
    });
    rule(&replica, "contoso", contoso).await;
    let mut script = vec![one(&[USERS, ("sku", "basic"), ("tenant", "contoso")], 1); 4];
    for sku in ["x1", "x2", "x3", "x4", "x5", "x6"] {
        script.push(one(&[USERS, ("sku", sku), ("tenant", "contoso")], 1));
    }
    // Entries in another order, or another entry beside them: still Contoso's one bucket.
    script.push(one(&[("tenant", "contoso"), USERS, ("region", "eu")], 1));
    let answers = grpc::calls(grpc, Value::Array(script)).await;
    let codes: Vec<&str> = answers.iter().map(overall).collect();
    assert_eq!(codes[..2], ["OK", "OK"]);
    assert!(codes[2..].iter().all(|code| *code == "OVER_LIMIT"), "the burst is 2: {codes:?}");
    // HTTP decides in the same bucket, whatever the unnamed entries hold.
    let over = http_decide(&replica, &http_one(&[USERS, ("sku", "x7"), ("tenant", "contoso")], 1)).await;
    assert_eq!(over.body["overall_code"], "OVER_LIMIT", "{over:?}");

    // `"*"` keys a bucket per value, an exact value one bucket shared by all it matches.
    rule(
        &replica,
        "premium-each",
        directory_rule("GET /v1/groups", &json!({ "sku": "premium", "tenant": "*" }), 2.0, 0),
    )
    .await;
    rule(&replica, "premium-shared", directory_rule("GET /v1/orders", &json!({ "sku": "premium" }), 2.0, 0))
        .await;
    let groups = ("api", "GET /v1/groups");
    let orders = ("api", "GET /v1/orders");
    let answers = grpc::calls(
        grpc,
        json!([
            one(&[groups, ("sku", "premium"), ("tenant", "a")], 2),
            one(&[groups, ("sku", "premium"), ("tenant", "b")], 2),
            one(&[groups, ("sku", "premium"), ("tenant", "a")], 1),
            one(&[orders, ("sku", "premium"), ("tenant", "a")], 2),
            one(&[orders, ("sku", "premium"), ("tenant", "b")], 1),
        ]),
    )
    .await;
    let codes: Vec<&str> = answers.iter().map(overall).collect();
    assert_eq!(codes, ["OK", "OK", "OVER_LIMIT", "OK", "OVER_LIMIT"]);
}

/// Issue 32, item 2 (over-admission through Envoy, which admits a request whose call fails):
/// a value over 256 characters, a TAB, a descriptor cost above 2^53, more than 16
/// descriptors or more than two governed ones made the whole request INVALID_ARGUMENT, even
/// beside a descriptor already over its limit. Each is now decided (more than two governed
/// ones all or nothing, in one take, since issue 34, item 3).
#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn no_value_a_client_chooses_turns_a_decision_into_an_error(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let clock = Arc::new(ManualClock::new(instant()));
    let replica = service(&connect, clock, &[]).await;
    let grpc = replica.grpc.unwrap();
    rule(&replica, "contoso", directory_rule("GET /v1/users", &json!({ "tenant": "contoso" }), 1.0, 0)).await;
    rule(&replica, "per-user", directory_rule("*", &json!({ "user": "*" }), 1.0, 0)).await;
    rule(&replica, "per-region", directory_rule("*", &json!({ "region": "*" }), 1.0, 0)).await;
    let contoso = json!({ "entries": [["api", "GET /v1/users"], ["tenant", "contoso"]] });
    let long = "v".repeat(300);
    let request = |descriptors: Vec<Value>| json!({ "token": DECIDE_TOKEN, "domain": "directory", "descriptors": descriptors });
    let unlimited = |key: &str, value: &str| json!({ "entries": [[key, value]] });
    // Contoso's one token, spent.
    let spent = grpc::call(grpc, request(vec![contoso.clone()])).await;
    assert_eq!(overall(&spent), "OK");

    let mut many = vec![contoso.clone()];
    many.extend((0..20).map(|n| unlimited("colour", &format!("c{n}"))));
    let answers = grpc::calls(
        grpc,
        json!([
            request(vec![contoso.clone(), unlimited("note", &long)]),
            request(vec![contoso.clone(), unlimited("note", "a\tb")]),
            request(vec![
                contoso.clone(),
                json!({ "entries": [["colour", "red"]], "hits_addend": 1u64 << 60 })
            ]),
            request(many),
            request(vec![contoso.clone(), unlimited("user", "alice"), unlimited("region", "eu")]),
        ]),
    )
    .await;
    for answer in &answers {
        assert_eq!(overall(answer), "OVER_LIMIT", "{answer}");
        assert_eq!(status(answer, 0)["code"], "OVER_LIMIT", "{answer}");
    }
    assert_eq!(status(&answers[0], 1)["code"], "OK", "an unlimited long value is decided, not refused");
    // Three governed descriptors are one take (issue 34, item 3): Contoso's is over, and only
    // it; the others' buckets, which alone would have admitted, spent nothing.
    assert_eq!(
        (status(&answers[4], 1)["code"].as_str(), status(&answers[4], 2)["code"].as_str()),
        (Some("OK"), Some("OK"))
    );
    let others = request(vec![unlimited("user", "alice"), unlimited("region", "eu")]);
    assert_eq!(overall(&grpc::call(grpc, others).await), "OK", "each still holds its one token");

    // A long or unusual value in a governed entry is hashed like any other: its own bucket.
    let odd = grpc::calls(
        grpc,
        json!([
            request(vec![unlimited("user", &long)]),
            request(vec![unlimited("user", &long)]),
            request(vec![unlimited("user", "tab\there")]),
            // A cost no bucket can hold is over the limit, as a cost above the burst is.
            request(vec![json!({ "entries": [["user", "bob"]], "hits_addend": (1u64 << 53) + 1 })]),
        ]),
    )
    .await;
    let codes: Vec<&str> = odd.iter().map(overall).collect();
    assert_eq!(codes, ["OK", "OVER_LIMIT", "OK", "OVER_LIMIT"]);
    // Nothing was spent by the request that was over: bob's bucket still holds its token.
    assert_eq!(overall(&grpc::call(grpc, request(vec![unlimited("user", "bob")])).await), "OK");

    // The same over HTTP: decided, never a 400.
    let http = http_decide(
        &replica,
        &json!({ "domain": "directory", "descriptors": [
            { "entries": [{ "key": "api", "value": "GET /v1/users" }, { "key": "tenant", "value": "contoso" }] },
            { "entries": [{ "key": "note", "value": long }], "hits_addend": u64::MAX },
        ]}),
    )
    .await;
    assert_eq!(
        (http.status, http.body["overall_code"].as_str()),
        (StatusCode::OK, Some("OVER_LIMIT")),
        "{http:?}"
    );
}

/// Issue 32, item 3: the failed-authentication budget of the socket's peer was checked before
/// the token, so behind a load balancer or SNAT one stray caller with a wrong token locked
/// every Envoy out (RESOURCE_EXHAUSTED, which Envoy admits). A valid token is decided after 30
/// failures from its address; a wrong one is still throttled.
#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_valid_token_is_decided_whatever_its_address_failed(_: PgPoolOptions, connect: PgConnectOptions) {
    let clock = Arc::new(ManualClock::new(instant()));
    let replica = service(&connect, clock, &[]).await;
    let grpc = replica.grpc.unwrap();
    rule(&replica, "contoso", directory_rule("GET /v1/users", &json!({ "tenant": "contoso" }), 10.0, 0))
        .await;
    let contoso = [USERS, ("tenant", "contoso")];
    let mut wrong = one(&contoso, 1);
    wrong["token"] = json!("not-the-token-0123456789");
    let mut script = vec![wrong.clone(); 30];
    script.push(one(&contoso, 1));
    script.push(wrong);
    let answers = grpc::calls(grpc, Value::Array(script)).await;
    assert_eq!(answers[29]["grpc"], "RESOURCE_EXHAUSTED", "the address is spent: {}", answers[29]);
    assert_eq!(overall(&answers[30]), "OK", "a valid token is decided");
    assert_eq!(answers[31]["grpc"], "RESOURCE_EXHAUSTED", "{}", answers[31]);
    // HTTP shares the budget and vouches for a valid token too.
    let http = http_decide(&replica, &http_one(&contoso, 1)).await;
    assert_eq!(http.status, StatusCode::OK, "{http:?}");
}

/// Issue 32, item 4: any decide token saw every service's rules (plexsphere's own, with Domain
/// ids, among them) and spent any service's buckets. A token names the services it decides
/// for; another is PERMISSION_DENIED / 403, and plexsphere's own snapshot needs an operator.
#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_decide_token_decides_and_sees_only_the_services_it_names(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let clock = Arc::new(ManualClock::new(instant()));
    let tokens = format!("envoy:{DECIDE_TOKEN},edge:edge-decide-token-0123456789:directory|billing");
    let knobs = [("PLEXSPHERE_DECIDE_TOKENS", tokens.as_str()), ("PLEXSPHERE_GRPC_LISTEN", "127.0.0.1:0")];
    let replica = Replica::start(config(&connect, &knobs), clock).await;
    let grpc = replica.grpc.unwrap();
    rule(&replica, "contoso", directory_rule("GET /v1/users", &json!({ "tenant": "contoso" }), 10.0, 0))
        .await;
    replica.create_domain("acme", Some((5.0, 10.0))).await;
    let edge = "edge-decide-token-0123456789";
    let as_edge = |domain: &str| json!({ "token": edge, "domain": domain, "descriptors": [{ "entries": [["api", "GET /v1/users"], ["tenant", "contoso"]] }] });
    let answers =
        grpc::calls(grpc, json!([as_edge("directory"), as_edge("inventory"), as_edge("plexsphere")])).await;
    assert_eq!(overall(&answers[0]), "OK");
    assert_eq!(answers[1]["grpc"], "PERMISSION_DENIED", "{}", answers[1]);
    assert_eq!(answers[2]["grpc"], "PERMISSION_DENIED", "{}", answers[2]);
    let mut envoy_own = as_edge("plexsphere");
    envoy_own["token"] = json!(DECIDE_TOKEN);
    assert_eq!(grpc::call(grpc, envoy_own).await["grpc"], "PERMISSION_DENIED");

    let body =
        json!({ "domain": "inventory", "descriptors": [{ "entries": [{ "key": "tenant", "value": "x" }] }] });
    let http =
        replica.request(Method::POST, "/v1/decide", Some(edge), Some(body.to_string().into_bytes())).await;
    assert_eq!((http.status, http.code()), (StatusCode::FORBIDDEN, "forbidden"), "{http:?}");

    // Snapshots: a decide token sees its services only, never plexsphere's own rules.
    let snapshot = |service: &str, token: &'static str| {
        let path = format!("/v1/snapshot?service={service}");
        let replica = &replica;
        async move { replica.get(&path, Some(token)).await.status }
    };
    assert_eq!(snapshot("directory", "edge-decide-token-0123456789").await, StatusCode::OK);
    assert_eq!(snapshot("inventory", "edge-decide-token-0123456789").await, StatusCode::FORBIDDEN);
    assert_eq!(snapshot("plexsphere", DECIDE_TOKEN).await, StatusCode::FORBIDDEN);
    assert_eq!(snapshot("plexsphere", "edge-decide-token-0123456789").await, StatusCode::FORBIDDEN);
    let operator = replica.operator(Method::GET, "/v1/snapshot?service=plexsphere", None).await;
    assert_eq!(operator.status, StatusCode::OK, "{operator:?}");
    assert!(!operator.body["rules"].as_array().unwrap().is_empty(), "acme's override rule: {operator:?}");
}

/// Issue 34, item 5: a rule of 1,000 a day was a 400 (a bucket had to refill within the
/// sweep's hour, since the sweep deleted every bucket idle for an hour as if it were full).
/// Now it is accepted, admits exactly its burst, keeps its bucket through the sweep while it
/// refills, and refills at 1,000 a day, on the manual clock.
#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_rule_of_a_thousand_a_day_admits_its_burst_survives_the_sweep_and_refills_at_its_rate(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let clock = Arc::new(ManualClock::new(instant()));
    // The leader sweeps every second (of the test's wall clock) at the manual clock's now.
    let replica = service(&connect, clock.clone(), &[("PLEXSPHERE_SWEEP_INTERVAL_SECS", "1")]).await;
    let daily = json!({
        "service": "directory", "api": "*", "selector": { "tenant": "*" },
        "rate": 1000, "per_ms": 86_400_000, "burst": 1000,
    });
    rule(&replica, "daily", daily).await;
    let tenant = |hits: u64| http_one(&[("tenant", "contoso")], hits);
    let decide = |hits: u64| {
        let replica = &replica;
        async move { http_decide(replica, &tenant(hits)).await.body["overall_code"].as_str().unwrap().to_owned() }
    };
    assert_eq!(decide(1000).await, "OK", "the whole burst at once");
    assert_eq!(decide(1).await, "OVER_LIMIT", "and not one more");

    // Two hours later: 83.3 tokens have refilled. The sweep has run since, and kept the bucket.
    let sweeps = "plexsphere_rate_budget_sweeps_total{outcome=\"ok\"}";
    let before = replica.metric(sweeps).await.unwrap_or(0.0);
    clock.advance(chrono::TimeDelta::hours(2));
    eventually(Duration::from_secs(20), "the leader sweeps at the new now", || async {
        replica.metric(sweeps).await.unwrap_or(0.0) >= before + 2.0
    })
    .await;
    let pool = pool.connect_with(connect.clone()).await.unwrap();
    let rows: i64 =
        sqlx::query_scalar("SELECT count(*) FROM plexsphere.rate_budgets WHERE scope = 'service_requests'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(rows, 1, "a bucket that has not refilled is not swept");
    assert_eq!(decide(83).await, "OK");
    assert_eq!(decide(1).await, "OVER_LIMIT", "2 h of 1,000 a day is 83.3 tokens");
    // One token every 86.4 s: the third left over and a minute's 0.69 make one.
    clock.advance(chrono::TimeDelta::seconds(60));
    assert_eq!(decide(1).await, "OK");
    assert_eq!(decide(1).await, "OVER_LIMIT");

    // A day and a bit after the last take it is full, and the sweep deletes it.
    clock.advance(chrono::TimeDelta::seconds(86_400 + 60));
    let before = replica.metric(sweeps).await.unwrap_or(0.0);
    eventually(Duration::from_secs(20), "the leader sweeps again", || async {
        replica.metric(sweeps).await.unwrap_or(0.0) >= before + 2.0
    })
    .await;
    let rows: i64 =
        sqlx::query_scalar("SELECT count(*) FROM plexsphere.rate_budgets WHERE scope = 'service_requests'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(rows, 0, "a full bucket is swept");
    // Our own rules keep the hour.
    let own =
        json!({ "scope": "ingest_node", "selector": {}, "rate": 1000, "per_ms": 86_400_000, "burst": 1000 });
    let refused = replica.operator(Method::PUT, "/v1/rules/own-daily", Some(own)).await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{refused:?}");
}

/// Issue 34, item 6: an operator resets one service bucket by its service and entries, over
/// HTTP on one replica and from the command line; every replica hears of it, and each is
/// audited with the rule that governs the bucket.
#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn an_operator_resets_a_service_bucket_by_its_descriptor_and_every_replica_hears(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let clock = Arc::new(ManualClock::new(instant()));
    let a = service(&connect, clock.clone(), &[]).await;
    let b = service(&connect, clock.clone(), &[]).await;
    rule(&a, "contoso", directory_rule("GET /v1/users", &json!({ "tenant": "contoso" }), 2.0, 0)).await;
    let contoso = [USERS, ("sku", "x"), ("tenant", "contoso")];
    async fn over(replica: &Replica) -> bool {
        let contoso = [USERS, ("sku", "x"), ("tenant", "contoso")];
        http_decide(replica, &http_one(&contoso, 1)).await.body["overall_code"] == "OVER_LIMIT"
    }
    eventually(Duration::from_secs(5), "b decides by the rule", || async {
        http_decide(&b, &http_one(&contoso, 2)).await.body["statuses"][0]["rule_id"] == "contoso"
    })
    .await;
    assert!(over(&b).await, "b's pre-check now knows the bucket is empty");

    // Another entry the rule does not name: the same bucket.
    let reset = a
        .operator(
            Method::POST,
            "/v1/decide/reset",
            Some(json!({ "domain": "directory", "entries": [
                { "key": "api", "value": "GET /v1/users" }, { "key": "tenant", "value": "contoso" }, { "key": "sku", "value": "other" },
            ]})),
        )
        .await;
    assert_eq!(reset.status, StatusCode::OK, "{reset:?}");
    assert_eq!(reset.body, json!({ "existed": true, "rule_id": "contoso" }));
    eventually(Duration::from_secs(5), "b hears of the reset", || async { !over(&b).await }).await;

    // From the command line, audited as the command line.
    // The polling above spent one of the two tokens; the next spends the other.
    assert!(!over(&b).await);
    assert!(over(&b).await, "spent again");
    let mut printed = Vec::new();
    let entries = [("api", "GET /v1/users"), ("tenant", "contoso")]
        .map(|(key, value)| service::decide::Entry { key: key.into(), value: value.into() });
    app::cli::reset_service_bucket(connect.clone(), "directory", &entries, &mut printed).await.unwrap();
    let printed = String::from_utf8(printed).unwrap();
    assert!(printed.contains("rule contoso"), "{printed}");
    eventually(Duration::from_secs(5), "b hears of the second reset", || async { !over(&b).await }).await;

    let pool = pool.connect_with(connect.clone()).await.unwrap();
    let audited: Vec<(String, String, Option<String>)> = sqlx::query_as(
        "SELECT actor, action, rule_id FROM plexsphere.audit_events WHERE action = 'bucket.reset' ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        audited,
        [
            ("operator".to_owned(), "bucket.reset".to_owned(), Some("contoso".to_owned())),
            ("<cli>".to_owned(), "bucket.reset".to_owned(), Some("contoso".to_owned())),
        ]
    );

    // A descriptor no rule governs has no bucket: a 404, and nothing audited.
    let ungoverned = a
        .operator(
            Method::POST,
            "/v1/decide/reset",
            Some(json!({ "domain": "directory", "entries": [{ "key": "tenant", "value": "fabrikam" }] })),
        )
        .await;
    assert_eq!((ungoverned.status, ungoverned.code()), (StatusCode::NOT_FOUND, "ungoverned"));
    let count: i64 =
        sqlx::query_scalar("SELECT count(*) FROM plexsphere.audit_events WHERE action = 'bucket.reset'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(count, 2);
    // A decide token cannot reset.
    let as_caller = a
        .request(
            Method::POST,
            "/v1/decide/reset",
            Some(DECIDE_TOKEN),
            Some(
                json!({ "domain": "directory", "entries": [{ "key": "tenant", "value": "contoso" }] })
                    .to_string()
                    .into_bytes(),
            ),
        )
        .await;
    assert_eq!(as_caller.status, StatusCode::UNAUTHORIZED);
}

/// Issue 34, item 4: a descriptor's `limit` override (Envoy's `RateLimitOverride`, which its
/// route configuration sets) replaces the rules' limit for that request, as envoyproxy/ratelimit
/// applies it, in a bucket of its own: requests with an override never drain the bucket of
/// those without, and `requests_per_unit: 0` refuses every request with nothing spent.
#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_descriptors_limit_override_decides_in_a_bucket_of_its_own(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let clock = Arc::new(ManualClock::new(instant()));
    let replica = service(&connect, clock, &[]).await;
    let grpc = replica.grpc.unwrap();
    rule(&replica, "contoso", directory_rule("GET /v1/users", &json!({ "tenant": "contoso" }), 10.0, 0))
        .await;
    let contoso = [USERS, ("tenant", "contoso")];
    let with_limit = |requests_per_unit: u32, unit: &str, hits: u64| {
        let mut call = one(&contoso, hits);
        call["descriptors"][0]["limit"] = json!({ "requests_per_unit": requests_per_unit, "unit": unit });
        call
    };
    let answers = grpc::calls(
        grpc,
        json!([
            with_limit(3, "DAY", 3),
            with_limit(3, "DAY", 1),
            one(&contoso, 10),
            with_limit(0, "SECOND", 1)
        ]),
    )
    .await;
    // The override's 3 a day: its whole burst, then over; its limit as Envoy gave it.
    assert_eq!(overall(&answers[0]), "OK");
    assert_eq!(
        status(&answers[0], 0)["current_limit"],
        json!({ "name": "contoso", "requests_per_unit": 3, "unit": "DAY" })
    );
    assert_eq!(overall(&answers[1]), "OVER_LIMIT");
    // The rule's own bucket was not touched: its 10 are all there.
    assert_eq!(overall(&answers[2]), "OK", "{}", answers[2]);
    assert_eq!(status(&answers[2], 0)["limit_remaining"], 0);
    // An override of 0 refuses, whatever the buckets hold.
    assert_eq!(overall(&answers[3]), "OVER_LIMIT");
    assert_eq!(status(&answers[3], 0)["current_limit"]["requests_per_unit"], 0);
}

/// Issue 34, item 6: stopping a replica (what SIGTERM does) drains the gRPC server as it
/// drains HTTP: a call in flight finishes with its decision, and the port then takes no new
/// call, so Envoy's next one goes to another replica.
#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn stopping_a_replica_lets_a_grpc_call_in_flight_finish(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let clock = Arc::new(ManualClock::new(instant()));
    // A decision may wait seconds for its row here, so the call in flight is decided, not timed out.
    let knobs = [("PLEXSPHERE_DATABASE_TIMEOUT_MS", "10000"), ("PLEXSPHERE_DECISION_TIMEOUT_MS", "8000")];
    let replica = service(&connect, clock, &knobs).await;
    let grpc = replica.grpc.unwrap();
    rule(&replica, "contoso", directory_rule("GET /v1/users", &json!({ "tenant": "contoso" }), 10.0, 0))
        .await;
    let contoso = [USERS, ("tenant", "contoso")];
    assert_eq!(overall(&grpc::call(grpc, one(&contoso, 1)).await), "OK", "the bucket's row exists");

    // Hold the bucket's row, so the next call's statement waits on it.
    let pool = pool.connect_with(connect.clone()).await.unwrap();
    let mut holding = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM plexsphere.rate_budgets WHERE scope = 'service_requests' FOR UPDATE")
        .execute(&mut *holding)
        .await
        .unwrap();
    let in_flight = tokio::spawn(grpc::call(grpc, one(&contoso, 1)));
    eventually(Duration::from_secs(20), "the call's statement waits on the row", || {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()",
            )
            .fetch_one(&pool)
            .await
            .unwrap()
                > 0
        }
    })
    .await;
    let stopping = tokio::spawn(replica.stop());
    // The replica is stopping before the call can be decided: its gRPC port takes no new
    // connection, while the call in flight still waits on the row.
    eventually(Duration::from_secs(20), "the gRPC port closes", || async {
        tokio::net::TcpStream::connect(grpc).await.is_err()
    })
    .await;
    assert!(!in_flight.is_finished(), "the call is still waiting on the row");
    holding.commit().await.unwrap();
    let answer = in_flight.await.unwrap();
    assert_eq!(overall(&answer), "OK", "the call in flight was decided: {answer}");
    stopping.await.unwrap();
    let refused = grpc::call(grpc, one(&contoso, 1)).await;
    assert_eq!(refused["grpc"], "UNAVAILABLE", "a stopped replica takes no call: {refused}");
}

/// Found in review: two rules naming the same attributes (`sku` exactly and `tenant` as `*`,
/// and the other way round) govern the same values by the entries' order. Keyed by the
/// attributes alone, both descriptors of one request named one bucket under two limits: a
/// take the store refuses as bad input, which answered UNAVAILABLE, and Envoy admits. Each
/// rule's buckets are its own now, so the request is decided.
#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn two_rules_naming_the_same_attributes_never_share_a_bucket(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let clock = Arc::new(ManualClock::new(instant()));
    let replica = service(&connect, clock, &[]).await;
    let grpc = replica.grpc.unwrap();
    rule(&replica, "premium", directory_rule("*", &json!({ "sku": "premium", "tenant": "*" }), 1.0, 0)).await;
    rule(&replica, "acme", directory_rule("*", &json!({ "sku": "*", "tenant": "acme" }), 100.0, 0)).await;
    let both = json!({ "token": DECIDE_TOKEN, "domain": "directory", "descriptors": [
        { "entries": [["tenant", "acme"], ["sku", "premium"]] },
        { "entries": [["sku", "premium"], ["tenant", "acme"]] },
    ]});
    let answers = grpc::calls(grpc, json!([both.clone(), both])).await;
    assert_eq!(overall(&answers[0]), "OK", "{}", answers[0]);
    assert_eq!(status(&answers[0], 0)["current_limit"]["name"], "premium");
    assert_eq!(status(&answers[0], 1)["current_limit"]["name"], "acme");
    // The premium rule's one token is spent; acme's bucket is its own.
    assert_eq!(overall(&answers[1]), "OVER_LIMIT", "{}", answers[1]);
    assert_eq!(status(&answers[1], 0)["code"], "OVER_LIMIT");
}

/// Every bucket's row, in key order: what a decision that spends nothing must leave as it was.
async fn rows(connect: &PgConnectOptions) -> Vec<(String, uuid::Uuid, f64, chrono::DateTime<chrono::Utc>)> {
    let pool = PgPoolOptions::new().max_connections(1).connect_with(connect.clone()).await.unwrap();
    let rows = sqlx::query_as(
        "SELECT scope, bucket_key, tokens, refilled_at FROM plexsphere.rate_budgets ORDER BY scope, bucket_key",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    pool.close().await;
    rows
}

/// Issue 34, item 3's acceptance: every descriptor of a request is decided in one take, all or
/// nothing. A request of 64 governed descriptors is decided whole; with one of them over its
/// limit, it is over the limit at that descriptor alone and no bucket is debited: the rows
/// are unchanged, to the bit. Over gRPC and over HTTP alike.
#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn sixty_four_descriptors_one_over_debit_nothing(_: PgPoolOptions, connect: PgConnectOptions) {
    let clock = Arc::new(ManualClock::new(instant()));
    let replica = service(&connect, clock, &[]).await;
    let grpc = replica.grpc.unwrap();
    rule(&replica, "per-user", directory_rule("*", &json!({ "user": "*" }), 3.0, 0)).await;
    let users: Vec<String> = (0..64).map(|n| format!("u{n}")).collect();
    let grpc_request = |hits: &dyn Fn(usize) -> u64| {
        let descriptors: Vec<Value> = users
            .iter()
            .enumerate()
            .map(|(n, user)| json!({ "entries": [["user", user]], "hits_addend": hits(n) }))
            .collect();
        json!({ "token": DECIDE_TOKEN, "domain": "directory", "descriptors": descriptors })
    };

    // All 64 fit: one take of 64 buckets, each granted and read at its own position.
    let granted = grpc::call(grpc, grpc_request(&|n| if n == 17 { 2 } else { 1 })).await;
    assert_eq!(overall(&granted), "OK", "{granted}");
    for n in 0..64 {
        let left = if n == 17 { 1 } else { 2 };
        assert_eq!(status(&granted, n)["limit_remaining"], left, "descriptor {n}: {granted}");
    }
    let before = rows(&connect).await;
    assert_eq!(before.len(), 64, "one row a descriptor");

    // u17 holds 1 and is asked for 2: over, alone; the 63 others would each have fitted.
    let over = grpc::call(grpc, grpc_request(&|n| if n == 17 { 2 } else { 1 })).await;
    assert_eq!(overall(&over), "OVER_LIMIT", "{over}");
    let codes: Vec<&str> = (0..64).map(|n| status(&over, n)["code"].as_str().unwrap()).collect();
    assert!(
        codes.iter().enumerate().all(|(n, code)| *code == if n == 17 { "OVER_LIMIT" } else { "OK" }),
        "{codes:?}"
    );
    assert_eq!(rows(&connect).await, before, "no bucket was debited");

    // The same over HTTP.
    let descriptors: Vec<Value> = users
        .iter()
        .enumerate()
        .map(|(n, user)| json!({ "entries": [{ "key": "user", "value": user }], "hits_addend": if n == 63 { 2 } else { 1 } }))
        .collect();
    let spend_u63 = http_decide(&replica, &http_one(&[("user", "u63")], 1)).await;
    assert_eq!(spend_u63.body["overall_code"], "OK", "{spend_u63:?}");
    let before = rows(&connect).await;
    let http = http_decide(&replica, &json!({ "domain": "directory", "descriptors": descriptors })).await;
    assert_eq!(
        (http.status, http.body["overall_code"].as_str()),
        (StatusCode::OK, Some("OVER_LIMIT")),
        "{http:?}"
    );
    let statuses = http.body["statuses"].as_array().unwrap();
    assert_eq!(statuses.len(), 64);
    assert!(statuses[..63].iter().all(|status| status["code"] == "OK"), "{statuses:?}");
    assert_eq!(statuses[63]["code"], "OVER_LIMIT");
    assert_eq!(rows(&connect).await, before, "no bucket was debited");

    // A token from each fits: all 64 are debited at once.
    assert_eq!(overall(&grpc::call(grpc, grpc_request(&|_| 1)).await), "OK");
    let after = rows(&connect).await;
    assert!(after.iter().zip(&before).all(|(after, before)| after.2 == before.2 - 1.0), "{after:?}");
}
