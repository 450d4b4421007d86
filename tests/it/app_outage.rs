//! The database goes away under a replica: requests that need it answer 500 (never 429),
//! readiness fails, liveness holds, and everything recovers by itself when it is back.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ratebudget::SystemClock;
use reqwest::{Method, StatusCode};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::support::proxy::{Mode, Proxy};
use crate::support::replicas::{config, eventually, Replica};

/// Where the test's own database really is, as DATABASE_URL named it.
fn upstream(connect: &PgConnectOptions) -> SocketAddr {
    use std::net::ToSocketAddrs;
    (connect.get_host(), connect.get_port()).to_socket_addrs().unwrap().next().unwrap()
}

/// The checks every outage must pass, whatever the network does.
async fn assert_down(replica: &Replica, token: &str) {
    let read = replica.get("/v1/secrets/api-key", Some(token)).await;
    assert_eq!(read.status, StatusCode::INTERNAL_SERVER_ERROR, "{read:?}");
    assert_eq!(read.code(), "internal");
    assert!(read.retry_after.is_none());
    // The cause stays in the log.
    assert!(!read.body.to_string().contains("connection"), "{read:?}");
    let batch = replica.request(Method::POST, "/v1/ingest", Some(token), Some(b"cpu=0.5".to_vec())).await;
    assert_eq!(batch.status, StatusCode::INTERNAL_SERVER_ERROR, "{batch:?}");
    assert_eq!(replica.get("/readyz", None).await.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(replica.get("/healthz", None).await.status, StatusCode::OK);
}

async fn assert_recovers(replica: &Replica, token: &str) {
    eventually(Duration::from_secs(15), "reads answer again", || async {
        replica.get("/v1/secrets/api-key", Some(token)).await.status == StatusCode::OK
    })
    .await;
    let batch = replica.request(Method::POST, "/v1/ingest", Some(token), Some(b"cpu=0.5".to_vec())).await;
    assert_eq!(batch.status, StatusCode::ACCEPTED);
    // Readiness answers from a probe at most a second old.
    eventually(Duration::from_secs(3), "readiness recovers", || async {
        replica.get("/readyz", None).await.status == StatusCode::OK
    })
    .await;
}

/// A replica behind a proxy, serving a Node and its secret; the proxy then does `outage`
/// to the database, and later lets it through again.
async fn outage_and_recovery(connect: PgConnectOptions, outage: Mode) {
    let proxy = Proxy::start(upstream(&connect)).await;
    let through_proxy = connect.clone().host("127.0.0.1").port(proxy.address().port());
    let replica = Replica::start(config(&through_proxy, &[]), Arc::new(SystemClock)).await;
    let domain = replica.create_domain("outage", None).await;
    let (_, token) = replica.enrol(&domain, "node-1").await;
    replica.put_secret(&domain, "api-key", "s3cr3t").await;
    assert_eq!(replica.get("/v1/secrets/api-key", Some(&token)).await.status, StatusCode::OK);
    tokio::time::timeout(Duration::from_secs(10), replica.leadership.clone().wait_until(true)).await.unwrap();

    proxy.set(outage);
    assert_down(&replica, &token).await;
    // A replica that has lost its session (or whose session checks time out) stops claiming
    // leadership.
    eventually(Duration::from_secs(15), "the leader gauge drops", || async {
        replica.leader_gauge().await == 0
    })
    .await;

    proxy.set(Mode::Open);
    assert_recovers(&replica, &token).await;
    eventually(Duration::from_secs(15), "it leads again", || async { replica.leader_gauge().await == 1 })
        .await;
    replica.stop().await;
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn with_the_database_cut_off_requests_fail_closed_with_500_and_recover_by_themselves(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    outage_and_recovery(connect, Mode::Severed).await;
}

/// Connections stay open but nothing crosses them: without the request's database deadline
/// these calls would hang (the test client gives up after 20 s and fails the test).
#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn with_the_network_silent_requests_answer_500_within_the_database_timeout(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    outage_and_recovery(connect, Mode::Stalled).await;
}
