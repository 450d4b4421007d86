//! The load of `bench/decide.sh`: Envoy's `ShouldRateLimit` against a running replica, a
//! fixed number of calls in flight on one HTTP/2 connection (as Envoy keeps one to its rate
//! limit service), for a number of seconds, one tenant or many; prints what it measured.
//!
//! ```sh
//! cargo run --release -p app --example decide_load -- 127.0.0.1:8081 <decide token> 64 10 hot
//! cargo run --release -p app --example decide_load -- 127.0.0.1:8081 <decide token> 64 10 100000
//! ```

// A load generator prints its figures; the workspace's lint is for the libraries.
#![allow(clippy::print_stdout)]

use std::time::{Duration, Instant};

// The load generator shares the machine with the service: it should cost as little as it can.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use app::http::grpc::envoy::extensions::common::ratelimit::v3::{
    rate_limit_descriptor::Entry, RateLimitDescriptor,
};
use app::http::grpc::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use app::http::grpc::envoy::service::ratelimit::v3::{rate_limit_response::Code, RateLimitRequest};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, address, token, in_flight, seconds, tenants] = args.as_slice() else {
        return Err(
            "usage: decide_load <address> <token> <in flight> <seconds> <hot|number of tenants>".into()
        );
    };
    let in_flight: usize = in_flight.parse()?;
    let seconds: u64 = seconds.parse()?;
    let tenants: Option<u64> = if tenants == "hot" { None } else { Some(tenants.parse()?) };
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{address}"))?.connect().await?;
    let bearer: tonic::metadata::MetadataValue<_> = format!("Bearer {token}").parse()?;
    let until = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for worker in 0..in_flight {
        let mut client = RateLimitServiceClient::new(channel.clone());
        let bearer = bearer.clone();
        tasks.push(tokio::spawn(async move {
            // xorshift: a tenant per call, spread evenly, without a dependency.
            let mut state = 0x9E37_79B9_7F4A_7C15_u64 ^ (worker as u64 + 1);
            let (mut latencies, mut over, mut failed) = (Vec::new(), 0u64, 0u64);
            while Instant::now() < until {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let tenant = tenants.map_or_else(|| "hot".to_owned(), |count| format!("t{}", state % count));
                let descriptor = RateLimitDescriptor {
                    entries: vec![
                        Entry { key: "api".into(), value: "GET /v1/users".into() },
                        Entry { key: "tenant".into(), value: tenant },
                    ],
                    ..RateLimitDescriptor::default()
                };
                let mut request = tonic::Request::new(RateLimitRequest {
                    domain: "bench".into(),
                    descriptors: vec![descriptor],
                    hits_addend: 1,
                });
                request.metadata_mut().insert("authorization", bearer.clone());
                let started = Instant::now();
                match client.should_rate_limit(request).await {
                    Ok(response) => {
                        latencies.push(started.elapsed().as_micros() as u64);
                        if response.into_inner().overall_code == Code::OverLimit as i32 {
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
    Ok(())
}
