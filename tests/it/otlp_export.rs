//! The optional OpenTelemetry export (issue 15, item 3): with `PLEXSPHERE_OTLP_ENDPOINT` set,
//! a replica pushes `ratelimit.decisions` and `ratelimit.fallbacks` over OTLP/HTTP as
//! protobuf to `<endpoint>/v1/metrics`. The collector here is a few lines of axum on
//! 127.0.0.1 that keeps what it is sent.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode, Uri};
use ratebudget::ManualClock;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tokio::sync::mpsc;

use crate::support::helpers::instant;
use crate::support::replicas::{config, Replica};

/// One push as the collector received it: the path, the content type and the body.
type Push = (String, String, Vec<u8>);

/// A collector accepting OTLP/HTTP pushes on 127.0.0.1; it stops when `stop` is cancelled.
async fn collector(stop: tokio_util::sync::CancellationToken) -> (String, mpsc::UnboundedReceiver<Push>) {
    let (received, pushes) = mpsc::unbounded_channel();
    let router = axum::Router::new().fallback(move |uri: Uri, headers: HeaderMap, body: Bytes| {
        let received = received.clone();
        async move {
            let content_type =
                headers.get("content-type").and_then(|value| value.to_str().ok()).unwrap_or("");
            let _ = received.send((uri.path().to_owned(), content_type.to_owned(), body.to_vec()));
            // An empty ExportMetricsServiceResponse: everything accepted.
            (StatusCode::OK, [("content-type", "application/x-protobuf")], Bytes::new())
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, router).with_graceful_shutdown(stop.cancelled_owned()).await.unwrap();
    });
    (format!("http://{address}"), pushes)
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack.windows(needle.len()).any(|window| window == needle.as_bytes())
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn with_an_otlp_endpoint_a_replica_pushes_ratelimit_decisions_and_fallbacks_as_protobuf(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let stop = tokio_util::sync::CancellationToken::new();
    let (endpoint, mut pushes) = collector(stop.clone()).await;
    let knobs = [(app::config::OTLP_ENDPOINT, endpoint.as_str()), (app::config::OTLP_INTERVAL_MS, "200")];
    let replica = Replica::start(config(&connect, &knobs), Arc::new(ManualClock::new(instant()))).await;
    let domain = replica.create_domain("acme", None).await;
    let (_, token) = replica.enrol(&domain, "node-1").await;
    replica.put_secret(&domain, "k", "v").await;
    for _ in 0..3 {
        assert_eq!(replica.get("/v1/secrets/k", Some(&token)).await.status, reqwest::StatusCode::OK);
    }

    // Pushes come every 200 ms; the first may predate the reads.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    let body = loop {
        let (path, content_type, body) = tokio::time::timeout_at(deadline, pushes.recv())
            .await
            .expect("no push with the reads within 15 s")
            .expect("the collector is running");
        assert_eq!(path, "/v1/metrics");
        assert_eq!(content_type, "application/x-protobuf");
        if contains(&body, "secret_read_node") {
            break body;
        }
    };
    // Protobuf carries names and attribute values as plain UTF-8.
    for text in [
        "ratelimit.decisions",
        "ratelimit.fallbacks",
        "scope",
        "outcome",
        "granted",
        "secret_read_node",
        "plexsphere",
    ] {
        assert!(contains(&body, text), "the push has no {text:?}: {}", String::from_utf8_lossy(&body));
    }
    replica.stop().await;
    stop.cancel();
}
