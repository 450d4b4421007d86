//! A replica whose clock is really off (libfaketime, 30 s ahead) decides on the database's
//! clock: the buckets it touches keep refilling for every other replica, its sweep deletes
//! only buckets idle for the retention on the database's clock, and it reports its offset
//! (issue 12, item 2; docs/adr/0015).

use std::time::Duration;

use app::startup::Wiring;
use reqwest::StatusCode;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::support::process::{database_url, Launch, LIBFAKETIME};
use crate::support::replicas::{config, eventually, Replica};

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_replica_30_s_ahead_neither_freezes_other_replicas_buckets_nor_sweeps_unfull_ones(
    pool_options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    assert!(
        std::path::Path::new(LIBFAKETIME).exists(),
        "libfaketime is missing: apt-get install faketime (.ci/run does)"
    );
    let pool = pool_options.connect_with(connect.clone()).await.unwrap();
    // The skewed replica starts first, so it leads and sweeps (every second).
    let mut skewed = Launch::serve(&database_url(&connect))
        .faked_clock("+30s")
        .knob("PLEXSPHERE_SWEEP_INTERVAL_SECS", "1")
        .start()
        .await;
    skewed.wait_for_log("became leader", Duration::from_secs(10)).await;
    let ahead = skewed.api();
    eventually(Duration::from_secs(10), "the skewed replica measured its clock", || async {
        ahead.get("/readyz", None).await.status == StatusCode::OK
    })
    .await;
    let offset = ahead.metric("plexsphere_clock_offset_seconds").await.unwrap();
    assert!((-30.5..-29.5).contains(&offset), "the database's clock is 30 s behind this one: {offset}");

    let honest = Replica::start_with(config(&connect, &[]), Wiring::production()).await;
    eventually(Duration::from_secs(10), "the honest replica measured its clock", || async {
        honest.get("/readyz", None).await.status == StatusCode::OK
    })
    .await;
    let domain = honest.create_domain("skew", None).await;
    let (_, token) = honest.enrol(&domain, "node-1").await;
    honest.put_secret(&domain, "api-key", "s3cr3t").await;

    // Spend the Node's whole burst (20, refilling at 10 a second) through the skewed replica.
    let mut admitted = 0;
    for _ in 0..25 {
        if ahead.get("/v1/secrets/api-key", Some(&token)).await.status == StatusCode::OK {
            admitted += 1;
        }
    }
    assert!((20..25).contains(&admitted), "the burst, and a read or two it refilled meanwhile: {admitted}");
    // Had the skewed replica written its own clock into refilled_at, the honest replica would
    // see no time pass for 30 s. It sees the bucket refill at 10 a second.
    eventually(Duration::from_secs(2), "the honest replica's reads refill", || async {
        honest.get("/v1/secrets/api-key", Some(&token)).await.status == StatusCode::OK
    })
    .await;

    // Two buckets: one idle for two hours on the database's clock, one for 3590 s. A leader
    // sweeping on its own clock, 30 s ahead, would take both.
    for (key, idle) in [(uuid::Uuid::new_v4(), "2 hours"), (uuid::Uuid::new_v4(), "3590 seconds")] {
        sqlx::query(&format!(
            "INSERT INTO plexsphere.rate_budgets VALUES ('ingest_node', $1, 0, now() - interval '{idle}')"
        ))
        .bind(key)
        .execute(&pool)
        .await
        .unwrap();
    }
    let idle_rows = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM plexsphere.rate_budgets WHERE refilled_at < now() - interval '3000 seconds'",
        )
        .fetch_one(&pool)
        .await
        .unwrap()
    };
    eventually(Duration::from_secs(10), "the two-hour bucket is swept", || async { idle_rows().await == 1 })
        .await;
    // Two more sweeps go by, and the 3590 s bucket is still there.
    let swept_before = sweeps(&ahead).await;
    eventually(Duration::from_secs(10), "two more sweeps run", || async {
        sweeps(&ahead).await >= swept_before + 2
    })
    .await;
    assert_eq!(idle_rows().await, 1, "a bucket idle for less than the retention was swept");

    honest.stop().await;
    skewed.signal("TERM");
    assert!(skewed.exited_within(Duration::from_secs(10)).await.is_some());
}

async fn sweeps(api: &crate::support::replicas::Api) -> u64 {
    let text = api.get("/metrics", None).await.body.as_str().unwrap_or_default().to_owned();
    text.lines()
        .find_map(|line| line.strip_prefix("plexsphere_rate_budget_sweeps_total{outcome=\"ok\"} "))
        .map_or(0, |value| value.trim().parse().unwrap())
}

/// A replica that cannot measure the database's clock within the bound (the network is so
/// slow that half a round trip exceeds it) does not decide: budgets answer 500, never 429, and
/// `/readyz` 503. Once measurements are good again, it decides again.
#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_replica_whose_clock_cannot_be_bounded_answers_500_and_is_not_ready_until_it_can(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    use crate::support::proxy::{Mode, Proxy};
    let upstream = {
        use std::net::ToSocketAddrs;
        (connect.get_host(), connect.get_port()).to_socket_addrs().unwrap().next().unwrap()
    };
    let proxy = Proxy::start(upstream).await;
    let through_proxy = connect.clone().host("127.0.0.1").port(proxy.address().port());
    // 60 ms each way: every round trip takes over 120 ms, so no measurement is better than
    // ±60 ms, above the 50 ms bound.
    proxy.set(Mode::Delayed(Duration::from_millis(60)));
    let knobs = [("PLEXSPHERE_MAX_CLOCK_SKEW_MS", "50"), ("PLEXSPHERE_DATABASE_TIMEOUT_MS", "5000")];
    let replica = Replica::start_with(config(&through_proxy, &knobs), Wiring::production()).await;
    let domain = replica.create_domain("untrusted", None).await;
    let enrol = replica
        .operator(
            reqwest::Method::POST,
            &format!("/v1/domains/{domain}/nodes"),
            Some(serde_json::json!({ "name": "n" })),
        )
        .await;
    assert_eq!((enrol.status, enrol.code()), (StatusCode::INTERNAL_SERVER_ERROR, "internal"), "{enrol:?}");
    let ready = replica.get("/readyz", None).await;
    assert_eq!(ready.status, StatusCode::SERVICE_UNAVAILABLE, "{ready:?}");
    // The offset is still measured and reported.
    assert!(replica.metric("plexsphere_clock_offset_seconds").await.is_some());

    proxy.set(Mode::Open);
    eventually(Duration::from_secs(10), "it decides again", || async {
        replica.get("/readyz", None).await.status == StatusCode::OK
    })
    .await;
    let (_, token) = replica.enrol(&domain, "node-1").await;
    assert!(!token.is_empty());
    replica.stop().await;
}
