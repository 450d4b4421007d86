//! The HTTP API: routes, the state they share, and the deadline every database call gets.
//!
//! Handlers translate: JSON and paths in, context service calls, context errors out as
//! [`ApiError`]s. They hold no database handle of their own beyond the readiness probe's.

mod auth;
pub mod bodies;
mod deadline;
mod decide;
mod error;
mod extract;
mod fields;
mod node;
mod operator;
mod overview;
pub mod probes;
mod quota_routes;
pub mod rate_limit_headers;
mod rule_routes;
pub mod server;
mod state;
pub mod ui;

use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::HeaderName;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, patch, post, put};
use axum::Router;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::{DefaultOnResponse, TraceLayer};

pub use error::{error_response, panic_response, ApiError};
use extract::OPERATOR_BODY_LIMIT;
pub use state::{AppState, Handles};

/// What every request passes through, outermost first: the whole request's deadline
/// (`PLEXSPHERE_HTTP_REQUEST_TIMEOUT_MS`), its body's (`PLEXSPHERE_HTTP_BODY_TIMEOUT_MS`), the
/// `RateLimit` fields of its decisions, its own database time (which [`AppState::bounded`]
/// spends, `crate::edge::database_time`), and the refusal of a doubled header.
///
/// One middleware, not one each: for every request each of axum's `from_fn` layers clones the
/// chain of boxed services inside it, and the five layers these were cost a decision through
/// `POST /v1/decide` a fifth to a quarter of its throughput (BENCHMARKS.md section 8).
async fn every_request(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let request = deadline::limit_body(state.http.body_timeout, request);
    let answer = rate_limit_headers::with_fields(state.database_time.scope(async {
        match doubled_header(&request) {
            Some(refusal) => refusal,
            None => next.run(request).await,
        }
    }));
    deadline::answer_within(state.http.request_timeout, answer).await
}

/// The request id header: taken from the client when it sends one, made up otherwise, and
/// echoed in the response so a client can quote it.
const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The span every request runs in. Every log line of a request carries its fields: the route
/// (the pattern, not the path, so ids and secret names stay out of it), the request id, and
/// the operator's name or the Node and Domain once the caller is authenticated.
fn request_span(request: &Request) -> tracing::Span {
    let route = request.extensions().get::<MatchedPath>().map_or("<no route>", MatchedPath::as_str);
    let request_id = request.headers().get(&REQUEST_ID).and_then(|id| id.to_str().ok()).unwrap_or_default();
    tracing::info_span!(
        "request",
        method = %request.method(),
        route,
        request_id,
        operator = tracing::field::Empty,
        node_id = tracing::field::Empty,
        domain_id = tracing::field::Empty,
    )
}

/// Every route of the API.
pub fn router(state: AppState) -> Router {
    let max_batch = state.ingest_max_batch_bytes;
    Router::new()
        .route("/v1/domains", post(operator::create_domain))
        .route("/v1/domains/{domain_id}", patch(operator::patch_domain))
        .route("/v1/domains/{domain_id}/limits", get(operator::domain_limits))
        .route("/v1/domains/{domain_id}/nodes", post(operator::enrol_node))
        .route("/v1/domains/{domain_id}/nodes/{node_id}", delete(operator::revoke_node))
        .route("/v1/domains/{domain_id}/secrets/{name}", put(operator::put_secret))
        .route("/v1/budgets/{key}", get(operator::show_budgets))
        .route("/v1/budgets/{scope}/{key}", delete(operator::reset_budget))
        .route("/v1/audit", get(operator::read_audit))
        .route("/v1/rules", get(rule_routes::list_rules))
        .route(
            "/v1/rules/{rule_id}",
            put(rule_routes::put_rule).get(rule_routes::get_rule).delete(rule_routes::delete_rule),
        )
        .route("/v1/rules/{rule_id}/history", get(rule_routes::rule_history))
        .route("/v1/rules/{rule_id}/rollback", post(rule_routes::rollback_rule))
        .route("/v1/rules/{rule_id}/usage", get(rule_routes::rule_usage))
        .route("/v1/status", get(overview::status))
        .route("/v1/fill/{key}", get(overview::fill))
        .route("/v1/quota/buckets", get(quota_routes::buckets))
        .route("/v1/decide", post(decide::decide))
        .route("/v1/decide/reset", post(decide::reset))
        .route("/v1/snapshot", get(decide::snapshot))
        .layer(DefaultBodyLimit::max(OPERATOR_BODY_LIMIT))
        .route("/v1/secrets/{name}", get(node::read_secret))
        .route("/v1/ingest", post(node::ingest).layer(DefaultBodyLimit::max(max_batch)))
        // Every route so far authenticates its caller: each 401 spends from the client
        // address's failure budget (throttle.rs). The probes below, unknown routes and wrong
        // methods never do, and are never refused for an address's failures.
        .route_layer(state.throttle.layer({
            let state = state.clone();
            move |parts| auth::vouched_for(&state, parts)
        }))
        .route("/healthz", get(probes::healthz))
        .route("/readyz", get(probes::readyz))
        .route("/metrics", get(probes::metrics))
        .route("/ui", get(ui::page))
        .route("/ui/app.js", get(ui::script))
        .route("/ui/app.css", get(ui::style))
        .fallback(probes::not_found)
        .method_not_allowed_fallback(probes::method_not_allowed)
        // Inside the trace layer, so a request cut off by its deadline, and a panic, are
        // logged in the request's span.
        .layer(axum::middleware::from_fn_with_state(state.clone(), every_request))
        .layer(CatchPanicLayer::custom(panic_response))
        // A failure is logged once, where it becomes a response (error.rs), so the trace
        // layer only opens the span and logs each response at debug level.
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(request_span)
                .on_request(())
                .on_response(DefaultOnResponse::new().level(tracing::Level::DEBUG))
                .on_failure(()),
        )
        .layer(PropagateRequestIdLayer::new(REQUEST_ID))
        .layer(SetRequestIdLayer::new(REQUEST_ID, MakeRequestUuid))
        .with_state(state)
}

/// Headers a request may carry at most once: two `Authorization` headers make it ambiguous who
/// is calling (one proxy may check the first, another the second), and two request ids make it
/// ambiguous which one the log and the client quote. Either is a 400 before any handler runs.
const SINGLE_HEADERS: [HeaderName; 2] = [axum::http::header::AUTHORIZATION, REQUEST_ID];

fn doubled_header(request: &Request) -> Option<Response> {
    SINGLE_HEADERS.iter().find(|name| request.headers().get_all(*name).iter().nth(1).is_some()).map(|name| {
        ApiError::bad_request(format!("the {name} header must appear at most once")).into_response()
    })
}
