//! The floor under bench/decide.sh's gRPC rows: Envoy's `ShouldRateLimit` served by the same
//! stack as `plexsphere serve` (tonic on a multi-threaded runtime, mimalloc, `TCP_NODELAY`),
//! answering every call with a fixed response of the service's shape and deciding nothing.
//! What it serves a second through the same load generator is the most any decision path
//! could reach on this machine, wherever its decisions come from.
//!
//! ```sh
//! cargo run --release -p app --example grpc_floor -- 127.0.0.1:18082
//! ```

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    rate_limit::Unit, Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::{Request, Response, Status};

/// Answers every call with `response`.
struct Fixed {
    response: RateLimitResponse,
}

#[tonic::async_trait]
impl RateLimitService for Fixed {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        // Read the message as the service does, then answer without deciding.
        let _descriptors = request.into_inner().descriptors.len();
        Ok(Response::new(self.response.clone()))
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let address = std::env::args().nth(1).ok_or("usage: grpc_floor <address>")?;
    // What the service answers a granted call of bench/decide.sh's rule.
    let response = RateLimitResponse {
        overall_code: Code::Ok as i32,
        statuses: vec![DescriptorStatus {
            code: Code::Ok as i32,
            current_limit: Some(RateLimit {
                name: "bench-per-tenant".into(),
                requests_per_unit: 1_000_000_000,
                unit: Unit::Second as i32,
            }),
            limit_remaining: 999_999_999,
            duration_until_reset: Some(envoy_types::pb::google::protobuf::Duration { seconds: 0, nanos: 1 }),
            quota: None,
        }],
        response_headers_to_add: vec![
            HeaderValue {
                key: "ratelimit-policy".into(),
                value: "\"bench-per-tenant\";q=1000000000;w=1".into(),
                raw_value: Vec::new(),
            },
            HeaderValue {
                key: "ratelimit".into(),
                value: "\"bench-per-tenant\";r=999999999;t=0".into(),
                raw_value: Vec::new(),
            },
        ],
        ..RateLimitResponse::default()
    };
    use tokio_stream::StreamExt as _;
    let listener = tokio::net::TcpListener::bind(address.as_str()).await?;
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener).map(|stream| {
        let stream = stream?;
        stream.set_nodelay(true)?;
        Ok::<_, std::io::Error>(stream)
    });
    tonic::transport::Server::builder()
        .add_service(RateLimitServiceServer::new(Fixed { response }))
        .serve_with_incoming(incoming)
        .await?;
    Ok(())
}
