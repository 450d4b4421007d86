//! Envoy's Rate Limit Quota Service (issue 35), end to end: simulated Envoys
//! (`tests/grpc/rlqs_envoys.py`, each doing what Envoy's `rate_limit_quota` filter does with
//! its assignments: its own token buckets, one token a request, reports every interval and at
//! a bucket's first request) on two replicas, against a saturating load. All of them together
//! never admit more than the rule's `burst + rate × window` in any window; each converges to
//! its max-min fair share; a lowered rule binds once what the old assignments could still
//! admit is spent; a killed stream's share is freed only after its TTL; a replica that stops
//! sends TTL 0.

use std::collections::BTreeMap;
use std::sync::Arc;

use ratebudget::SystemClock;
use reqwest::Method;
use serde_json::{json, Value};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::support::grpc;
use crate::support::replicas::{config, eventually, Replica, OPERATOR_TOKEN};

const TOKEN: &str = "envoy-rlqs-token-0123456789";
/// Envoy reports every 5 s; the simulated ones every 2 s, so a test of three intervals is short.
const INTERVAL_S: f64 = 2.0;
const TTL_S: &str = "6";

async fn replica(connect: &PgConnectOptions) -> Replica {
    let token = format!("envoy:{TOKEN}:shop");
    let knobs = [
        ("PLEXSPHERE_DECIDE_TOKENS", token.as_str()),
        ("PLEXSPHERE_GRPC_LISTEN", "127.0.0.1:0"),
        ("PLEXSPHERE_RLQS_TTL_SECONDS", TTL_S),
        ("PLEXSPHERE_RLQS_MAX_ROUND_TRIP_MS", "200"),
    ];
    Replica::start(config(connect, &knobs), Arc::new(SystemClock)).await
}

/// `shop`'s rule for its `checkout` API, a bucket per tenant: `rate` a second, `burst`.
fn checkout_rule(rate: f64, burst: f64) -> Value {
    json!({ "service": "shop", "api": "checkout", "selector": { "tenant": "*" }, "rate": rate, "burst": burst })
}

async fn put_rule(replica: &Replica, rate: f64, burst: f64) -> String {
    let answer =
        replica.operator(Method::PUT, "/v1/rules/shop-checkout", Some(checkout_rule(rate, burst))).await;
    assert!(answer.status.is_success(), "{answer:?}");
    answer.header("etag").expect("a written rule has an ETag").to_owned()
}

/// A simulated Envoy on `replica` with one bucket (`checkout` for `acme`) under `load` rps.
fn envoy(name: &str, replica: &Replica, load: f64, extra: Value) -> Value {
    let mut envoy = json!({
        "name": name,
        "target": replica.grpc.unwrap().to_string(),
        "token": TOKEN,
        "domain": "shop",
        "report_interval_s": INTERVAL_S,
        "no_assignment": "DENY_ALL",
        "buckets": [{ "bucket_id": { "api": "checkout", "tenant": "acme" }, "load_rps": load }],
    });
    if let Value::Object(extra) = extra {
        envoy.as_object_mut().unwrap().extend(extra);
    }
    envoy
}

/// Admissions of every Envoy, by tick (ms from the start).
fn admissions(done: &Value) -> BTreeMap<i64, i64> {
    let mut by_tick = BTreeMap::new();
    for envoy in done["envoys"].as_array().unwrap() {
        for row in envoy["admitted"].as_array().unwrap() {
            *by_tick.entry(row[0].as_i64().unwrap()).or_default() += row[2].as_i64().unwrap();
        }
    }
    by_tick
}

/// The window (from, to, admitted, bound) starting at or after `from_ms` that admits the most
/// over `burst + rate × window + slack`, if any does.
fn over_bound(
    by_tick: &BTreeMap<i64, i64>,
    from_ms: i64,
    rate: f64,
    burst: f64,
    slack: f64,
) -> Option<(i64, i64, i64, f64)> {
    let ticks: Vec<(i64, i64)> = by_tick.range(from_ms..).map(|(t, n)| (*t, *n)).collect();
    let mut worst: Option<(i64, i64, i64, f64)> = None;
    for start in 0..ticks.len() {
        let mut admitted = 0;
        for end in start..ticks.len() {
            admitted += ticks[end].1;
            let window = (ticks[end].0 - ticks[start].0) as f64 / 1000.0;
            let bound = burst + rate * window + slack;
            let excess = admitted as f64 - bound;
            if excess > 0.0 && worst.is_none_or(|(_, _, a, b)| excess > a as f64 - b) {
                worst = Some((ticks[start].0, ticks[end].0, admitted, bound));
            }
        }
    }
    worst
}

/// What the Envoy named `name` admitted a second over [from_ms, to_ms).
fn admitted_rate(done: &Value, name: &str, from_ms: i64, to_ms: i64) -> f64 {
    let envoy = done["envoys"].as_array().unwrap().iter().find(|envoy| envoy["name"] == name).unwrap();
    let admitted: i64 = envoy["admitted"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|row| (from_ms..to_ms).contains(&row[0].as_i64().unwrap()))
        .map(|row| row[2].as_i64().unwrap())
        .sum();
    admitted as f64 * 1000.0 / (to_ms - from_ms) as f64
}

fn assignments<'a>(done: &'a Value, name: &str) -> Vec<&'a Value> {
    let envoy = done["envoys"].as_array().unwrap().iter().find(|envoy| envoy["name"] == name).unwrap();
    envoy["assignments"].as_array().unwrap().iter().collect()
}

/// Tokens a second a token-bucket assignment allows (Envoy's arithmetic: a whole-second interval).
fn rate_of(assignment: &Value) -> f64 {
    assert_eq!(assignment["kind"], "token_bucket", "{assignment}");
    assignment["tokens_per_fill"].as_f64().unwrap() / assignment["fill_interval_s"].as_f64().unwrap()
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn envoys_on_two_replicas_never_admit_over_the_rule_and_converge_to_max_min_fair_shares(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let (a, b) = (replica(&connect).await, replica(&connect).await);
    put_rule(&a, 300.0, 60.0).await;
    eventually(std::time::Duration::from_secs(5), "the rule reaches the other replica", || async {
        b.metric("plexsphere_rules_snapshot_version").await.is_some_and(|version| version >= 1.0)
    })
    .await;
    // Two saturating Envoys and one asking for 50 a second: max-min fair shares of the 300
    // are 50 for it and 125 for each of the others.
    let done = grpc::envoys(json!({
        "duration_s": 14, "tick_ms": 10,
        "envoys": [envoy("e1", &a, 600.0, json!({})), envoy("e2", &b, 600.0, json!({})), envoy("e3", &a, 50.0, json!({}))],
    }))
    .await;
    let by_tick = admissions(&done);
    assert_eq!(over_bound(&by_tick, 0, 300.0, 60.0, 0.0), None, "a window over burst + rate x window");
    // After three intervals, each within 10% of its share.
    let (from, to) = ((3.0 * INTERVAL_S * 1000.0) as i64 + 1000, 14_000);
    for (name, fair) in [("e1", 125.0), ("e2", 125.0), ("e3", 50.0)] {
        let rate = admitted_rate(&done, name, from, to);
        assert!((rate - fair).abs() <= fair * 0.1, "{name} admitted {rate:.1}/s, its fair share is {fair}");
    }
    a.stop().await;
    b.stop().await;
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_lowered_rule_binds_once_what_the_old_assignments_could_still_admit_is_spent(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let (a, b) = (replica(&connect).await, replica(&connect).await);
    let etag = put_rule(&a, 300.0, 60.0).await;
    let lowered_at_s = 8.0;
    let done = grpc::envoys(json!({
        "duration_s": 16, "tick_ms": 10,
        "envoys": [envoy("e1", &a, 400.0, json!({})), envoy("e2", &b, 400.0, json!({}))],
        "http": [{
            "at_s": lowered_at_s, "method": "PUT", "url": format!("{}/v1/rules/shop-checkout", a.base()),
            "headers": { "authorization": format!("Bearer {OPERATOR_TOKEN}"), "if-match": etag },
            "body": checkout_rule(40.0, 10.0),
        }],
    }))
    .await;
    let change = &done["http"][0];
    assert_eq!(change["status"], 200, "{change}");
    let changed_ms = change["done_ms"].as_i64().unwrap();
    // Every stream is sent a new assignment within a second of the change; until then (and
    // until each Envoy has it) its old assignment could still admit its burst and its rate.
    let mut old_could_admit = 0.0;
    for name in ["e1", "e2"] {
        let sent = assignments(&done, name);
        let old = sent
            .iter()
            .rev()
            .find(|a| a["t_ms"].as_i64().unwrap() <= changed_ms)
            .expect("an assignment before");
        let new =
            sent.iter().find(|a| a["t_ms"].as_i64().unwrap() > changed_ms).expect("an assignment after");
        let arrived = new["t_ms"].as_i64().unwrap();
        assert!(
            arrived - changed_ms <= 1000,
            "{name}'s new assignment arrived {} ms after the change",
            arrived - changed_ms
        );
        if old["kind"] == "token_bucket" {
            old_could_admit +=
                old["max_tokens"].as_f64().unwrap() + rate_of(old) * (arrived - changed_ms) as f64 / 1000.0;
        }
    }
    let by_tick = admissions(&done);
    assert_eq!(over_bound(&by_tick, 0, 300.0, 60.0, 0.0), None, "over the first rule's bound");
    assert_eq!(
        over_bound(&by_tick, changed_ms, 40.0, 10.0, old_could_admit),
        None,
        "over the new rule's bound plus what the old assignments could still admit ({old_could_admit:.1})"
    );
    // And the new rule is what they admit at, once it settled.
    let settled = admitted_rate(&done, "e1", 12_000, 16_000) + admitted_rate(&done, "e2", 12_000, 16_000);
    // (Over these 4 s the bound is 10 + 40 x 4: the burst is a few more a second.)
    assert!((30.0..=42.5).contains(&settled), "admitted {settled:.1}/s under a rule of 40 and a burst of 10");
    a.stop().await;
    b.stop().await;
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_killed_streams_share_is_freed_only_after_its_ttl(_: PgPoolOptions, connect: PgConnectOptions) {
    let (a, b) = (replica(&connect).await, replica(&connect).await);
    put_rule(&a, 200.0, 40.0).await;
    let killed_at_s = 7.0;
    let done = grpc::envoys(json!({
        "duration_s": 20, "tick_ms": 10,
        "envoys": [envoy("e1", &a, 400.0, json!({ "kill_at_s": killed_at_s })), envoy("e2", &b, 400.0, json!({}))],
    }))
    .await;
    let e1 = done["envoys"].as_array().unwrap().iter().find(|envoy| envoy["name"] == "e1").unwrap();
    let killed_ms = e1["killed_ms"].as_i64().unwrap();
    let last = assignments(&done, "e1")
        .into_iter()
        .rev()
        .find(|a| a["t_ms"].as_i64().unwrap() <= killed_ms)
        .cloned()
        .unwrap();
    let half = 200.0 * 0.995 / 2.0;
    assert!((rate_of(&last) - half).abs() <= half * 0.1, "e1 held half before it died: {last}");
    // What e1 was last sent could be used until its TTL lapsed: until then e2 is granted no
    // more than the other half.
    let usable_until = last["t_ms"].as_i64().unwrap() + TTL_S.parse::<i64>().unwrap() * 1000;
    for sent in assignments(&done, "e2") {
        let at = sent["t_ms"].as_i64().unwrap();
        if sent["kind"] == "token_bucket" && at > killed_ms && at < usable_until - 250 {
            assert!(
                rate_of(sent) <= half + 1.0,
                "e2 was granted {} a second at {at} ms, before e1's share lapsed at {usable_until} ms",
                rate_of(sent)
            );
        }
    }
    // Once it lapsed, e2 gets the whole within two intervals.
    let whole_by = usable_until + (2.0 * INTERVAL_S * 1000.0) as i64 + 500;
    let grown = assignments(&done, "e2")
        .into_iter()
        .find(|sent| sent["kind"] == "token_bucket" && rate_of(sent) > 190.0)
        .map(|sent| sent["t_ms"].as_i64().unwrap());
    assert!(
        grown.is_some_and(|at| at >= usable_until - 250 && at <= whole_by),
        "e2 got the whole at {grown:?}, e1's share lapsed at {usable_until}"
    );
    assert_eq!(over_bound(&admissions(&done), 0, 200.0, 40.0, 0.0), None);
    a.stop().await;
    b.stop().await;
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_stopping_replica_sends_every_bucket_a_ttl_of_zero(_: PgPoolOptions, connect: PgConnectOptions) {
    let a = replica(&connect).await;
    put_rule(&a, 100.0, 20.0).await;
    let api = (*a).clone();
    let run = tokio::spawn(grpc::envoys(json!({
        "duration_s": 8, "tick_ms": 10,
        "envoys": [envoy("e1", &a, 200.0, json!({}))],
    })));
    eventually(std::time::Duration::from_secs(6), "the Envoy holds a token bucket", || async {
        api.metric("plexsphere_rlqs_buckets_assigned").await.is_some_and(|held| held >= 1.0)
    })
    .await;
    a.stop().await;
    let done = run.await.unwrap();
    let sent = assignments(&done, "e1");
    let goodbye = sent.last().unwrap();
    assert_eq!(goodbye["kind"], "token_bucket", "a TTL of 0 with its strategy: {goodbye}");
    assert_eq!(goodbye["ttl_s"], 0, "{goodbye}");
    assert_eq!(goodbye["kept"], true, "the same bucket, expiring at once: {goodbye}");
    let e1 = &done["envoys"][0];
    let stream = &e1["streams"][0];
    assert_eq!(stream["status"], "OK", "the stream ends after the goodbye: {stream}");
    let expired = e1["expiries"]
        .as_array()
        .unwrap()
        .iter()
        .any(|expiry| (expiry[0].as_i64().unwrap() - goodbye["t_ms"].as_i64().unwrap()).abs() <= 20);
    assert!(expired, "the Envoy falls back at once: {}", e1["expiries"]);
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_stream_needs_a_token_naming_its_domain(_: PgPoolOptions, connect: PgConnectOptions) {
    let a = replica(&connect).await;
    let wrong_token = envoy("anonymous", &a, 10.0, json!({ "token": "not-a-token-of-anyone" }));
    let mut other_service = envoy("elsewhere", &a, 10.0, json!({}));
    other_service["domain"] = json!("billing");
    let done =
        grpc::envoys(json!({ "duration_s": 3, "tick_ms": 10, "envoys": [wrong_token, other_service] })).await;
    assert_eq!(
        done["envoys"][0]["streams"][0]["status"], "UNAUTHENTICATED",
        "{}",
        done["envoys"][0]["streams"]
    );
    assert_eq!(
        done["envoys"][1]["streams"][0]["status"], "PERMISSION_DENIED",
        "{}",
        done["envoys"][1]["streams"]
    );
    assert!(done["envoys"]
        .as_array()
        .unwrap()
        .iter()
        .all(|envoy| envoy["assignments"].as_array().unwrap().is_empty()));
    a.stop().await;
}

/// When `name` was first sent a token bucket allowing at least `rate` a second, at or after
/// `from_ms`.
fn first_share_of(done: &Value, name: &str, from_ms: i64, rate: f64) -> Option<i64> {
    assignments(done, name)
        .into_iter()
        .filter(|sent| sent["t_ms"].as_i64().unwrap() >= from_ms && sent["kind"] == "token_bucket")
        .find(|sent| rate_of(sent) >= rate)
        .map(|sent| sent["t_ms"].as_i64().unwrap())
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_newcomer_gets_a_share_within_an_interval_and_an_idle_envoy_gives_its_back_within_two(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let (a, b) = (replica(&connect).await, replica(&connect).await);
    put_rule(&a, 300.0, 60.0).await;
    let (joins_s, idles_s) = (8.0, 16.0);
    let done = grpc::envoys(json!({
        "duration_s": 26, "tick_ms": 10,
        "envoys": [
            envoy("e1", &a, 500.0, json!({ "stop_s": idles_s })),
            envoy("e2", &b, 500.0, json!({})),
            envoy("e3", &a, 500.0, json!({ "start_s": joins_s })),
        ],
    }))
    .await;
    let interval_ms = (INTERVAL_S * 1000.0) as i64;
    let capacity = 300.0 * 0.995;
    // Everything is held when e3 arrives: the others are told to shrink at once, and e3 is
    // sent the first share their next reports free, within an interval.
    let joined_ms = (joins_s * 1000.0) as i64;
    let got = first_share_of(&done, "e3", joined_ms, 0.9 * capacity / 3.0);
    let story = |name: &str| {
        assignments(&done, name)
            .iter()
            .map(|sent| format!("{}:{}/{}", sent["t_ms"], sent["kind"], sent["tokens_per_fill"]))
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert!(
        got.is_some_and(|at| at - joined_ms <= interval_ms + 500),
        "e3 got its share at {got:?}, it joined at {joined_ms}; e1 {} e2 {} e3 {} reports e1 {}",
        story("e1"),
        story("e2"),
        story("e3"),
        done["envoys"][0]["reports"]
    );
    // e1 goes idle: the others have its share within two intervals.
    let idled_ms = (idles_s * 1000.0) as i64;
    for name in ["e2", "e3"] {
        let grown = first_share_of(&done, name, idled_ms, 0.9 * capacity / 2.0);
        assert!(
            grown.is_some_and(|at| at - idled_ms <= 2 * interval_ms + 500),
            "{name} had half at {grown:?}, e1 went idle at {idled_ms}"
        );
    }
    assert_eq!(over_bound(&admissions(&done), 0, 300.0, 60.0, 0.0), None);
    a.stop().await;
    b.stop().await;
}

/// The store cannot answer: no assignment is sent (the Envoy keeps its last one until its TTL,
/// then falls back to its own no-assignment behaviour, DENY_ALL here), the stream stays open,
/// and the failures are counted. An error is never an admission here either.
#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_store_that_cannot_answer_sends_nothing_and_the_last_assignment_lapses_at_its_ttl(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    use crate::support::proxy::{Mode, Proxy};
    use std::net::ToSocketAddrs;
    let upstream = (connect.get_host(), connect.get_port()).to_socket_addrs().unwrap().next().unwrap();
    let proxy = Proxy::start(upstream).await;
    let through_proxy = connect.clone().host("127.0.0.1").port(proxy.address().port());
    let a = replica(&through_proxy).await;
    put_rule(&a, 100.0, 20.0).await;
    let api = (*a).clone();
    let run = tokio::spawn(grpc::envoys(json!({
        "duration_s": 14, "tick_ms": 10,
        "envoys": [envoy("e1", &a, 200.0, json!({}))],
    })));
    eventually(std::time::Duration::from_secs(6), "the Envoy holds a token bucket", || async {
        api.metric("plexsphere_rlqs_buckets_assigned").await.is_some_and(|held| held >= 1.0)
    })
    .await;
    // The fault's own moment in the scenario, after the Envoy had reported twice.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    proxy.set(Mode::Severed);
    let severed_unix =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    let done = run.await.unwrap();
    let severed_ms = ((severed_unix - done["started_unix"].as_f64().unwrap()) * 1000.0) as i64;
    let sent = assignments(&done, "e1");
    let last = sent.last().unwrap();
    let last_ms = last["t_ms"].as_i64().unwrap();
    assert!(
        last_ms <= severed_ms + 200,
        "an assignment at {last_ms} ms, after the store went away at {severed_ms}"
    );
    let e1 = &done["envoys"][0];
    let reports_after = e1["reports"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|report| report[0].as_i64().unwrap() > severed_ms)
        .count();
    assert!(reports_after >= 2, "the Envoy kept reporting: {}", e1["reports"]);
    let ttl_ms = TTL_S.parse::<i64>().unwrap() * 1000;
    let lapsed = e1["expiries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|expiry| expiry[0].as_i64().unwrap())
        .find(|at| *at > last_ms);
    assert!(
        lapsed.is_some_and(|at| (at - last_ms - ttl_ms).abs() <= 50),
        "its last assignment lapsed at {lapsed:?}, sent at {last_ms}"
    );
    // After it lapsed, DENY_ALL: nothing admitted.
    let admitted_after: i64 = e1["admitted"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|row| row[0].as_i64().unwrap() > lapsed.unwrap())
        .map(|row| row[2].as_i64().unwrap())
        .sum();
    assert_eq!(admitted_after, 0);
    assert_eq!(e1["streams"][0]["status"], Value::Null, "the stream stays open: {}", e1["streams"]);
    let errors = api.metric("plexsphere_rlqs_store_errors_total{service=\"shop\"}").await;
    assert!(errors.is_some_and(|errors| errors >= 2.0), "{errors:?}");
    proxy.set(Mode::Open);
    a.stop().await;
}

/// Several `bucket_id`s its rule keys alike (a rule of the tenant, ids that also carry the
/// user) are several token buckets in one Envoy: each is a holder of its own share, so
/// together they still admit no more than the rule.
#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn bucket_ids_a_rule_keys_alike_share_its_budget_within_one_envoy(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let (a, b) = (replica(&connect).await, replica(&connect).await);
    put_rule(&a, 200.0, 40.0).await;
    let users = |names: &[&str]| -> Value {
        names
            .iter()
            .map(|user| json!({ "bucket_id": { "api": "checkout", "tenant": "acme", "user": user }, "load_rps": 300 }))
            .collect()
    };
    let done = grpc::envoys(json!({
        "duration_s": 12, "tick_ms": 10,
        "envoys": [
            envoy("e1", &a, 0.0, json!({ "buckets": users(&["u1", "u2", "u3"]) })),
            envoy("e2", &b, 0.0, json!({ "buckets": users(&["u4"]) })),
        ],
    }))
    .await;
    assert_eq!(
        over_bound(&admissions(&done), 0, 200.0, 40.0, 0.0),
        None,
        "a window over burst + rate x window"
    );
    // Four holders of one budget, each a quarter, whichever Envoy holds them.
    let e1 = admitted_rate(&done, "e1", 7000, 12_000);
    let e2 = admitted_rate(&done, "e2", 7000, 12_000);
    assert!(
        (e1 - 150.0).abs() <= 15.0 && (e2 - 50.0).abs() <= 5.0,
        "e1 {e1:.1}/s for three, e2 {e2:.1}/s for one"
    );
    a.stop().await;
    b.stop().await;
}
