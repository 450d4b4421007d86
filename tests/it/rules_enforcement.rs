//! Rules deciding requests: a rule written through one replica governs another's decisions
//! within a second; a SHADOW rule admits everything yet counts and logs what it would refuse;
//! each fail mode with the store cut off; usage rows that count exactly the decisions made;
//! a GCRA rule; and a change that may grow a budget makes the pre-check forget its buckets.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ratebudget::ManualClock;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool};

use crate::support::helpers::instant;
use crate::support::logs::Logs;
use crate::support::replicas::{config, eventually, Answer, Api, Replica};

/// Usage flushed every 100 ms, so a test waits for it in tenths of a second.
const FAST_FLUSH: (&str, &str) = ("PLEXSPHERE_RULE_USAGE_FLUSH_INTERVAL_MS", "100");

fn rule(scope: &str, domain: &str, rate: f64, burst: f64) -> Value {
    json!({ "scope": scope, "selector": { "domain": domain }, "rate": rate, "burst": burst })
}

async fn put(api: &Api, id: &str, body: Value, if_match: Option<&str>) -> Answer {
    let answer = api.operator_if_match(Method::PUT, &format!("/v1/rules/{id}"), Some(body), if_match).await;
    assert!(answer.status.is_success(), "{answer:?}");
    answer
}

/// A Domain with one Node and one secret; the Node's token.
async fn reader(api: &Api) -> (String, String, String) {
    // Domain names are unique: each reader gets a Domain of its own.
    let domain = api.create_domain(&format!("d-{}", uuid::Uuid::new_v4().simple()), None).await;
    let (node, token) = api.enrol(&domain, "n").await;
    api.put_secret(&domain, "key", "value").await;
    (domain, node, token)
}

async fn read(api: &Api, token: &str) -> Answer {
    api.get("/v1/secrets/key", Some(token)).await
}

/// A counter's value on `api`, 0 when it was never counted.
async fn counter(api: &Api, series: &str) -> f64 {
    api.metric(series).await.unwrap_or(0.0)
}

fn decisions(scope: &str, outcome: &str) -> String {
    format!("plexsphere_rate_budget_decisions_total{{scope=\"{scope}\",outcome=\"{outcome}\"}}")
}

/// A rule's usage, summed over its minutes: (granted, refused, shadow_refused).
async fn usage(api: &Api, rule: &str) -> (u64, u64, u64) {
    let since = "2000-01-01T00:00:00Z";
    let answer = api.operator(Method::GET, &format!("/v1/rules/{rule}/usage?since={since}"), None).await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    answer.body.as_array().unwrap().iter().fold((0, 0, 0), |(g, r, s), minute| {
        (
            g + minute["granted"].as_u64().unwrap(),
            r + minute["refused"].as_u64().unwrap(),
            s + minute["shadow_refused"].as_u64().unwrap(),
        )
    })
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_rule_written_through_one_replica_changes_another_replicas_decisions_within_a_second(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    // The knob admits a thousand reads back to back, and the clock stands still: before the
    // rule, two reads in a row are both admitted; under it (a burst of one), never.
    let clock = Arc::new(ManualClock::new(instant()));
    let knobs = [("PLEXSPHERE_SECRET_READ_NODE_BURST", "1000")];
    let a = Replica::start(config(&connect, &knobs), clock.clone()).await;
    let b = Replica::start(config(&connect, &knobs), clock.clone()).await;
    let (domain, _, token) = reader(&a).await;
    for _ in 0..2 {
        assert_eq!(read(&b, &token).await.status, StatusCode::OK);
    }

    put(&a, "tight", rule("secret_read_node", &domain, 1.0, 1.0), None).await;
    let written = Instant::now();
    let deadline = written + Duration::from_secs(1);
    loop {
        let (first, second) = (read(&b, &token).await, read(&b, &token).await);
        if second.status == StatusCode::TOO_MANY_REQUESTS {
            assert_eq!(second.code(), "node_secret_read_rate_limited");
            break;
        }
        assert_eq!((first.status, second.status), (StatusCode::OK, StatusCode::OK));
        assert!(Instant::now() < deadline, "B still decided by the knob a second after the rule was written");
    }
    eprintln!("B decided by the rule {:?} after it was written", written.elapsed());
    assert_eq!(
        b.metric("plexsphere_rules_snapshot_version").await,
        a.metric("plexsphere_rules_snapshot_version").await
    );
    assert_eq!(b.metric("plexsphere_rules_snapshot_version").await, Some(1.0));
    let age = b.metric("plexsphere_rules_snapshot_age_seconds").await.unwrap();
    assert!((0.0..5.0).contains(&age), "{age}");
    a.stop().await;
    b.stop().await;
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_shadow_rule_admits_every_request_yet_counts_and_logs_what_it_would_refuse(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let logs = Logs::capture();
    let clock = Arc::new(ManualClock::new(instant()));
    let api = Replica::start(config(&connect, &[FAST_FLUSH]), clock.clone()).await;
    let (domain, node, token) = reader(&api).await;
    let mut shadow = rule("secret_read_node", &domain, 1.0, 2.0);
    shadow["mode"] = json!("SHADOW");
    let written = put(&api, "trial", shadow.clone(), None).await;

    for _ in 0..5 {
        let answer = read(&api, &token).await;
        assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
        // The shadow budget binds nobody: the fields report the Domain's.
        assert!(answer.header("ratelimit").unwrap().starts_with("\"secret_read_domain\""), "{answer:?}");
    }
    assert_eq!(counter(&api, &decisions("secret_read_node", "granted")).await, 2.0);
    assert_eq!(counter(&api, &decisions("secret_read_node", "shadow_refused")).await, 3.0);
    assert_eq!(counter(&api, &decisions("secret_read_node", "refused")).await, 0.0);
    // The Domain's budget, enforced, was spent by every admitted read.
    assert_eq!(counter(&api, &decisions("secret_read_domain", "granted")).await, 5.0);
    // The shadow bucket evolved as enforcement would have left it: empty after two.
    let buckets = api.operator(Method::GET, &format!("/v1/budgets/{node}"), None).await;
    let node_bucket =
        buckets.body.as_array().unwrap().iter().find(|b| b["scope"] == "secret_read_node").unwrap().clone();
    assert_eq!(node_bucket["tokens"], 0.0);

    eventually(Duration::from_secs(5), "the usage rows count the shadow refusals", || async {
        usage(&api, "trial").await == (2, 0, 3)
    })
    .await;
    let logged = logs.lines_with("a shadow rule would have refused this request");
    assert!(
        logged.iter().any(|line| line.contains("rule_id=\"trial\"") || line.contains("rule_id=trial")),
        "{logged:?}"
    );

    // Enforced, the same rule refuses.
    shadow["mode"] = json!("ENFORCE");
    put(&api, "trial", shadow, Some(written.header("etag").unwrap())).await;
    let refused = read(&api, &token).await;
    assert_eq!(
        (refused.status, refused.code()),
        (StatusCode::TOO_MANY_REQUESTS, "node_secret_read_rate_limited")
    );
    api.stop().await;
}

/// The store cut off (another session holds `plexsphere.rate_budgets`): each Domain's reads
/// fail by their rules' fail mode.
#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn with_the_store_cut_off_each_rule_fails_by_its_own_mode(_: PgPoolOptions, connect: PgConnectOptions) {
    let clock = Arc::new(ManualClock::new(instant()));
    let api = Replica::start(config(&connect, &[("PLEXSPHERE_DECISION_TIMEOUT_MS", "250")]), clock).await;
    let mut tokens = Vec::new();
    for fail_mode in ["CLOSED", "OPEN", "STATIC"] {
        let (domain, _, token) = reader(&api).await;
        // A read spends both budgets, and fails by the stricter mode: both get the rule's.
        for scope in ["secret_read_node", "secret_read_domain"] {
            let mut body = rule(scope, &domain, 1.0, 2.0);
            body["fail_mode"] = json!(fail_mode);
            put(&api, &format!("{fail_mode}-{scope}"), body, None).await;
        }
        tokens.push(token);
    }
    let (closed, open, local) = (&tokens[0], &tokens[1], &tokens[2]);

    let mut locker = PgConnection::connect_with(&connect).await.unwrap();
    sqlx::query("BEGIN").execute(&mut locker).await.unwrap();
    sqlx::query("LOCK TABLE plexsphere.rate_budgets IN ACCESS EXCLUSIVE MODE")
        .execute(&mut locker)
        .await
        .unwrap();

    // CLOSED: 500, never 429.
    for _ in 0..3 {
        let answer = read(&api, closed).await;
        assert_eq!((answer.status, answer.code()), (StatusCode::INTERNAL_SERVER_ERROR, "internal"));
    }
    // OPEN: admitted, past any burst, at once once the circuit is open.
    for _ in 0..5 {
        let started = Instant::now();
        assert_eq!(read(&api, open).await.status, StatusCode::OK);
        assert!(started.elapsed() < Duration::from_millis(750), "{:?}", started.elapsed());
    }
    // STATIC: this replica's bucket of the same budget decides: two, then refused.
    let statuses =
        [read(&api, local).await.status, read(&api, local).await.status, read(&api, local).await.status];
    assert_eq!(statuses, [StatusCode::OK, StatusCode::OK, StatusCode::TOO_MANY_REQUESTS]);

    assert!(counter(&api, &decisions("secret_read_node", "error")).await >= 3.0);
    assert_eq!(counter(&api, &decisions("secret_read_node", "open_granted")).await, 5.0);
    assert_eq!(counter(&api, &decisions("secret_read_node", "fallback_granted")).await, 2.0);
    assert_eq!(counter(&api, &decisions("secret_read_node", "fallback_refused")).await, 1.0);
    assert_eq!(
        api.metric("plexsphere_rate_budget_fallback_active{scope=\"secret_read_node\"}").await,
        Some(1.0)
    );

    sqlx::query("COMMIT").execute(&mut locker).await.unwrap();
    // Decided again (a 429 too: the statements the 500s left behind ran when the lock went,
    // and their debits stand, as docs/adr/0005 says).
    eventually(Duration::from_secs(5), "the closed rule decides again", || async {
        read(&api, closed).await.status != StatusCode::INTERNAL_SERVER_ERROR
    })
    .await;
    api.stop().await;
}

/// Reads through two replicas, refused and granted: the usage rows hold exactly the decisions
/// the replicas counted, per minute.
#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn usage_rows_count_exactly_the_decisions_made(pool: PgPool) {
    let connect = pool.connect_options().as_ref().clone();
    let clock = Arc::new(ManualClock::new(instant()));
    let a = Replica::start(config(&connect, &[FAST_FLUSH]), clock.clone()).await;
    let b = Replica::start(config(&connect, &[FAST_FLUSH]), clock.clone()).await;
    let (domain, _, token) = reader(&a).await;
    put(&a, "metered", rule("secret_read_node", &domain, 1.0, 5.0), None).await;
    eventually(Duration::from_secs(2), "B has the rule", || async {
        b.metric("plexsphere_rules_snapshot_version").await == Some(1.0)
    })
    .await;

    let mut made = (0, 0);
    for minute in 0..2 {
        for i in 0..12 {
            let replica = if i % 2 == 0 { &a } else { &b };
            match read(replica, &token).await.status {
                StatusCode::OK => made.0 += 1,
                StatusCode::TOO_MANY_REQUESTS => made.1 += 1,
                other => panic!("{other}"),
            }
        }
        if minute == 0 {
            clock.advance(chrono::Duration::seconds(60));
        }
    }
    // Five, then the minute refills five more (at 1 a second, capped at the burst).
    assert_eq!(made, (10, 14));
    let (on_a, on_b) = (counted(&a).await, counted(&b).await);
    assert_eq!((on_a.0 + on_b.0, on_a.1 + on_b.1), (10.0, 14.0), "the metrics saw every decision");
    eventually(Duration::from_secs(5), "the usage rows hold every decision", || async {
        usage(&a, "metered").await == (10, 14, 0)
    })
    .await;
    let minutes: Vec<(chrono::DateTime<chrono::Utc>, i64, i64)> = sqlx::query_as(
        "SELECT minute, granted, refused FROM plexsphere.rule_usage WHERE rule_id = 'metered' ORDER BY minute",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(minutes, [(instant(), 5, 7), (instant() + chrono::Duration::seconds(60), 5, 7)]);
    let unknown = a.operator(Method::GET, "/v1/rules/never/usage", None).await;
    assert_eq!((unknown.status, unknown.code()), (StatusCode::NOT_FOUND, "unknown_rule"));
    a.stop().await;
    b.stop().await;
}

/// The node-read decisions `api` counted: (granted, refused by the store or the pre-check).
async fn counted(api: &Api) -> (f64, f64) {
    let granted = counter(api, &decisions("secret_read_node", "granted")).await;
    let refused = counter(api, &decisions("secret_read_node", "refused")).await
        + counter(api, &decisions("secret_read_node", "precheck_refused")).await;
    (granted, refused)
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_gcra_rule_governs_issuance_from_the_named_limiter(pool: PgPool) {
    let connect = pool.connect_options().as_ref().clone();
    let api = Replica::start(config(&connect, &[]), Arc::new(ManualClock::new(instant()))).await;
    let domain = api.create_domain("d", None).await;
    let mut gcra = rule("access_issuance_domain", &domain, 1.0, 2.0);
    gcra["algorithm"] = json!("GCRA");
    put(&api, "gcra-issuance", gcra, None).await;

    let nodes = format!("/v1/domains/{domain}/nodes");
    let enrol = || api.operator(Method::POST, &nodes, Some(json!({ "name": "n" })));
    let first = enrol().await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(first.header("ratelimit-policy"), Some("\"access_issuance_domain\";q=2;w=2"));
    assert_eq!(enrol().await.status, StatusCode::CREATED);
    let refused = enrol().await;
    assert_eq!(
        (refused.status, refused.code(), refused.retry_after),
        (StatusCode::TOO_MANY_REQUESTS, "issuance_rate_limited", Some(1))
    );
    let keys: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM plexsphere.named_limits WHERE limiter = 'access_issuance_domain'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(keys, 1, "decided by the named limiter, not the token bucket");
    let buckets: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM plexsphere.rate_budgets WHERE scope = 'access_issuance_domain'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(buckets, 0);
    // A reset forgets the key, whichever algorithm governs: enrolment is admitted again.
    let reset =
        api.operator(Method::DELETE, &format!("/v1/budgets/access_issuance_domain/{domain}"), None).await;
    assert_eq!(reset.body, json!({ "existed": true }));
    assert_eq!(enrol().await.status, StatusCode::CREATED);
    api.stop().await;
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_change_that_may_grow_a_budget_makes_the_precheck_forget_the_buckets_it_governs(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let api = Replica::start(config(&connect, &[]), Arc::new(ManualClock::new(instant()))).await;
    let (domain, _, token) = reader(&api).await;
    let written = put(&api, "reads", rule("secret_read_domain", &domain, 10.0, 20.0), None).await;
    read(&api, &token).await;
    let remembered = || async { api.metric("plexsphere_rate_budget_precheck_buckets").await.unwrap() };
    assert_eq!(remembered().await, 3.0, "the Domain's issuance bucket, the Node's reads, the Domain's reads");

    // Smaller: what the pre-check knows stays true.
    let smaller = put(
        &api,
        "reads",
        rule("secret_read_domain", &domain, 10.0, 10.0),
        Some(written.header("etag").unwrap()),
    )
    .await;
    assert_eq!(remembered().await, 3.0);
    // Larger: the Domain's read bucket is forgotten; the other scopes' are kept.
    put(
        &api,
        "reads",
        rule("secret_read_domain", &domain, 10.0, 40.0),
        Some(smaller.header("etag").unwrap()),
    )
    .await;
    assert_eq!(remembered().await, 2.0);
    api.stop().await;
}

/// An issuance limiter the rules follower never calls: it only reads the Domains' tiers.
struct NoIssuance;

#[async_trait::async_trait]
impl access::Limiter for NoIssuance {
    async fn spend_issuance(&self, _: access::DomainId) -> Result<(), access::IssuanceLimitError> {
        unreachable!("the rules follower issues nothing")
    }
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn the_rules_follower_stops_at_shutdown_after_the_listener_has_gone(
    pool_options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    // At shutdown the listener ends first and drops its followers; the rules follower then
    // hears its channel close. It used to wait for ever inside that arm, no longer watching
    // for shutdown, and a replica's stop hung whenever the close was seen first.
    let pool = pool_options.connect_with(connect.clone()).await.unwrap();
    let guard = Arc::new(ratebudget::Guard::builder(ratebudget::Store::new(pool.clone())).build());
    let budgets = Arc::new(service::RuleBudgets::new(
        config(&connect, &[]).budgets.defaults,
        guard,
        rules::RuleRefs::default(),
    ));
    let sources = service::Sources {
        rules: rules::RulesService::new(Arc::new(rules::PgRulesRepository::new(pool.clone()))),
        access: access::AccessService::new(
            Arc::new(access::PgAccessRepository::new(pool.clone())),
            Arc::new(NoIssuance),
        ),
    };
    let (followers, hearing) = app::runtime::followers::rules_and_tiers();
    drop(followers);
    let shutdown = tokio_util::sync::CancellationToken::new();
    let follower =
        tokio::spawn(service::follow(budgets, sources, hearing, Duration::from_secs(3600), shutdown.clone()));
    // The test runs on one thread: each yield lets the follower run until it waits again, so
    // it has seen the channel close before shutdown is signalled.
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert!(!follower.is_finished());
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(5), follower)
        .await
        .expect("the rules follower ends at shutdown")
        .unwrap();
}
