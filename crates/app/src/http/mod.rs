//! The HTTP API: routes, the state they share, and the deadline every database call gets.
//!
//! Handlers translate: JSON and paths in, context service calls, context errors out as
//! [`ApiError`]s. They hold no database handle of their own beyond the readiness probe's.

mod auth;
pub mod bodies;
mod deadline;
mod decide;
mod error;
pub mod grpc;
mod node;
mod operator;
mod overview;
pub mod probes;
pub mod rate_limit_headers;
mod rule_routes;
pub mod server;
pub mod throttle;
pub mod ui;

use std::cell::Cell;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{DefaultBodyLimit, FromRequestParts, MatchedPath, Path, Request, State};
use axum::http::request::Parts;
use axum::http::HeaderName;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, patch, post, put};
use axum::Router;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::{DefaultOnResponse, TraceLayer};

use crate::credentials::CredentialCache;
pub use auth::{DecideTokens, OperatorTokens};
pub use error::{cause_chain, error_response, panic_response, ApiError};

use crate::budgets::RuleBudgets;
use crate::metrics::Metrics;
use ratebudget::ClockStatus;

/// The largest JSON body an operator route reads: a 64 KiB secret, JSON-escaped, fits.
const OPERATOR_BODY_LIMIT: usize = 512 * 1024;

/// The header of every response that carries a token or a secret value: no cache, shared or
/// private, may keep a copy (RFC 9111, section 5.2.2.5).
const NO_STORE: [(HeaderName, &str); 1] = [(axum::http::header::CACHE_CONTROL, "no-store")];

/// What every handler can reach; cheap to clone (one reference count: axum clones the state
/// for every extractor and middleware of every request, and cloning each service's handles
/// was most of a request's CPU, BENCHMARKS.md section 8).
#[derive(Clone)]
pub struct AppState(Arc<Handles>);

impl AppState {
    /// The state of `handles`.
    pub fn new(handles: Handles) -> AppState {
        AppState(Arc::new(handles))
    }
}

impl std::ops::Deref for AppState {
    type Target = Handles;

    fn deref(&self) -> &Handles {
        &self.0
    }
}

/// What [`AppState`] shares.
pub struct Handles {
    /// Domains, enrolment and Node credentials.
    pub access: access::AccessService,
    /// Secrets per Domain.
    pub secrets: secrets::SecretsService,
    /// Telemetry batches.
    pub ingest: ingest::IngestService,
    /// The rate budgets, for operators reading and resetting buckets.
    pub budgets: ratebudget::Store,
    /// This replica's pre-check and fallback in front of the store: a reset made here forgets
    /// the bucket at once (the others hear of it by notification).
    pub guard: Arc<ratebudget::Guard>,
    /// The operator routes' tokens, by operator.
    pub operator_tokens: OperatorTokens,
    /// The tokens of callers that ask for decisions (empty: the decide API is off).
    pub decide_tokens: DecideTokens,
    /// Decisions for other services.
    pub decide: crate::decide::DecideService,
    /// Failed authentications per client address, across replicas.
    pub throttle: throttle::AuthThrottle,
    /// Where every operator action is recorded.
    pub audit: Arc<dyn audit::AuditLog>,
    /// Recently authenticated Node tokens.
    pub credentials: CredentialCache,
    /// What `/readyz` answers, from a recent probe of the database.
    pub readiness: probes::Readiness,
    /// The longest any request waits for the database.
    pub database_timeout: Duration,
    /// The largest telemetry batch accepted.
    pub ingest_max_batch_bytes: usize,
    /// This process's metrics.
    pub metrics: Metrics,
    /// How long a request's whole body may take to arrive.
    pub body_timeout: Duration,
    /// The deadline of a whole request.
    pub request_timeout: Duration,
    /// Whether this replica's clock may be decided with; `/readyz` fails while it may not.
    pub clock: ClockStatus,
    /// The clock decisions are made on (usage minutes are counted on it).
    pub decision_clock: std::sync::Arc<dyn ratebudget::Clock>,
    /// Rate-budget rules, their history and usage.
    pub rules: rules::RulesService,
    /// What every take is sized by on this replica: rules, tiers and knob defaults. A change
    /// made through this replica reloads it before the response.
    pub rule_budgets: std::sync::Arc<RuleBudgets>,
    /// The levels this replica's decisions left in each bucket lately, for `/v1/fill`.
    pub fill: crate::fill::FillHistory,
    /// Who holds the leader lock, for `/v1/status`.
    pub leader: crate::leader::LeaderLookup,
}

tokio::task_local! {
    /// What is left of the current request's database time (see [`AppState::bounded`]).
    static DATABASE_TIME_LEFT: Cell<Duration>;
}

impl AppState {
    /// Runs a call that may wait on the database, answering 500 when the request's database
    /// time runs out.
    ///
    /// Every request gets `PLEXSPHERE_DATABASE_TIMEOUT_MS` of database time in all, shared by
    /// its calls (authenticating a Node, then reading a secret, say), so no request waits for
    /// the database longer than that. Time spent receiving a body does not count. The pool's
    /// acquire timeout bounds waiting for a connection; this bounds everything after it too,
    /// such as a statement stuck behind a lock or a network that went silent.
    pub async fn bounded<T>(
        &self,
        during: &'static str,
        call: impl Future<Output = T>,
    ) -> Result<T, ApiError> {
        let left = DATABASE_TIME_LEFT.try_with(Cell::get).unwrap_or(self.database_timeout);
        let started = Instant::now();
        let outcome = tokio::time::timeout(left, call).await;
        let _ = DATABASE_TIME_LEFT.try_with(|time| time.set(left.saturating_sub(started.elapsed())));
        outcome.map_err(|_| ApiError::DatabaseTimeout { during, after: self.database_timeout })
    }
}

impl AppState {
    /// Reloads this replica's rules after a change made through it, so the change governs
    /// its next decision here. A failure is logged, not answered: the change is made, and the
    /// listener or the poll brings it in.
    async fn reload_rules(&self) {
        match self.bounded("reloading the rules", self.rule_budgets.reload_rules(&self.rules)).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                tracing::warn!(error = %cause_chain(&error), "cannot reload the rules after a change; the listener will")
            }
            Err(_) => tracing::warn!("the rules did not reload in time after a change; the listener will"),
        }
    }

    /// Reloads this replica's tier directory after a change made through it, as
    /// [`AppState::reload_rules`] does the rules.
    async fn reload_tiers(&self) {
        match self.bounded("reloading the tiers", self.rule_budgets.reload_tiers(&self.access)).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                tracing::warn!(error = %cause_chain(&error), "cannot reload the tiers after a change; the listener will")
            }
            Err(_) => tracing::warn!("the tiers did not reload in time after a change; the listener will"),
        }
    }
}

/// What every request passes through, outermost first: the whole request's deadline
/// (`PLEXSPHERE_HTTP_REQUEST_TIMEOUT_MS`), its body's (`PLEXSPHERE_HTTP_BODY_TIMEOUT_MS`), the
/// `RateLimit` fields of its decisions, its own database time (which [`AppState::bounded`]
/// spends), and the refusal of a doubled header.
///
/// One middleware, not one each: for every request each of axum's `from_fn` layers clones the
/// chain of boxed services inside it, and the five layers these were cost a decision through
/// `POST /v1/decide` a fifth to a quarter of its throughput (BENCHMARKS.md section 8).
async fn every_request(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let request = deadline::limit_body(state.body_timeout, request);
    let answer =
        rate_limit_headers::with_fields(DATABASE_TIME_LEFT.scope(Cell::new(state.database_timeout), async {
            match doubled_header(&request) {
                Some(refusal) => refusal,
                None => next.run(request).await,
            }
        }));
    deadline::answer_within(state.request_timeout, answer).await
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
        .route("/v1/decide", post(decide::decide))
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

/// A path's parameters, with a JSON 400 (instead of axum's plain-text rejection) when they do
/// not decode, such as a segment that is not valid percent-encoded UTF-8.
pub(super) struct PathParams<T>(pub(super) T);

impl<T, S> FromRequestParts<S> for PathParams<T>
where
    T: serde::de::DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(params)) => Ok(PathParams(params)),
            Err(rejection) => {
                Err(ApiError::bad_request(format!("unreadable path: {}", rejection.body_text())))
            }
        }
    }
}

/// Parses a uuid from a path segment, or answers 400 naming the segment.
fn parse_uuid(segment: &str, what: &str) -> Result<uuid::Uuid, ApiError> {
    uuid::Uuid::parse_str(segment)
        .map_err(|_| ApiError::bad_request(format!("{what} is not a uuid: {segment:?}")))
}

/// The body as received, or 413 for one over `limit` and 400 for one that could not be read.
fn read_body(
    body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
    limit: usize,
) -> Result<axum::body::Bytes, ApiError> {
    body.map_err(|rejection| {
        if let Some(after) = deadline::body_deadline_in(&rejection) {
            ApiError::BodyTimeout { after }
        } else if rejection.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::PayloadTooLarge { code: "payload_too_large", limit: limit as u64 }
        } else {
            ApiError::bad_request(format!("unreadable body: {rejection}"))
        }
    })
}
