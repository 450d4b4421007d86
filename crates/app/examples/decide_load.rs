//! The load of `bench/decide.sh`: Envoy's `ShouldRateLimit` against a running replica, a
//! fixed number of calls in flight on one HTTP/2 connection (as each of Envoy's worker threads
//! keeps one to its rate limit service), for a number of seconds, one tenant or many; prints
//! what it measured.
//!
//! ```sh
//! cargo run --release -p app --example decide_load -- 127.0.0.1:8081 <decide token> 64 10 hot
//! cargo run --release -p app --example decide_load -- 127.0.0.1:8081 <decide token> 64 10 100000
//! ```
//!
//! `CONNECTIONS=N` spreads the calls over N connections, as an Envoy with N workers would.
//! It exits with an error when any call failed, after printing the figures of the others.
//!
//! It speaks gRPC on HTTP/2 itself (h2, one thread), as Envoy's client does on its own codec:
//! it shares the machine's cores with the service it measures, and tonic's client stack on a
//! multi-threaded runtime cost as much CPU a call as the service (BENCHMARKS.md section 8).
//! Each call is a real `ShouldRateLimit`: protobuf request in a gRPC frame, response headers,
//! the message, and the `grpc-status` trailer, all checked.

// A load generator prints its figures; the workspace's lint is for the libraries.
#![allow(clippy::print_stdout)]

use std::time::{Duration, Instant};

// The load generator shares the machine with the service: it should cost as little as it can.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use bytes::{BufMut as _, Bytes, BytesMut};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    rate_limit_descriptor::Entry, RateLimitDescriptor,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{
    rate_limit_response::Code, RateLimitRequest, RateLimitResponse,
};
use prost::Message as _;

type Failure = Box<dyn std::error::Error + Send + Sync>;

const PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Failure> {
    let args: Vec<String> = std::env::args().collect();
    let [_, address, token, in_flight, seconds, tenants] = args.as_slice() else {
        return Err(
            "usage: decide_load <address> <token> <in flight> <seconds> <hot|number of tenants>".into()
        );
    };
    let in_flight: usize = in_flight.parse()?;
    let seconds: u64 = seconds.parse()?;
    let tenants: Option<u64> = if tenants == "hot" { None } else { Some(tenants.parse()?) };
    // One connection unless told otherwise: an Envoy keeps one per worker thread.
    let connections: usize = std::env::var("CONNECTIONS").map_or(Ok(1), |count| count.parse())?;
    let (mut clients, mut drivers) = (Vec::new(), Vec::new());
    for _ in 0..connections.max(1) {
        let stream = tokio::net::TcpStream::connect(address.as_str()).await?;
        stream.set_nodelay(true)?;
        let (client, connection) = h2::client::handshake(stream).await?;
        clients.push(client);
        drivers.push(tokio::spawn(connection));
    }
    let uri: http::Uri = format!("http://{address}{PATH}").parse()?;
    let bearer = http::HeaderValue::try_from(format!("Bearer {token}"))?;
    let until = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for worker in 0..in_flight {
        let (mut client, uri, bearer) =
            (clients[worker % clients.len()].clone(), uri.clone(), bearer.clone());
        tasks.push(tokio::spawn(async move {
            // xorshift: a tenant per call, spread evenly, without a dependency.
            let mut state = 0x9E37_79B9_7F4A_7C15_u64 ^ (worker as u64 + 1);
            let (mut latencies, mut over, mut failed) = (Vec::new(), 0u64, 0u64);
            while Instant::now() < until {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let tenant = tenants.map_or_else(|| "hot".to_owned(), |count| format!("t{}", state % count));
                let body = framed(&RateLimitRequest {
                    domain: "bench".into(),
                    descriptors: vec![RateLimitDescriptor {
                        entries: vec![
                            Entry { key: "api".into(), value: "GET /v1/users".into() },
                            Entry { key: "tenant".into(), value: tenant },
                        ],
                        ..RateLimitDescriptor::default()
                    }],
                    hits_addend: 1,
                });
                let started = Instant::now();
                match call(&mut client, &uri, &bearer, body).await {
                    Ok(response) => {
                        latencies.push(started.elapsed().as_micros() as u64);
                        if response.overall_code == Code::OverLimit as i32 {
                            over += 1;
                        }
                    }
                    Err(_) => failed += 1,
                }
            }
            (latencies, over, failed)
        }));
    }
    let (mut latencies, mut over, mut failed) = (Vec::new(), 0, 0);
    for task in tasks {
        let (some, o, f) = task.await?;
        latencies.extend(some);
        over += o;
        failed += f;
    }
    drop(clients);
    drivers.iter().for_each(tokio::task::JoinHandle::abort);
    latencies.sort_unstable();
    let at = |quantile: f64| {
        latencies
            .get(((latencies.len() as f64 * quantile) as usize).min(latencies.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    println!(
        "decisions/s {:.0} p50_us {} p99_us {} over_limit {} failed {}",
        latencies.len() as f64 / seconds as f64,
        at(0.50),
        at(0.99),
        over,
        failed
    );
    if failed > 0 {
        return Err(format!("{failed} calls failed: the figures above leave them out").into());
    }
    Ok(())
}

/// `message` as a gRPC frame: not compressed, its length, its bytes.
fn framed(message: &RateLimitRequest) -> Bytes {
    let length = message.encoded_len();
    let mut frame = BytesMut::with_capacity(5 + length);
    frame.put_u8(0);
    frame.put_u32(u32::try_from(length).expect("a small message"));
    message.encode(&mut frame).expect("capacity reserved");
    frame.freeze()
}

/// One `ShouldRateLimit` call on `client`'s connection: the answer, or why there is none (an
/// HTTP status other than 200, a `grpc-status` other than 0, a message that does not decode).
async fn call(
    client: &mut h2::client::SendRequest<Bytes>,
    uri: &http::Uri,
    bearer: &http::HeaderValue,
    body: Bytes,
) -> Result<RateLimitResponse, Failure> {
    let request = http::Request::post(uri.clone())
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("authorization", bearer.clone())
        .body(())?;
    // Each task has one call in flight, fewer in all than the streams the server allows.
    let (response, mut send) = client.send_request(request, false)?;
    send.send_data(body, true)?;
    let response = response.await?;
    if response.status() != http::StatusCode::OK {
        return Err(format!("HTTP {}", response.status()).into());
    }
    // An error is answered in the headers alone ("trailers-only").
    if let Some(status) = response.headers().get("grpc-status").filter(|status| status.as_bytes() != b"0") {
        return Err(format!("grpc-status {status:?}").into());
    }
    let mut body = response.into_body();
    let mut received = BytesMut::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk?;
        body.flow_control().release_capacity(chunk.len())?;
        received.extend_from_slice(&chunk);
    }
    let status = body.trailers().await?.and_then(|trailers| trailers.get("grpc-status").cloned());
    if status.as_ref().map(http::HeaderValue::as_bytes) != Some(b"0") {
        return Err(format!("grpc-status {status:?}").into());
    }
    if received.len() < 5 || received[0] != 0 {
        return Err("not an uncompressed gRPC message".into());
    }
    Ok(RateLimitResponse::decode(&received[5..])?)
}
