//! `GET /v1/quota/buckets?service=S` (issue 35 item 5): the operator route that lists a
//! service's RLQS buckets with their holders and shares, as `plexsphere.quota_assign` counted
//! them on any replica; operator-authenticated, JSON errors like every operator route.

use std::sync::Arc;
use std::time::Duration;

use app::quota_store::PgQuotaStore;
use ratebudget::{Key, ManualClock, Statements};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use service::quota::{BucketHolder, Budget, QuotaSettings, QuotaStore, ShareRequest, Usage};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use uuid::Uuid;

use crate::support::helpers::instant;
use crate::support::replicas::{config, Answer, Replica};

#[track_caller]
fn check(answer: &Answer, status: StatusCode, code: &str) {
    assert_eq!((answer.status, answer.code()), (status, code), "{answer:?}");
    assert!(answer.body["error"].as_str().is_some_and(|error| !error.is_empty()), "{answer:?}");
}

/// A report of `holder`'s bucket of `service` under a rule of 100 a second and a burst of 50,
/// as the gRPC stream of `replica` makes it.
fn report(service: &str, key: u64, holder: Uuid, replica: &str, usage: Option<Usage>) -> ShareRequest {
    ShareRequest {
        service: service.into(),
        budget: Budget {
            key: Key::from(Uuid::from_u64_pair(0, key)),
            rule_id: format!("{service}-rule"),
            rate: 100.0,
            burst: 50.0,
            fill_seconds: 60,
            shadow: false,
        },
        holder: BucketHolder { stream: holder, holder, unsure: false, builds_full: false },
        replica: replica.into(),
        usage,
        settings: QuotaSettings::default(),
    }
}

fn holders(bucket: &Value) -> &Vec<Value> {
    bucket["holders"].as_array().unwrap()
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn the_route_lists_a_services_buckets_with_every_replicas_holders_and_their_shares(
    pool_options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let pool = pool_options.connect_with(connect.clone()).await.unwrap();
    let replica = Replica::start(config(&connect, &[]), Arc::new(ManualClock::new(instant()))).await;
    let path = "/v1/quota/buckets?service=shop";

    for bearer in [None, Some("wrong-token")] {
        check(&replica.get(path, bearer).await, StatusCode::UNAUTHORIZED, "unauthorized");
    }
    for bad in ["/v1/quota/buckets", "/v1/quota/buckets?service=", "/v1/quota/buckets?service=shop&x=1"] {
        check(&replica.operator(Method::GET, bad, None).await, StatusCode::BAD_REQUEST, "bad_request");
    }
    let answer = replica.operator(Method::GET, path, None).await;
    assert_eq!((answer.status, &answer.body), (StatusCode::OK, &json!({ "service": "shop", "buckets": [] })));

    // Two holders of one bucket, on two replicas; another bucket; another service's bucket.
    let store = PgQuotaStore::new(Statements::new(pool.clone()));
    let (first, second) = (Uuid::from_u64_pair(0, 1), Uuid::from_u64_pair(0, 2));
    let started = Some(Usage { allowed: 1, denied: 0, elapsed: Duration::ZERO });
    store.assign(&report("shop", 7, first, "10.0.0.1:8081", started)).await.unwrap();
    store.assign(&report("shop", 7, second, "10.0.0.2:8081", started)).await.unwrap();
    store.close(second).await.unwrap();
    store.assign(&report("shop", 9, first, "10.0.0.1:8081", None)).await.unwrap();
    store.assign(&report("billing", 11, first, "10.0.0.1:8081", None)).await.unwrap();

    let answer = replica.operator(Method::GET, path, None).await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    let buckets = answer.body["buckets"].as_array().unwrap();
    let keys: Vec<&str> = buckets.iter().map(|bucket| bucket["key"].as_str().unwrap()).collect();
    assert_eq!(
        keys,
        [Uuid::from_u64_pair(0, 7).to_string(), Uuid::from_u64_pair(0, 9).to_string()],
        "{buckets:?}"
    );
    let bucket = &buckets[0];
    assert_eq!(
        (&bucket["rule_id"], &bucket["rate"], &bucket["burst"]),
        (&json!("shop-rule"), &json!(100.0), &json!(50.0))
    );
    assert!(bucket["pool"].as_f64().is_some() && bucket["pool_at"].is_string(), "{bucket}");
    let [alone, denied] = holders(bucket).as_slice() else { panic!("two holders: {bucket}") };
    assert_eq!(
        (&alone["holder"], &alone["replica"], &alone["demand"], &alone["closed"]),
        (&json!(first), &json!("10.0.0.1:8081"), &Value::Null, &json!(false))
    );
    // The first holder was granted the capacity (99.5 a second: 5970 tokens a minute) and
    // nine tenths of the burst at once, and counts what it was sent.
    assert_eq!((&alone["rate"], &alone["max_tokens"]), (&json!(99.5), &json!(45.0)), "{alone}");
    assert_eq!((&alone["counted_rate"], &alone["counted_burst"]), (&alone["rate"], &alone["max_tokens"]));
    assert!(alone["sent_at"].is_string() && alone["expires_at"].is_string(), "{alone}");
    // Everything was held when the second came: a DENY_ALL, counting nothing; its stream ended.
    assert_eq!(
        (&denied["replica"], &denied["rate"], &denied["counted_rate"], &denied["closed"]),
        (&json!("10.0.0.2:8081"), &json!(0.0), &json!(0.0), &json!(true)),
        "{denied}"
    );
    assert_eq!(holders(&buckets[1]).len(), 1, "{buckets:?}");

    // A store that cannot answer is a 500, its cause in the log only.
    sqlx::query("ALTER TABLE plexsphere.quota_shares RENAME TO quota_shares_gone")
        .execute(&pool)
        .await
        .unwrap();
    let answer = replica.operator(Method::GET, path, None).await;
    check(&answer, StatusCode::INTERNAL_SERVER_ERROR, "internal");
    assert!(!answer.body.to_string().contains("quota_shares"), "{answer:?}");
    replica.stop().await;
}
