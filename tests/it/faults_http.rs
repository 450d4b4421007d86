//! Slow and idle clients cannot hold a replica's sockets or its shutdown: header, body and
//! request deadlines, the connection cap, graceful shutdown bounded by its grace, and a second
//! signal that exits at once (issue 12, item 1), plus SIGTERM under load (item 4).
//!
//! Every bound below is a deadline the service promises plus an explicit allowance for a
//! loaded two-core machine; none is a sleep that hides a race.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ratebudget::SystemClock;
use reqwest::StatusCode;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::process::{database_url, Launch};
use crate::support::replicas::{config, Replica};

/// What a loaded machine may add to a deadline before the test calls it missed.
const SLACK: Duration = Duration::from_millis(1500);

/// Reads until the server closes the connection (or `within` passes) and returns what came.
async fn read_until_closed(stream: &mut TcpStream, within: Duration) -> Option<Vec<u8>> {
    let mut received = Vec::new();
    let mut buffer = [0_u8; 4096];
    let read_all = async {
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(read) => received.extend_from_slice(&buffer[..read]),
            }
        }
    };
    tokio::time::timeout(within, read_all).await.ok()?;
    Some(received)
}

/// The head of an ingest request whose body is `length` bytes.
fn ingest_head(token: &str, length: usize) -> String {
    format!(
        "POST /v1/ingest HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer {token}\r\nContent-Length: {length}\r\n\r\n"
    )
}

fn status_of(response: &[u8]) -> String {
    String::from_utf8_lossy(response).lines().next().unwrap_or_default().to_owned()
}

async fn node_with_secret(replica: &Replica) -> String {
    let domain = replica.create_domain("slow-clients", None).await;
    let (_, token) = replica.enrol(&domain, "node-1").await;
    replica.put_secret(&domain, "api-key", "s3cr3t").await;
    token
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn half_sent_headers_are_closed_after_the_header_timeout_and_the_cap_holds_the_rest_back(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let header_timeout = Duration::from_millis(700);
    let knobs = [("PLEXSPHERE_HTTP_HEADER_TIMEOUT_MS", "700"), ("PLEXSPHERE_HTTP_MAX_CONNECTIONS", "50")];
    let replica = Replica::start(config(&connect, &knobs), Arc::new(SystemClock)).await;
    let address: SocketAddr = replica.base().trim_start_matches("http://").parse().unwrap();

    // 300 clients each send half a request header and then nothing: six times the cap.
    let started = Instant::now();
    let mut clients = Vec::new();
    for _ in 0..300 {
        let mut stream = TcpStream::connect(address).await.unwrap();
        stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: te").await.unwrap();
        clients.push(stream);
    }
    // Each is served (and closed) once a slot is free: the first 50 at once, then 50 every
    // header timeout, so all are closed by 6 timeouts, and none stays open.
    let within = header_timeout * 6 + SLACK * 2;
    let closed =
        futures::future::join_all(clients.iter_mut().map(|stream| read_until_closed(stream, within))).await;
    assert!(closed.iter().all(Option::is_some), "a half-header connection was still open after {within:?}");
    let elapsed = started.elapsed();
    // The cap was real: 300 connections at 50 at a time took several header timeouts.
    assert!(elapsed >= header_timeout * 5, "all closed in {elapsed:?}: the cap did not hold");
    eprintln!(
        "300 half-header connections, cap 50, header timeout {header_timeout:?}: all closed in {elapsed:?}"
    );

    // And the replica serves normally afterwards.
    assert_eq!(replica.get("/healthz", None).await.status, StatusCode::OK);
    replica.stop().await;
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_trickling_body_answers_408_at_the_body_deadline_and_a_slow_request_503_at_its_own(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let knobs = [("PLEXSPHERE_HTTP_BODY_TIMEOUT_MS", "800"), ("PLEXSPHERE_HTTP_REQUEST_TIMEOUT_MS", "30000")];
    let replica = Replica::start(config(&connect, &knobs), Arc::new(SystemClock)).await;
    let token = node_with_secret(&replica).await;
    let address: SocketAddr = replica.base().trim_start_matches("http://").parse().unwrap();

    // A byte every 100 ms never leaves a gap long enough for a between-frames timeout.
    let trickle = |address: SocketAddr, token: String| async move {
        let mut stream = TcpStream::connect(address).await.unwrap();
        stream.write_all(ingest_head(&token, 1000).as_bytes()).await.unwrap();
        let started = Instant::now();
        let (mut reader, mut writer) = stream.into_split();
        let writing = tokio::spawn(async move {
            for _ in 0..1000 {
                if writer.write_all(b"x").await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        let mut response = vec![0_u8; 1024];
        let read =
            tokio::time::timeout(Duration::from_secs(20), reader.read(&mut response)).await.unwrap().unwrap();
        writing.abort();
        (status_of(&response[..read]), started.elapsed())
    };
    let (status, elapsed) = trickle(address, token.clone()).await;
    assert!(status.starts_with("HTTP/1.1 408"), "{status}");
    assert!(elapsed < Duration::from_millis(800) + SLACK, "{elapsed:?}");
    eprintln!("a body trickling a byte every 100 ms: 408 after {elapsed:?} (body timeout 800 ms)");
    replica.stop().await;

    // With a generous body timeout, the request deadline cuts it instead.
    let knobs = [
        ("PLEXSPHERE_HTTP_BODY_TIMEOUT_MS", "60000"),
        ("PLEXSPHERE_HTTP_REQUEST_TIMEOUT_MS", "1200"),
        ("PLEXSPHERE_DATABASE_TIMEOUT_MS", "1000"),
    ];
    let replica = Replica::start(config(&connect, &knobs), Arc::new(SystemClock)).await;
    let address: SocketAddr = replica.base().trim_start_matches("http://").parse().unwrap();
    let (status, elapsed) = trickle(address, token).await;
    assert!(status.starts_with("HTTP/1.1 503"), "{status}");
    assert!(elapsed < Duration::from_millis(1200) + SLACK, "{elapsed:?}");
    replica.stop().await;
}

/// Sends an ingest request's head and the first half of its body, once the handler is reading
/// it, and returns the stream: a request that is certainly in flight. `Expect: 100-continue`
/// makes the server say when the handler first asks for the body.
async fn half_sent_batch(address: SocketAddr, token: &str) -> TcpStream {
    let mut stream = TcpStream::connect(address).await.unwrap();
    let head = ingest_head(token, 200).replace("\r\n\r\n", "\r\nExpect: 100-continue\r\n\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut interim = Vec::new();
    let mut byte = [0_u8; 1];
    while !interim.ends_with(b"\r\n\r\n") {
        assert_eq!(stream.read(&mut byte).await.unwrap(), 1, "closed before 100 Continue");
        interim.push(byte[0]);
    }
    assert!(status_of(&interim).starts_with("HTTP/1.1 100"), "{}", String::from_utf8_lossy(&interim));
    stream.write_all(&[b'a'; 100]).await.unwrap();
    stream
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn on_sigterm_under_load_every_request_in_flight_completes_and_the_process_exits_cleanly(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let mut service =
        Launch::serve(&database_url(&connect)).knob("PLEXSPHERE_SHUTDOWN_GRACE_SECS", "10").start().await;
    let api = service.api();
    let domain = api.create_domain("shutdown", None).await;
    let (_, token) = api.enrol(&domain, "node-1").await;
    api.put_secret(&domain, "api-key", "s3cr3t").await;

    // Load: readers in a loop until the server stops answering.
    let readers: Vec<_> = (0..8)
        .map(|_| {
            let (api, token) = (api.clone(), token.clone());
            tokio::spawn(async move {
                let mut statuses = Vec::new();
                for _ in 0..10_000 {
                    match api.try_get("/v1/secrets/api-key", &token).await {
                        Ok(status) => statuses.push(status),
                        // Refused or reset once the listener is closed: the load is over.
                        Err(_) => break,
                    }
                }
                statuses
            })
        })
        .collect();
    // And 20 batches caught mid-body when the signal arrives.
    let mut in_flight = Vec::new();
    for _ in 0..20 {
        in_flight.push(half_sent_batch(service.address(), &token).await);
    }
    service.signal("TERM");
    service.wait_for_log("shutting down", Duration::from_secs(5)).await;
    for stream in &mut in_flight {
        stream.write_all(&[b'b'; 100]).await.unwrap();
    }
    for stream in &mut in_flight {
        let response = read_until_closed(stream, Duration::from_secs(10)).await.expect("answered and closed");
        assert!(status_of(&response).starts_with("HTTP/1.1 202"), "{}", String::from_utf8_lossy(&response));
    }
    let status = service.exited_within(Duration::from_secs(10)).await.expect("the process exits");
    assert!(status.success(), "{status}\n{}", service.log());
    for reader in readers {
        let statuses = reader.await.unwrap();
        // Only admissions and refusals: the shutdown never turned into a 500.
        assert!(
            statuses
                .iter()
                .all(|status| *status == StatusCode::OK || *status == StatusCode::TOO_MANY_REQUESTS),
            "{statuses:?}"
        );
    }
    assert!(service.log().contains("released leadership") || !service.log().contains("became leader"));
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_trickling_client_holds_shutdown_no_longer_than_the_grace_and_a_second_signal_exits_at_once(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let url = database_url(&connect);
    let trickle_forever = |mut stream: TcpStream| {
        tokio::spawn(async move {
            for _ in 0..600 {
                if stream.write_all(b"c").await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };

    // Grace 2 s, body timeout far beyond it: the grace is what ends the wait.
    let mut service = Launch::serve(&url)
        .knob("PLEXSPHERE_SHUTDOWN_GRACE_SECS", "2")
        .knob("PLEXSPHERE_HTTP_BODY_TIMEOUT_MS", "600000")
        .knob("PLEXSPHERE_HTTP_REQUEST_TIMEOUT_MS", "600000")
        .start()
        .await;
    let api = service.api();
    let domain = api.create_domain("trickle", None).await;
    let (_, token) = api.enrol(&domain, "node-1").await;
    let trickling = trickle_forever(half_sent_batch(service.address(), &token).await);
    service.signal("TERM");
    let started = Instant::now();
    let status =
        service.exited_within(Duration::from_secs(2) + SLACK * 2).await.expect("exits after the grace");
    assert!(status.success(), "{status}\n{}", service.log());
    eprintln!("a trickling client under a 2 s grace: exited {:?} after SIGTERM", started.elapsed());
    assert!(service.log().contains("shutdown grace elapsed"), "{}", service.log());
    trickling.abort();

    // Grace 60 s: the first signal drains, the second exits at once.
    let mut service = Launch::serve(&url)
        .knob("PLEXSPHERE_SHUTDOWN_GRACE_SECS", "60")
        .knob("PLEXSPHERE_HTTP_BODY_TIMEOUT_MS", "600000")
        .knob("PLEXSPHERE_HTTP_REQUEST_TIMEOUT_MS", "600000")
        .start()
        .await;
    let trickling = trickle_forever(half_sent_batch(service.address(), &token).await);
    service.signal("TERM");
    service.wait_for_log("draining connections", Duration::from_secs(5)).await;
    // Still draining a second later: the trickle holds it, as the grace allows.
    assert!(service.exited_within(Duration::from_secs(1)).await.is_none(), "{}", service.log());
    service.signal("TERM");
    let status = service.exited_within(SLACK).await.expect("a second signal exits at once");
    assert_eq!(status.code(), Some(130), "{}", service.log());
    trickling.abort();
}
