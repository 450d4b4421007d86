//! Rules through the operator API: versions under `If-Match` (and two writers racing with one
//! ETag), history and rollback, validation that writes nothing, Domain tiers, the issuance
//! override `POST /v1/domains` writes, and which rule governs a Domain at every level of the
//! precedence, as `GET /v1/domains/{id}/limits` explains it.

use std::sync::Arc;

use ratebudget::ManualClock;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;

use crate::support::helpers::instant;
use crate::support::replicas::{config, Answer, Api, Replica};

async fn replica(connect: &PgConnectOptions) -> Replica {
    Replica::start(config(connect, &[]), Arc::new(ManualClock::new(instant()))).await
}

fn rule(scope: &str, selector: Value, rate: f64, burst: f64) -> Value {
    let mut body = json!({ "scope": scope, "rate": rate, "burst": burst });
    body["selector"] = selector;
    body
}

async fn put(api: &Api, id: &str, body: Value, if_match: Option<&str>) -> Answer {
    api.operator_if_match(Method::PUT, &format!("/v1/rules/{id}"), Some(body), if_match).await
}

fn etag(answer: &Answer) -> String {
    answer.header("etag").unwrap_or_else(|| panic!("no ETag: {answer:?}")).to_owned()
}

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_rule_is_created_then_replaced_and_deleted_only_at_the_version_its_writer_read(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let api = replica(&connect).await;
    let reads = rule("secret_read_node", json!({}), 5.0, 10.0);

    let created = put(&api, "all-reads", reads.clone(), None).await;
    assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
    assert_eq!(etag(&created), "\"1\"");
    assert_eq!(
        created.body,
        json!({
            "rule_id": "all-reads", "service": "plexsphere", "scope": "secret_read_node", "selector": {}, "rate": 5.0,
            "per_ms": 1000, "burst": 10.0, "algorithm": "TOKEN_BUCKET", "mode": "ENFORCE",
            "fail_mode": "CLOSED", "priority": 0, "charge": "WHEN_COVERED", "version": 1, "created_by": "operator", "matching": "selector", "source": "api",
            "updated_at": created.body["updated_at"],
        })
    );

    // The rule exists: writing it again without naming its version is 428, with its ETag.
    let again = put(&api, "all-reads", reads.clone(), None).await;
    assert_eq!((again.status, again.code()), (StatusCode::PRECONDITION_REQUIRED, "precondition_required"));
    assert_eq!(etag(&again), "\"1\"");

    let read = api.operator(Method::GET, "/v1/rules/all-reads", None).await;
    assert_eq!((read.status, etag(&read)), (StatusCode::OK, "\"1\"".to_owned()));
    assert_eq!(read.body, created.body);

    let bigger = rule("secret_read_node", json!({}), 5.0, 50.0);
    let replaced = put(&api, "all-reads", bigger.clone(), Some("\"1\"")).await;
    assert_eq!((replaced.status, etag(&replaced)), (StatusCode::OK, "\"2\"".to_owned()));
    assert_eq!(replaced.body["burst"], 50.0);

    // Version 1 is stale now: 412, with the current ETag, and nothing written.
    let stale = put(&api, "all-reads", reads.clone(), Some("\"1\"")).await;
    assert_eq!((stale.status, stale.code()), (StatusCode::PRECONDITION_FAILED, "precondition_failed"));
    assert_eq!(etag(&stale), "\"2\"");
    assert_eq!(api.operator(Method::GET, "/v1/rules/all-reads", None).await.body["burst"], 50.0);

    let delete = |if_match: Option<&'static str>| {
        api.operator_if_match(Method::DELETE, "/v1/rules/all-reads", None, if_match)
    };
    assert_eq!(delete(None).await.status, StatusCode::PRECONDITION_REQUIRED);
    assert_eq!(delete(Some("\"1\"")).await.status, StatusCode::PRECONDITION_FAILED);
    assert_eq!(delete(Some("\"2\"")).await.status, StatusCode::NO_CONTENT);
    let gone = api.operator(Method::GET, "/v1/rules/all-reads", None).await;
    assert_eq!((gone.status, gone.code()), (StatusCode::NOT_FOUND, "unknown_rule"));
    assert_eq!(delete(Some("\"3\"")).await.status, StatusCode::PRECONDITION_FAILED, "nothing to delete");
    assert_eq!(
        put(&api, "all-reads", reads.clone(), Some("\"2\"")).await.status,
        StatusCode::PRECONDITION_FAILED
    );

    // Written again, it continues its versions (3 was the deletion).
    let recreated = put(&api, "all-reads", reads, None).await;
    assert_eq!((recreated.status, etag(&recreated)), (StatusCode::CREATED, "\"4\"".to_owned()));

    let history = api.operator(Method::GET, "/v1/rules/all-reads/history", None).await;
    let history = history.body.as_array().unwrap().clone();
    let changes: Vec<(i64, &str, f64)> = history
        .iter()
        .map(|entry| {
            (
                entry["version"].as_i64().unwrap(),
                entry["change"].as_str().unwrap(),
                entry["burst"].as_f64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        changes,
        [(1, "created", 10.0), (2, "replaced", 50.0), (3, "deleted", 50.0), (4, "created", 10.0)]
    );
    assert!(history.iter().all(|entry| entry["created_by"] == "operator"), "{history:?}");
    let revisions: Vec<i64> = history.iter().map(|entry| entry["revision"].as_i64().unwrap()).collect();
    assert_eq!(revisions, [1, 2, 3, 4], "every change is one revision of the rules");

    put(&api, "ingest", rule("ingest_node", json!({}), 1e6, 1e6), None).await;
    let listed = api.operator(Method::GET, "/v1/rules?scope=ingest_node", None).await;
    let ids: Vec<&str> =
        listed.body.as_array().unwrap().iter().map(|r| r["rule_id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["ingest"]);
    let all = api.operator(Method::GET, "/v1/rules", None).await;
    assert_eq!(all.body.as_array().unwrap().len(), 2);
    let bad = api.operator(Method::GET, "/v1/rules?scope=ingest_cluster", None).await;
    assert_eq!((bad.status, bad.code()), (StatusCode::BAD_REQUEST, "bad_request"));
    api.stop().await;
}

/// Two writers holding the same ETag write at once, through two replicas, round after round:
/// exactly one is applied, the other is told 412, and the version moves by exactly one.
#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn of_two_writers_with_the_same_etag_exactly_one_wins_and_the_other_gets_412(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let (a, b) = (replica(&connect).await, replica(&connect).await);
    let created = put(&a, "contended", rule("secret_read_domain", json!({}), 10.0, 20.0), None).await;
    let mut tag = etag(&created);
    for round in 1..=20 {
        let (first, second) = tokio::join!(
            put(
                &a,
                "contended",
                rule("secret_read_domain", json!({}), 10.0, 100.0 + f64::from(round)),
                Some(&tag)
            ),
            put(
                &b,
                "contended",
                rule("secret_read_domain", json!({}), 10.0, 200.0 + f64::from(round)),
                Some(&tag)
            ),
        );
        let mut statuses = [first.status, second.status];
        statuses.sort();
        assert_eq!(statuses, [StatusCode::OK, StatusCode::PRECONDITION_FAILED], "round {round}");
        let winner = if first.status == StatusCode::OK { &first } else { &second };
        let stored = a.operator(Method::GET, "/v1/rules/contended", None).await;
        assert_eq!(stored.body["burst"], winner.body["burst"], "round {round}: the winner's write stands");
        assert_eq!(stored.body["version"].as_i64(), Some(i64::from(round) + 1));
        tag = etag(&stored);
    }
    // A deletion and a replacement with the same ETag: one of them.
    let (deleted, replaced) = tokio::join!(
        a.operator_if_match(Method::DELETE, "/v1/rules/contended", None, Some(&tag)),
        put(&b, "contended", rule("secret_read_domain", json!({}), 10.0, 20.0), Some(&tag)),
    );
    let mut statuses = [deleted.status, replaced.status];
    statuses.sort();
    assert!(
        statuses == [StatusCode::OK, StatusCode::PRECONDITION_FAILED]
            || statuses == [StatusCode::NO_CONTENT, StatusCode::PRECONDITION_FAILED],
        "{statuses:?}"
    );
    let history = a.operator(Method::GET, "/v1/rules/contended/history", None).await;
    assert_eq!(history.body.as_array().unwrap().len(), 22, "one version per applied change, no more");
    a.stop().await;
    b.stop().await;
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_rollback_writes_a_new_version_equal_to_the_one_named_and_brings_back_a_deleted_rule(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let api = replica(&connect).await;
    let v1 = put(&api, "r", rule("ingest_domain", json!({ "tier": "premium" }), 1000.0, 5000.0), None).await;
    let v2 =
        put(&api, "r", rule("ingest_domain", json!({ "tier": "premium" }), 2000.0, 9000.0), Some("\"1\""))
            .await;
    let mut shadow = rule("ingest_domain", json!({ "tier": "premium" }), 2000.0, 9000.0);
    shadow["mode"] = json!("SHADOW");
    put(&api, "r", shadow, Some("\"2\"")).await;

    let rollback = |version: i64, if_match: Option<&'static str>| {
        api.operator_if_match(
            Method::POST,
            "/v1/rules/r/rollback",
            Some(json!({ "version": version })),
            if_match,
        )
    };
    let rolled = rollback(1, None).await;
    assert_eq!((rolled.status, etag(&rolled)), (StatusCode::OK, "\"4\"".to_owned()));
    let content = |rule: &Value| {
        let mut rule = rule.clone();
        for volatile in ["version", "updated_at"] {
            rule.as_object_mut().unwrap().remove(volatile);
        }
        rule
    };
    assert_eq!(content(&rolled.body), content(&v1.body), "version 4 is version 1 again");
    let history = api.operator(Method::GET, "/v1/rules/r/history", None).await;
    let last = history.body.as_array().unwrap().last().unwrap().clone();
    assert_eq!((last["change"].clone(), last["rolled_back_to"].clone()), (json!("rolled_back"), json!(1)));

    // With If-Match it is conditional like any change.
    assert_eq!(rollback(2, Some("\"3\"")).await.status, StatusCode::PRECONDITION_FAILED);
    let conditional = rollback(2, Some("\"4\"")).await;
    assert_eq!((conditional.status, etag(&conditional)), (StatusCode::OK, "\"5\"".to_owned()));
    assert_eq!(content(&conditional.body), content(&v2.body));

    let unknown = rollback(99, None).await;
    assert_eq!((unknown.status, unknown.code()), (StatusCode::NOT_FOUND, "unknown_rule_version"));
    let nobody = api.operator(Method::POST, "/v1/rules/nobody/rollback", Some(json!({ "version": 1 }))).await;
    assert_eq!((nobody.status, nobody.code()), (StatusCode::NOT_FOUND, "unknown_rule"));

    // Deleted (version 6), then rolled back to version 2: recreated as version 7.
    let deleted = api.operator_if_match(Method::DELETE, "/v1/rules/r", None, Some("\"5\"")).await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
    let to_deletion = rollback(6, None).await;
    assert_eq!(to_deletion.status, StatusCode::BAD_REQUEST, "{to_deletion:?}");
    assert!(to_deletion.body["error"].as_str().unwrap().starts_with("invalid version"), "{to_deletion:?}");
    assert_eq!(
        rollback(2, Some("\"5\"")).await.status,
        StatusCode::PRECONDITION_FAILED,
        "a deleted rule is at no version"
    );
    let recreated = rollback(2, None).await;
    assert_eq!((recreated.status, etag(&recreated)), (StatusCode::CREATED, "\"7\"".to_owned()));
    assert_eq!(content(&recreated.body), content(&v2.body));

    // Issue 20, item 7: every change is in the audit log too, with its actor, the rule and
    // the version it made; refused changes (the 412s, the 404s, the 400) are not.
    let audit = api.operator(Method::GET, "/v1/audit", None).await;
    let changes: Vec<(String, String, String, i64)> = audit
        .body
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .map(|entry| {
            (
                entry["actor"].as_str().unwrap().to_owned(),
                entry["action"].as_str().unwrap().to_owned(),
                entry["rule_id"].as_str().unwrap().to_owned(),
                entry["rule_version"].as_i64().unwrap(),
            )
        })
        .collect();
    let expected: Vec<(String, String, String, i64)> = [
        ("rule.put", 1),
        ("rule.put", 2),
        ("rule.put", 3),
        ("rule.rollback", 4),
        ("rule.rollback", 5),
        ("rule.delete", 6),
        ("rule.rollback", 7),
    ]
    .into_iter()
    .map(|(action, version)| ("operator".to_owned(), action.to_owned(), "r".to_owned(), version))
    .collect();
    assert_eq!(changes, expected);
    api.stop().await;
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn an_invalid_rule_is_a_400_naming_the_field_and_writes_nothing(pool: PgPool) {
    let connect = pool.connect_options().as_ref().clone();
    let api = replica(&connect).await;
    let good = rule("secret_read_node", json!({}), 5.0, 10.0);
    let with = |field: &str, value: Value| {
        let mut body = good.clone();
        body[field] = value;
        body
    };
    let without = |field: &str| {
        let mut body = good.clone();
        body.as_object_mut().unwrap().remove(field);
        body
    };
    let cases = [
        (with("scope", json!("secret_read_cluster")), "invalid scope"),
        (with("scope", json!(5)), "invalid scope"),
        (without("scope"), "invalid scope"),
        (with("selector", json!({ "tier": "gold" })), "invalid selector"),
        (with("selector", json!({ "domain": "acme" })), "invalid selector"),
        (with("selector", json!({ "tenant": "acme" })), "invalid selector"),
        (with("selector", json!({ "tier": "free", "domain": uuid::Uuid::new_v4() })), "invalid selector"),
        (with("selector", json!("everyone")), "invalid selector"),
        (without("selector"), "invalid selector"),
        (with("rate", json!(0)), "invalid rate"),
        (with("rate", json!("fast")), "invalid rate"),
        (with("rate", json!(1e13)), "invalid rate"),
        (with("per_ms", json!(0)), "invalid per_ms"),
        (with("per_ms", json!(1.5)), "invalid per_ms"),
        (with("burst", json!(0.5)), "invalid burst"),
        (with("burst", json!(18_001)), "invalid burst"),
        (without("burst"), "invalid burst"),
        (with("algorithm", json!("GCRA")), "invalid algorithm"),
        (with("mode", json!("enforce")), "invalid mode"),
        (with("fail_mode", json!("LOCAL")), "invalid fail_mode"),
        (with("priority", json!(1_i64 << 40)), "invalid priority"),
        (with("charge", json!("always")), "invalid charge"),
        // Our own budgets charge only what a bucket covers.
        (with("charge", json!("ALWAYS")), "invalid charge"),
        (with("owner", json!("me")), "unknown field \"owner\""),
    ];
    for (body, expected) in cases {
        let answer = put(&api, "r", body.clone(), None).await;
        assert_eq!((answer.status, answer.code()), (StatusCode::BAD_REQUEST, "bad_request"), "{body}");
        let error = answer.body["error"].as_str().unwrap();
        assert!(error.starts_with(expected), "{body}: {error}");
    }
    let bad_id = put(&api, "-r", good.clone(), None).await;
    assert!(bad_id.body["error"].as_str().unwrap().starts_with("invalid rule_id"), "{bad_id:?}");
    for tag in ["W/\"1\"", "1", "\"one\"", "*"] {
        let answer = put(&api, "r", good.clone(), Some(tag)).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{tag}");
        assert!(answer.body["error"].as_str().unwrap().starts_with("invalid If-Match"), "{answer:?}");
    }
    let not_json = api
        .request(
            Method::PUT,
            "/v1/rules/r",
            Some(crate::support::replicas::OPERATOR_TOKEN),
            Some(b"{".to_vec()),
        )
        .await;
    assert_eq!(not_json.status, StatusCode::BAD_REQUEST);
    let anonymous = api.request(Method::PUT, "/v1/rules/r", None, Some(good.to_string().into_bytes())).await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);

    // Nothing was written: no rule, no version, no revision.
    assert_eq!(count(&pool, "SELECT count(*) FROM plexsphere.rules").await, 0);
    assert_eq!(count(&pool, "SELECT count(*) FROM plexsphere.rule_versions").await, 0);
    assert_eq!(count(&pool, "SELECT revision FROM plexsphere.rule_revision").await, 0);
    api.stop().await;
}

/// Every level of the precedence, and ties broken by priority, as the limits route shows what
/// governs each scope, and why.
#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn the_limits_route_shows_which_rule_governs_each_scope_at_every_level_and_why(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let api = replica(&connect).await;
    let acme = api.create_domain("acme", None).await;
    let scope_of = |limits: &Answer, scope: &str| -> Value {
        limits.body["limits"]
            .as_array()
            .unwrap()
            .iter()
            .find(|limit| limit["scope"] == scope)
            .unwrap()
            .clone()
    };
    let limits_path = format!("/v1/domains/{acme}/limits");
    let limits = || api.operator(Method::GET, &limits_path, None);
    let governing =
        |limit: &Value| (limit["governed_by"]["level"].clone(), limit["governed_by"]["rule_id"].clone());

    // No rule yet: the knobs govern a fresh install.
    let fresh = limits().await;
    // Issue 20, item 7: every body this route answers is an object with each key once (a
    // governing rule's level was also flattened in as its own `level`).
    let no_key_twice = || async {
        let text = api.get_text(&limits_path, crate::support::replicas::OPERATOR_TOKEN).await;
        assert_eq!(crate::support::helpers::duplicate_keys(&text), Vec::<String>::new(), "{text}");
    };
    no_key_twice().await;
    assert_eq!(
        (fresh.body["tier"].clone(), fresh.body["rules_revision"].clone()),
        (json!("standard"), json!(0))
    );
    for limit in fresh.body["limits"].as_array().unwrap() {
        assert_eq!(limit["governed_by"], json!({ "level": "knob_default" }), "{limit}");
        assert_eq!((limit["mode"].clone(), limit["fail_mode"].clone()), (json!("ENFORCE"), json!("CLOSED")));
    }
    assert_eq!(scope_of(&fresh, "secret_read_node")["burst"], 20.0);

    let reads = |selector: Value, burst: f64, priority: i64| {
        let mut body = rule("secret_read_node", selector, 10.0, burst);
        body["priority"] = json!(priority);
        body
    };
    for (id, body) in [
        ("all-low", reads(json!({}), 30.0, 0)),
        ("all-high", reads(json!({}), 31.0, 5)),
        ("premium", reads(json!({ "tier": "premium" }), 40.0, 0)),
        ("premium-urgent", reads(json!({ "tier": "premium" }), 41.0, 3)),
        ("acme-b", reads(json!({ "domain": acme }), 50.0, 1)),
        ("acme-a", reads(json!({ "domain": acme }), 51.0, 1)),
    ] {
        assert_eq!(put(&api, id, body, None).await.status, StatusCode::CREATED);
    }

    // The override wins; of two at one priority, the smaller id; the rest are outranked in
    // precedence order.
    let now = limits().await;
    no_key_twice().await;
    let reads_limit = scope_of(&now, "secret_read_node");
    assert_eq!(governing(&reads_limit), (json!("domain"), json!("acme-a")));
    assert_eq!(
        reads_limit["governed_by"],
        json!({ "level": "domain", "rule_id": "acme-a", "priority": 1, "version": 1 })
    );
    assert_eq!(reads_limit["burst"], 51.0);
    let outranked: Vec<&str> = reads_limit["outranked"]
        .as_array()
        .unwrap()
        .iter()
        .map(|rule| rule["rule_id"].as_str().unwrap())
        .collect();
    assert_eq!(outranked, ["acme-b", "all-high", "all-low"], "a standard Domain: no premium template");
    assert_eq!(now.body["rules_revision"], 6);
    // Other scopes are not touched by rules of this one.
    assert_eq!(scope_of(&now, "secret_read_domain")["governed_by"]["level"], "knob_default");

    // Without its overrides, a premium Domain gets the highest premium template...
    for id in ["acme-a", "acme-b"] {
        assert_eq!(
            api.operator_if_match(Method::DELETE, &format!("/v1/rules/{id}"), None, Some("\"1\""))
                .await
                .status,
            StatusCode::NO_CONTENT
        );
    }
    let patched =
        api.operator(Method::PATCH, &format!("/v1/domains/{acme}"), Some(json!({ "tier": "premium" }))).await;
    assert_eq!((patched.status, patched.body["tier"].clone()), (StatusCode::OK, json!("premium")));
    let premium = scope_of(&limits().await, "secret_read_node");
    assert_eq!(governing(&premium), (json!("tier"), json!("premium-urgent")));
    assert_eq!(premium["governed_by"]["priority"], 3);
    // ...a Domain of a tier without a template, the highest all-Domains rule...
    api.operator(Method::PATCH, &format!("/v1/domains/{acme}"), Some(json!({ "tier": "enterprise" }))).await;
    let enterprise = scope_of(&limits().await, "secret_read_node");
    assert_eq!(governing(&enterprise), (json!("all_domains"), json!("all-high")));
    assert_eq!(enterprise["burst"], 31.0);
    // ...and with no rule at all, the knob.
    for id in ["all-low", "all-high"] {
        api.operator_if_match(Method::DELETE, &format!("/v1/rules/{id}"), None, Some("\"1\"")).await;
    }
    let knob = scope_of(&limits().await, "secret_read_node");
    assert_eq!(
        (knob["governed_by"].clone(), knob["burst"].clone()),
        (json!({ "level": "knob_default" }), json!(20.0))
    );

    let unknown =
        api.operator(Method::GET, &format!("/v1/domains/{}/limits", uuid::Uuid::new_v4()), None).await;
    assert_eq!((unknown.status, unknown.code()), (StatusCode::NOT_FOUND, "unknown_domain"));
    api.stop().await;
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_domain_takes_a_tier_and_its_issuance_policy_becomes_its_override_rule(pool: PgPool) {
    let connect = pool.connect_options().as_ref().clone();
    let api = replica(&connect).await;
    let created = api
        .operator(
            Method::POST,
            "/v1/domains",
            Some(
                json!({ "name": "acme", "tier": "premium", "issuance_per_second": 0.5, "issuance_burst": 2 }),
            ),
        )
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
    assert_eq!(
        (
            created.body["tier"].clone(),
            created.body["issuance_per_second"].clone(),
            created.body["issuance_burst"].clone()
        ),
        (json!("premium"), json!(0.5), json!(2.0))
    );
    let domain = created.body["id"].as_str().unwrap().to_owned();

    let override_rule = api.operator(Method::GET, &format!("/v1/rules/domain-{domain}-issuance"), None).await;
    assert_eq!(override_rule.status, StatusCode::OK);
    assert_eq!(override_rule.body["selector"], json!({ "domain": domain }));
    assert_eq!(
        (
            override_rule.body["scope"].clone(),
            override_rule.body["rate"].clone(),
            override_rule.body["per_ms"].clone()
        ),
        (json!("access_issuance_domain"), json!(0.5), json!(1000))
    );
    // It governs at once: two enrolments, then refused for two seconds.
    api.enrol(&domain, "one").await;
    api.enrol(&domain, "two").await;
    let refused = api
        .operator(Method::POST, &format!("/v1/domains/{domain}/nodes"), Some(json!({ "name": "three" })))
        .await;
    assert_eq!(
        (refused.status, refused.code(), refused.retry_after),
        (StatusCode::TOO_MANY_REQUESTS, "issuance_rate_limited", Some(2))
    );

    // Bad input writes nothing: neither a Domain nor a rule.
    let (domains, rules) = (
        count(&pool, "SELECT count(*) FROM plexsphere.domains").await,
        count(&pool, "SELECT count(*) FROM plexsphere.rules").await,
    );
    for (body, expected) in [
        (json!({ "name": "x", "tier": "gold" }), "invalid tier"),
        (json!({ "name": "x", "issuance_per_second": 1, "issuance_burst": 0.5 }), "invalid issuance_burst"),
        (
            json!({ "name": "x", "issuance_per_second": 0, "issuance_burst": 5 }),
            "invalid issuance_per_second",
        ),
        (
            json!({ "name": "x", "issuance_per_second": 1 }),
            "issuance_per_second and issuance_burst go together",
        ),
        (json!({ "name": "" }), "invalid name"),
        (json!({ "name": "x", "owner": "me" }), "malformed JSON body: unknown field `owner`"),
    ] {
        let answer = api.operator(Method::POST, "/v1/domains", Some(body.clone())).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{body}");
        assert!(answer.body["error"].as_str().unwrap().starts_with(expected), "{body}: {answer:?}");
    }
    assert_eq!(count(&pool, "SELECT count(*) FROM plexsphere.domains").await, domains);
    assert_eq!(count(&pool, "SELECT count(*) FROM plexsphere.rules").await, rules);

    let api_ref: &Api = &api;
    let tier = |id: &str, body: Value| {
        let path = format!("/v1/domains/{id}");
        async move { api_ref.operator(Method::PATCH, &path, Some(body)).await }
    };
    let moved = tier(&domain, json!({ "tier": "free" })).await;
    assert_eq!(
        (moved.status, moved.body["tier"].clone(), moved.body["name"].clone()),
        (StatusCode::OK, json!("free"), json!("acme"))
    );
    assert_eq!(tier(&domain, json!({ "tier": "gold" })).await.status, StatusCode::BAD_REQUEST);
    assert_eq!(tier(&domain, json!({})).await.status, StatusCode::BAD_REQUEST);
    let unknown = tier(&uuid::Uuid::new_v4().to_string(), json!({ "tier": "free" })).await;
    assert_eq!((unknown.status, unknown.code()), (StatusCode::NOT_FOUND, "unknown_domain"));
    api.stop().await;
}

/// Issue 34, item 4: another service's rule may charge its costs always; `charge` is written,
/// shown, kept in the history and rolled back like every other field.
#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_services_rule_charges_always_through_every_version(pool: PgPool) {
    let connect = pool.connect_options().as_ref().clone();
    let api = replica(&connect).await;
    let tokens = |charge: Option<&str>| {
        let mut body = json!({
            "service": "llm", "selector": { "tenant": "*" }, "rate": 1000.0, "per_ms": 60_000, "burst": 1000.0,
        });
        if let Some(charge) = charge {
            body["charge"] = json!(charge);
        }
        body
    };
    let created = put(&api, "llm-tokens", tokens(Some("ALWAYS")), None).await;
    assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
    assert_eq!(created.body["charge"], "ALWAYS");
    assert_eq!(api.operator(Method::GET, "/v1/rules/llm-tokens", None).await.body["charge"], "ALWAYS");
    let stored: String =
        sqlx::query_scalar("SELECT charge FROM plexsphere.rules").fetch_one(&pool).await.unwrap();
    assert_eq!(stored, "ALWAYS");
    // Left out, it is the default.
    let replaced = put(&api, "llm-tokens", tokens(None), Some("\"1\"")).await;
    assert_eq!((replaced.status, &replaced.body["charge"]), (StatusCode::OK, &json!("WHEN_COVERED")));
    let history = api.operator(Method::GET, "/v1/rules/llm-tokens/history", None).await;
    let charges: Vec<&Value> =
        history.body.as_array().unwrap().iter().map(|version| &version["charge"]).collect();
    assert_eq!(charges, [&json!("ALWAYS"), &json!("WHEN_COVERED")]);
    let rolled_back =
        api.operator(Method::POST, "/v1/rules/llm-tokens/rollback", Some(json!({ "version": 1 }))).await;
    assert_eq!((rolled_back.status, &rolled_back.body["charge"]), (StatusCode::OK, &json!("ALWAYS")));
    // And after a deletion, a rollback recreates it charging always.
    let deleted = api.operator_if_match(Method::DELETE, "/v1/rules/llm-tokens", None, Some("\"3\"")).await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT, "{deleted:?}");
    let recreated =
        api.operator(Method::POST, "/v1/rules/llm-tokens/rollback", Some(json!({ "version": 1 }))).await;
    assert_eq!((recreated.status, &recreated.body["charge"]), (StatusCode::CREATED, &json!("ALWAYS")));
    let listed = api.operator(Method::GET, "/v1/rules?service=llm", None).await;
    assert_eq!(listed.body[0]["charge"], "ALWAYS");
    // The table refuses ALWAYS for our own budgets too, whoever writes it.
    put(&api, "own", rule("secret_read_node", json!({}), 5.0, 10.0), None).await;
    let refused = sqlx::query("UPDATE plexsphere.rules SET charge = 'ALWAYS' WHERE rule_id = 'own'")
        .execute(&pool)
        .await
        .unwrap_err();
    assert_eq!(refused.as_database_error().and_then(|error| error.constraint()), Some("rules_charge_check"));
    api.stop().await;
}
