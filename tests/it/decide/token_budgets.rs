//! Token budgets (issue 34, item 4; docs/adr/0040), over Envoy's protocol (the Python grpcio
//! client) and `POST /v1/decide`, on the manual clock: a rule that charges ALWAYS, an explicit
//! `hits_addend` of 0 that checks without spending, a post-response charge of more than the
//! bucket holds accepted into debt, and the checks refused, with a Retry-After, until refill
//! has repaid it; the table's tokens never below 0.

use std::sync::Arc;

use chrono::{DateTime, TimeDelta, Utc};
use ratebudget::ManualClock;
use reqwest::StatusCode;
use serde_json::{json, Value};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;

use super::{grpc, http_decide, overall, rule, service, status, DECIDE_TOKEN};
use crate::support::helpers::instant;

/// 1000 tokens a minute, a burst of 1000, charged ALWAYS: an LLM's tokens per tenant.
fn tokens_rule() -> Value {
    json!({
        "service": "llm", "api": "chat", "selector": { "tenant": "*" },
        "rate": 1000, "per_ms": 60_000, "burst": 1000, "charge": "ALWAYS",
    })
}

/// 5 requests a minute, charged when covered (the default).
fn requests_rule() -> Value {
    json!({ "service": "llm", "api": "requests", "selector": { "tenant": "*" }, "rate": 5, "per_ms": 60_000, "burst": 5 })
}

/// A ShouldRateLimit call for tenant `acme`: one descriptor per (api, its own hits_addend).
fn call(descriptors: &[(&str, u64)]) -> Value {
    let descriptors: Vec<Value> = descriptors
        .iter()
        .map(|(api, hits)| json!({ "entries": [["api", api], ["tenant", "acme"]], "hits_addend": hits }))
        .collect();
    json!({ "token": DECIDE_TOKEN, "domain": "llm", "descriptors": descriptors })
}

/// The same request as JSON for `POST /v1/decide`.
fn http_call(descriptors: &[(&str, u64)]) -> Value {
    let descriptors: Vec<Value> = descriptors
        .iter()
        .map(|(api, hits)| {
            json!({
                "entries": [{ "key": "api", "value": api }, { "key": "tenant", "value": "acme" }],
                "hits_addend": hits,
            })
        })
        .collect();
    json!({ "domain": "llm", "descriptors": descriptors })
}

/// Every row of `rate_budgets`: (tokens, refilled_at), by key.
async fn rows(pool: &PgPool) -> Vec<(f64, DateTime<Utc>)> {
    sqlx::query_as("SELECT tokens, refilled_at FROM plexsphere.rate_budgets ORDER BY bucket_key")
        .fetch_all(pool)
        .await
        .unwrap()
}

fn header<'a>(headers: &'a Value, name: &str) -> Option<&'a str> {
    headers.as_array().unwrap().iter().find_map(|header| match header {
        // gRPC's client: [key, value]; HTTP's JSON: {"key", "value"}.
        Value::Array(pair) if pair[0] == name => pair[1].as_str(),
        Value::Object(pair) if pair["key"] == name => pair["value"].as_str(),
        _ => None,
    })
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_token_budget_checks_with_zero_charges_into_debt_and_refuses_until_refill_repays_it(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let clock = Arc::new(ManualClock::new(instant()));
    let replica = service(&connect, clock.clone(), &[]).await;
    let grpc = replica.grpc.unwrap();
    let pool = PgPool::connect_with(connect.clone()).await.unwrap();
    rule(&replica, "llm-tokens", tokens_rule()).await;

    // The request-time check, an explicit 0: OK, the whole burst left, nothing written.
    let checked = grpc::call(grpc, call(&[("chat", 0)])).await;
    assert_eq!(overall(&checked), "OK", "{checked}");
    assert_eq!(status(&checked, 0)["limit_remaining"], 1000);
    assert!(rows(&pool).await.is_empty(), "a check writes nothing");

    // The response's 1500 tokens, charged after it (apply_on_stream_done): more than the
    // bucket holds, accepted.
    let charged = http_decide(&replica, &http_call(&[("chat", 1500)])).await;
    assert_eq!(charged.status, StatusCode::OK, "{charged:?}");
    assert_eq!(charged.body["overall_code"], "OK");
    assert_eq!(charged.body["statuses"][0]["limit_remaining"], 0);
    // 500 of debt at 1000 a minute is 30 s, then a minute to refill the burst.
    assert_eq!(charged.body["statuses"][0]["duration_until_reset_ms"], 90_000);
    // In the table: no negative tokens; the debt is refilled_at 30 s ahead of now.
    let now = instant();
    assert_eq!(rows(&pool).await, [(0.0, now + TimeDelta::seconds(30))]);

    // The next check is over the limit until refill has repaid the debt and a token: 30.06 s.
    let over = grpc::call(grpc, call(&[("chat", 0)])).await;
    assert_eq!(overall(&over), "OVER_LIMIT", "{over}");
    assert_eq!(status(&over, 0)["limit_remaining"], 0);
    assert_eq!(status(&over, 0)["duration_until_reset_ms"], 30_060);
    assert_eq!(header(&over["response"]["response_headers_to_add"], "retry-after"), Some("31"));
    let over = http_decide(&replica, &http_call(&[("chat", 0)])).await;
    assert_eq!(over.body["overall_code"], "OVER_LIMIT", "{over:?}");
    assert_eq!(header(&over.body["response_headers_to_add"], "retry-after"), Some("31"));
    clock.advance(TimeDelta::seconds(29));
    let still = grpc::call(grpc, call(&[("chat", 0)])).await;
    assert_eq!(overall(&still), "OVER_LIMIT");
    assert_eq!(header(&still["response"]["response_headers_to_add"], "retry-after"), Some("2"));
    // Past it: a token again.
    clock.advance(TimeDelta::milliseconds(1_060));
    let repaid = http_decide(&replica, &http_call(&[("chat", 0)])).await;
    assert_eq!(repaid.body["overall_code"], "OK", "{repaid:?}");
    assert_eq!(repaid.body["statuses"][0]["limit_remaining"], 1);
    let repaid = grpc::call(grpc, call(&[("chat", 0)])).await;
    assert_eq!(overall(&repaid), "OK");
    // Checks wrote nothing: the row is still the charge's.
    assert_eq!(rows(&pool).await, [(0.0, now + TimeDelta::seconds(30))]);
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_charge_follows_a_granted_take_and_a_refused_request_charges_nothing(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let clock = Arc::new(ManualClock::new(instant()));
    let replica = service(&connect, clock.clone(), &[]).await;
    let grpc = replica.grpc.unwrap();
    let pool = PgPool::connect_with(connect.clone()).await.unwrap();
    rule(&replica, "llm-tokens", tokens_rule()).await;
    rule(&replica, "llm-requests", requests_rule()).await;

    // A request and its tokens known up front, in one call: the take, then the charge.
    let both = grpc::call(grpc, call(&[("requests", 1), ("chat", 700)])).await;
    assert_eq!(overall(&both), "OK", "{both}");
    assert_eq!(status(&both, 0)["limit_remaining"], 4);
    assert_eq!(status(&both, 1)["limit_remaining"], 300);
    assert_eq!(status(&both, 1)["current_limit"]["name"], "llm-tokens");
    // Empty the requests' bucket: a request it refuses charges nothing.
    let spent = http_decide(&replica, &http_call(&[("requests", 4)])).await;
    assert_eq!(spent.body["overall_code"], "OK");
    let before = rows(&pool).await;
    let refused = grpc::call(grpc, call(&[("requests", 1), ("chat", 700)])).await;
    assert_eq!(overall(&refused), "OVER_LIMIT");
    assert_eq!(status(&refused, 0)["code"], "OVER_LIMIT");
    assert_eq!(rows(&pool).await, before, "neither spent nor charged");

    // A normal rule's explicit-0 check of its empty bucket: over the limit, nothing written.
    let checked = http_decide(&replica, &http_call(&[("requests", 0)])).await;
    assert_eq!(checked.body["overall_code"], "OVER_LIMIT", "{checked:?}");
    // One request a 12 s.
    assert_eq!(checked.body["statuses"][0]["duration_until_reset_ms"], 12_000);
    assert_eq!(header(&checked.body["response_headers_to_add"], "retry-after"), Some("12"));
    let checked = grpc::call(grpc, call(&[("requests", 0)])).await;
    assert_eq!(overall(&checked), "OVER_LIMIT");
    assert_eq!(rows(&pool).await, before, "a check writes nothing");
    // And a check over the limit refuses a request whose other descriptors would be taken,
    // before anything is spent.
    clock.advance(TimeDelta::seconds(1));
    let with_take = grpc::call(grpc, call(&[("chat", 1), ("requests", 0)])).await;
    assert_eq!(overall(&with_take), "OVER_LIMIT");
    assert_eq!(status(&with_take, 0)["code"], "OK");
    assert_eq!(rows(&pool).await, before, "the tokens were not charged");
}
