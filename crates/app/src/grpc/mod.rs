//! Envoy's rate limit service protocol (`envoy.service.ratelimit.v3.RateLimitService`,
//! `ShouldRateLimit`) on `PLEXSPHERE_GRPC_LISTEN`: what Envoy, Istio, Contour, Emissary and
//! Gloo call from their `ratelimit` filters. The same decisions as `POST /v1/decide`
//! ([`service::decide`]): this module only maps Envoy's messages in and the answer out. The
//! messages and the server trait are the `envoy-types` crate's, generated from Envoy's own
//! protos.
//!
//! A caller sends a decide token as `authorization: Bearer <token>` metadata (Envoy's
//! `grpc_service.initial_metadata`); without a valid one the call is `UNAUTHENTICATED`, and
//! counts as a failed authentication of its peer address (the HTTP API's throttle, shared by
//! every replica), which once spent answers `RESOURCE_EXHAUSTED`. A valid token is looked at
//! first and never refused for its address's failures: behind a load balancer or SNAT every
//! Envoy shares one address, and one stray caller with a wrong token must not lock them out.
//! A service the token does not name is `PERMISSION_DENIED`. A request that cannot be decided
//! (a CLOSED rule whose store cannot answer) is `UNAVAILABLE`, so Envoy's `failure_mode_deny`
//! decides; one malformed as a message (no domain, a descriptor without entries) is
//! `INVALID_ARGUMENT`.

use std::net::SocketAddr;

use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use crate::edge::database_time::DatabaseTime;
use crate::edge::throttle::AuthThrottle;
use crate::edge::tokens::{bearer_token, DecideTokens};
use rules::Services;
use service::decide::{self, Code, DecideError, DecideService, Unit};

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    rate_limit, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{
    rate_limit_response, RateLimitRequest, RateLimitResponse,
};

pub mod quota;

/// Who may call either protocol: a decide token, the failures of callers without one counted.
#[derive(Clone)]
pub struct Callers {
    tokens: DecideTokens,
    throttle: AuthThrottle,
}

impl Callers {
    /// The callers `tokens` names, counting failures in `throttle`.
    pub fn new(tokens: DecideTokens, throttle: AuthThrottle) -> Callers {
        Callers { tokens, throttle }
    }

    /// The services the caller may ask for, or the status that refuses the call. Only a call
    /// without a valid token meets its address's failure budget.
    pub async fn authenticate<T>(&self, request: &Request<T>) -> Result<Services, Status> {
        let presented = request
            .metadata()
            .get("authorization")
            .and_then(|value| value.to_str().ok())
            .and_then(bearer_token);
        if let Some((_, services)) = presented.and_then(|token| self.tokens.find(token)) {
            return Ok(services);
        }
        let exhausted = || Status::resource_exhausted("too many failed authentications from this address");
        if let Some(peer) = request.remote_addr().map(|address| address.ip()) {
            // A spent address is refused without spending a statement on it.
            if self.throttle.known_spent(peer) {
                tracing::debug!(%peer, "gRPC call refused: its address's failed authentications are spent");
                return Err(exhausted());
            }
            if self.throttle.count_failure(peer).await {
                return Err(exhausted());
            }
        }
        Err(Status::unauthenticated("a decide token is required: authorization: Bearer <token>"))
    }
}

/// The gRPC service: decisions for callers with a decide token.
pub struct RateLimitServer {
    decide: DecideService,
    callers: Callers,
    /// A call's database time, as for the HTTP API.
    database_time: DatabaseTime,
}

impl RateLimitServer {
    /// Decides with `decide` for `callers`.
    pub fn new(decide: DecideService, callers: Callers, database_time: DatabaseTime) -> RateLimitServer {
        RateLimitServer { decide, callers, database_time }
    }
}

fn unit(unit: Unit) -> rate_limit::Unit {
    match unit {
        Unit::Second => rate_limit::Unit::Second,
        Unit::Minute => rate_limit::Unit::Minute,
        Unit::Hour => rate_limit::Unit::Hour,
        Unit::Day => rate_limit::Unit::Day,
        Unit::Week => rate_limit::Unit::Week,
        Unit::Month => rate_limit::Unit::Month,
        Unit::Year => rate_limit::Unit::Year,
    }
}

fn code(code: Code) -> rate_limit_response::Code {
    match code {
        Code::Ok => rate_limit_response::Code::Ok,
        Code::OverLimit => rate_limit_response::Code::OverLimit,
    }
}

/// The request as [`service::decide`] takes it. `hits_addend` of 0 means 1; a descriptor's own
/// `hits_addend` replaces the request's, and its explicit 0 (the wrapper present, holding 0)
/// checks without spending; a descriptor's `limit` override (which Envoy's route
/// configuration sets, never its client) is the limit of a bucket of its own.
fn request_of(message: RateLimitRequest) -> decide::Request {
    decide::Request {
        service: message.domain,
        descriptors: message
            .descriptors
            .into_iter()
            .map(|descriptor| decide::Descriptor {
                entries: descriptor
                    .entries
                    .into_iter()
                    .map(|entry| decide::Entry { key: entry.key, value: entry.value })
                    .collect(),
                // A descriptor's `is_negative_hits` asks to give tokens back: a caller may never
                // refill a bucket, so it is not read.
                hits_addend: descriptor.hits_addend.map(|hits| hits.value),
                limit: descriptor.limit.and_then(|limit| {
                    // Envoy's RateLimitUnit by number (WEEK, 7, came after envoy-types' copy of
                    // the enum); an unknown unit is no override: the rules decide.
                    let unit = match limit.unit {
                        1 => Unit::Second,
                        2 => Unit::Minute,
                        3 => Unit::Hour,
                        4 => Unit::Day,
                        5 => Unit::Month,
                        6 => Unit::Year,
                        7 => Unit::Week,
                        _ => return None,
                    };
                    Some(decide::Override { requests_per_unit: limit.requests_per_unit, unit })
                }),
            })
            .collect(),
        hits_addend: u64::from(message.hits_addend),
    }
}

fn response_of(answer: decide::Answer) -> RateLimitResponse {
    RateLimitResponse {
        overall_code: code(answer.overall) as i32,
        statuses: answer
            .statuses
            .iter()
            .map(|status| DescriptorStatus {
                code: code(status.code) as i32,
                current_limit: status.current_limit.as_ref().map(|limit| RateLimit {
                    name: limit.rule_id.clone(),
                    requests_per_unit: limit.requests_per_unit,
                    unit: unit(limit.unit) as i32,
                }),
                limit_remaining: status.limit_remaining.unwrap_or(0),
                duration_until_reset: status.until_reset.map(|until| {
                    envoy_types::pb::google::protobuf::Duration {
                        seconds: i64::try_from(until.as_secs()).unwrap_or(i64::MAX),
                        nanos: i32::try_from(until.subsec_nanos()).unwrap_or(0),
                    }
                }),
                quota: None,
            })
            .collect(),
        response_headers_to_add: answer
            .headers
            .into_iter()
            .map(|(key, value)| HeaderValue { key: key.to_owned(), value, raw_value: Vec::new() })
            .collect(),
        ..RateLimitResponse::default()
    }
}

#[tonic::async_trait]
impl RateLimitService for RateLimitServer {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let services = self.callers.authenticate(&request).await?;
        let request = request_of(request.into_inner());
        let deciding = self.database_time.bounded("deciding", self.decide.decide(&services, &request));
        let decided = self.database_time.scope(deciding).await;
        match decided {
            Ok(Ok(answer)) => Ok(Response::new(response_of(answer))),
            Ok(Err(invalid @ DecideError::Invalid { .. })) => {
                Err(Status::invalid_argument(invalid.to_string()))
            }
            Ok(Err(forbidden @ DecideError::Forbidden { .. })) => {
                Err(Status::permission_denied(forbidden.to_string()))
            }
            Ok(Err(undecided)) => {
                tracing::error!(error = %ratebudget::cause_chain(&undecided), "a ShouldRateLimit call could not be decided");
                Err(Status::unavailable("the rate limit could not be decided"))
            }
            Err(out_of_time) => {
                tracing::error!(after = ?out_of_time.after, "a ShouldRateLimit call was not decided in time");
                Err(Status::unavailable("the rate limit could not be decided in time"))
            }
        }
    }
}

/// Serves `server` and `quota` on `listener` until `shutdown`, then lets calls in flight finish
/// (each quota stream says goodbye and ends on `shutdown` too).
pub async fn serve(
    listener: tokio::net::TcpListener,
    server: RateLimitServer,
    quota: quota::QuotaServer,
    shutdown: CancellationToken,
) {
    use tokio_stream::StreamExt as _;
    // Answers leave at once: with Nagle's algorithm a small response waits for the client's
    // delayed ACK (40 ms), which was the p99 of every call under load.
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener).map(|stream| {
        let stream = stream?;
        stream.set_nodelay(true)?;
        Ok::<_, std::io::Error>(stream)
    });
    let served = tonic::transport::Server::builder()
        .add_service(RateLimitServiceServer::new(server))
        .add_service(quota::RateLimitQuotaServiceServer::new(quota))
        .serve_with_incoming_shutdown(incoming, shutdown.cancelled_owned())
        .await;
    if let Err(error) = served {
        tracing::error!(error = %ratebudget::cause_chain(&error), "the gRPC server stopped");
    }
}

/// Binds `address` for [`serve`].
///
/// # Errors
/// When it cannot be bound.
pub async fn bind(address: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(address).await
}
