//! The tower layer in front of an axum service, driven through `tower::ServiceExt::oneshot`
//! against a real PostgreSQL: what reaches the service, what the client is told, and what a
//! store that cannot answer does.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{HeaderMap, HeaderName, Request, StatusCode};
use axum::routing::any;
use axum::Router;
use ratebudget::{
    Clock, Enforcement, FailMode, FixedBudgets, Guard, Limit, LimiterName, ManualClock, Policy, Scope,
    Spender, Store,
};
use ratebudget_tower::{
    cost_fn, key_fn, BodyLength, BudgetLayer, EachRequest, HeaderKey, NamedBudget, PeerAddress, RequestKey,
    ScopeBudget,
};
use sqlx::PgPool;
use tower::ServiceExt as _;

use crate::support::helpers::{instant, unreachable_pool};

const API_KEY: HeaderName = HeaderName::from_static("x-api-key");

/// The limiters, a clock the test moves, and how often the service was called.
struct Fixture {
    guard: Arc<Guard>,
    clock: Arc<ManualClock>,
    calls: Arc<AtomicUsize>,
}

impl Fixture {
    fn new(pool: &PgPool) -> Fixture {
        let guard = Guard::builder(Store::new(pool.clone()))
            .decision_timeout(Duration::from_secs(10))
            .capacity(1_000)
            .build();
        Fixture {
            guard: Arc::new(guard),
            clock: Arc::new(ManualClock::new(instant())),
            calls: Arc::default(),
        }
    }

    /// The named limiter `tower_test` at `per_second`, `burst`.
    fn budget(&self, per_second: f64, burst: f64) -> NamedBudget {
        let limiter = LimiterName::new("tower_test").unwrap();
        let clock: Arc<dyn Clock> = self.clock.clone();
        NamedBudget::new(limiter, Limit::new(per_second, burst).unwrap(), self.guard.clone(), clock)
    }

    /// A service that counts its calls and answers 200 `ok`, or 401 to a request whose
    /// `authorization` is not `good` when `checks_credentials`.
    fn service(&self, checks_credentials: bool) -> Router {
        let calls = self.calls.clone();
        Router::new().route(
            "/{*path}",
            any(move |headers: HeaderMap| async move {
                calls.fetch_add(1, Ordering::SeqCst);
                let good = headers.get("authorization").is_some_and(|value| value == "good");
                if checks_credentials && !good {
                    (StatusCode::UNAUTHORIZED, "who are you")
                } else {
                    (StatusCode::OK, "ok")
                }
            }),
        )
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

/// What a client got.
#[derive(Debug)]
struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|value| value.to_str().unwrap())
    }

    fn code(&self) -> String {
        let json: serde_json::Value = serde_json::from_str(&self.body).unwrap();
        json["code"].as_str().unwrap().to_owned()
    }
}

async fn send(app: &Router, request: Request<Body>) -> Answer {
    let response = app.clone().oneshot(request).await.unwrap();
    let (parts, body) = response.into_parts();
    let body = axum::body::to_bytes(body, 1 << 20).await.unwrap();
    Answer { status: parts.status, headers: parts.headers, body: String::from_utf8(body.to_vec()).unwrap() }
}

/// A GET with `x-api-key: key`.
fn keyed(key: &str) -> Request<Body> {
    Request::get("/things").header(API_KEY, key).body(Body::empty()).unwrap()
}

/// A request from `peer`, as the server's accept loop would record it.
fn from_peer(peer: &str, authorization: &str) -> Request<Body> {
    let mut request =
        Request::get("/v1/things").header("authorization", authorization).body(Body::empty()).unwrap();
    request.extensions_mut().insert(ConnectInfo(SocketAddr::new(peer.parse().unwrap(), 40_000)));
    request
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_granted_request_reaches_the_service_and_reports_its_budget(pool: PgPool) {
    let fixture = Fixture::new(&pool);
    let app = fixture.service(false).layer(BudgetLayer::new(
        fixture.budget(1.0, 3.0),
        HeaderKey::new(API_KEY),
        EachRequest,
    ));

    let answer = send(&app, keyed("alice")).await;
    assert_eq!((answer.status, answer.body.as_str()), (StatusCode::OK, "ok"));
    assert_eq!(answer.header("ratelimit-policy"), Some("\"tower_test\";q=3;w=3"));
    // Two cells left; full again in one second.
    assert_eq!(answer.header("ratelimit"), Some("\"tower_test\";r=2;t=1"));
    assert_eq!(answer.header("retry-after"), None);
    assert_eq!(fixture.calls(), 1);
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_refusal_is_a_429_with_retry_after_and_the_fields_and_never_reaches_the_service(pool: PgPool) {
    let fixture = Fixture::new(&pool);
    let app = fixture.service(false).layer(BudgetLayer::new(
        fixture.budget(0.5, 2.0),
        HeaderKey::new(API_KEY),
        EachRequest,
    ));
    for _ in 0..2 {
        assert_eq!(send(&app, keyed("alice")).await.status, StatusCode::OK);
    }

    let refused = send(&app, keyed("alice")).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.code(), "rate_limited");
    // One cell every two seconds; the bucket is full again in four.
    assert_eq!(refused.header("retry-after"), Some("2"));
    assert_eq!(refused.header("ratelimit"), Some("\"tower_test\";r=0;t=4"));
    assert_eq!(refused.header("ratelimit-policy"), Some("\"tower_test\";q=2;w=4"));
    assert_eq!(fixture.calls(), 2, "a refused request never reaches the service");

    // Exactly when Retry-After said, it is admitted again.
    fixture.clock.advance(chrono::Duration::seconds(2));
    assert_eq!(send(&app, keyed("alice")).await.status, StatusCode::OK);
    assert_eq!(fixture.calls(), 3);
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn keys_spend_budgets_of_their_own(pool: PgPool) {
    let fixture = Fixture::new(&pool);
    let by_header = fixture.service(false).layer(BudgetLayer::new(
        fixture.budget(0.1, 1.0),
        HeaderKey::new(API_KEY),
        EachRequest,
    ));
    assert_eq!(send(&by_header, keyed("alice")).await.status, StatusCode::OK);
    assert_eq!(send(&by_header, keyed("alice")).await.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(send(&by_header, keyed("bob")).await.status, StatusCode::OK);

    // By address: a second address is untouched, and an IPv6 client's whole /64 is one key.
    let by_address = fixture.service(false).layer(BudgetLayer::new(
        fixture.budget(0.1, 1.0),
        PeerAddress::direct(),
        EachRequest,
    ));
    assert_eq!(send(&by_address, from_peer("198.51.100.7", "")).await.status, StatusCode::OK);
    assert_eq!(send(&by_address, from_peer("198.51.100.7", "")).await.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(send(&by_address, from_peer("198.51.100.8", "")).await.status, StatusCode::OK);
    assert_eq!(send(&by_address, from_peer("2001:db8::1", "")).await.status, StatusCode::OK);
    assert_eq!(send(&by_address, from_peer("2001:db8::2", "")).await.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(fixture.calls(), 5);
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn the_body_length_is_the_cost(pool: PgPool) {
    let fixture = Fixture::new(&pool);
    // 100 bytes of burst, 10 a second.
    let app = fixture.service(false).layer(BudgetLayer::new(
        fixture.budget(10.0, 100.0),
        HeaderKey::new(API_KEY),
        BodyLength,
    ));
    let upload = |bytes: usize| {
        Request::post("/upload").header(API_KEY, "alice").body(Body::from(vec![b'x'; bytes])).unwrap()
    };

    let first = send(&app, upload(60)).await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(first.header("ratelimit"), Some("\"tower_test\";r=40;t=6"));
    // 40 left: 60 more need 20 more bytes of refill, two seconds.
    let refused = send(&app, upload(60)).await;
    assert_eq!((refused.status, refused.header("retry-after")), (StatusCode::TOO_MANY_REQUESTS, Some("2")));
    assert_eq!(send(&app, upload(30)).await.status, StatusCode::OK);
    // More than the burst is never admitted: not "later", but too large.
    let too_large = send(&app, upload(101)).await;
    assert_eq!(
        (too_large.status, too_large.code().as_str()),
        (StatusCode::PAYLOAD_TOO_LARGE, "cost_above_burst")
    );

    // A body whose length is not known in advance is not read to price it.
    let chunks = futures::stream::iter([Ok::<_, std::io::Error>(axum::body::Bytes::from_static(b"abc"))]);
    let streamed = Request::post("/upload").header(API_KEY, "alice").body(Body::from_stream(chunks)).unwrap();
    let unpriced = send(&app, streamed).await;
    assert_eq!((unpriced.status, unpriced.code().as_str()), (StatusCode::LENGTH_REQUIRED, "length_required"));
    assert_eq!(fixture.calls(), 2);
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_missing_key_is_a_400_unless_a_fallback_key_spends_for_it(pool: PgPool) {
    let fixture = Fixture::new(&pool);
    let strict = fixture.service(false).layer(BudgetLayer::new(
        fixture.budget(0.1, 1.0),
        HeaderKey::new(API_KEY),
        EachRequest,
    ));
    let anonymous = || Request::get("/things").body(Body::empty()).unwrap();
    let missing = send(&strict, anonymous()).await;
    assert_eq!((missing.status, missing.code().as_str()), (StatusCode::BAD_REQUEST, "missing_key"));
    assert_eq!(fixture.calls(), 0);

    // Every request without the header shares the fallback key's budget.
    let lenient = fixture.service(false).layer(BudgetLayer::new(
        fixture.budget(0.1, 1.0),
        HeaderKey::new(API_KEY).or_fallback("anonymous"),
        EachRequest,
    ));
    assert_eq!(send(&lenient, anonymous()).await.status, StatusCode::OK);
    assert_eq!(send(&lenient, anonymous()).await.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(send(&lenient, keyed("alice")).await.status, StatusCode::OK);
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn closures_key_and_price_requests_and_may_leave_one_unlimited(pool: PgPool) {
    let fixture = Fixture::new(&pool);
    // Keyed by the first path segment, /public unlimited; a request costs 2, or 5 when
    // it says it is expensive.
    let key = key_fn(|request| {
        let segment = request.uri.path().trim_start_matches('/').split('/').next().unwrap_or_default();
        Ok((segment != "public").then(|| RequestKey::from(segment)))
    });
    let cost = cost_fn(|request, _| Ok(if request.headers.contains_key("x-expensive") { 5 } else { 2 }));
    let app = fixture.service(false).layer(BudgetLayer::new(fixture.budget(1.0, 5.0), key, cost));
    let get = |path: &str| Request::get(path).body(Body::empty()).unwrap();

    assert_eq!(send(&app, get("/a/1")).await.header("ratelimit"), Some("\"tower_test\";r=3;t=2"));
    assert_eq!(send(&app, get("/a/2")).await.status, StatusCode::OK);
    assert_eq!(send(&app, get("/a/3")).await.status, StatusCode::TOO_MANY_REQUESTS);
    let expensive = Request::get("/b").header("x-expensive", "yes").body(Body::empty()).unwrap();
    assert_eq!(send(&app, expensive).await.header("ratelimit"), Some("\"tower_test\";r=0;t=5"));
    for _ in 0..10 {
        let public = send(&app, get("/public/x")).await;
        assert_eq!((public.status, public.header("ratelimit")), (StatusCode::OK, None));
    }
    assert_eq!(fixture.calls(), 13);
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_scope_budget_spends_a_domains_bucket_sized_by_its_policy(pool: PgPool) {
    let fixture = Fixture::new(&pool);
    let policy = Policy::strict(Limit::new(1.0, 2.0).unwrap());
    let budgets = FixedBudgets::new([(Scope::AccessIssuanceDomain, policy)]);
    let spender = Spender::new(fixture.guard.clone(), fixture.clock.clone(), Arc::new(budgets));
    let domain_id = HeaderName::from_static("x-domain-id");
    let app = fixture.service(false).layer(BudgetLayer::new(
        ScopeBudget::new(spender, Scope::AccessIssuanceDomain),
        HeaderKey::new(domain_id.clone()),
        EachRequest,
    ));
    let domain = uuid::Uuid::new_v4();
    let request = |key: &str| Request::post("/nodes").header(&domain_id, key).body(Body::empty()).unwrap();

    let first = send(&app, request(&domain.to_string())).await;
    assert_eq!(first.header("ratelimit-policy"), Some("\"access_issuance_domain\";q=2;w=2"));
    assert_eq!(first.header("ratelimit"), Some("\"access_issuance_domain\";r=1;t=1"));
    assert_eq!(send(&app, request(&domain.to_string())).await.status, StatusCode::OK);
    let refused = send(&app, request(&domain.to_string())).await;
    assert_eq!((refused.status, refused.header("retry-after")), (StatusCode::TOO_MANY_REQUESTS, Some("1")));
    // The Domain's own row in the shared table, as the binary's issuance would spend it.
    let buckets = Store::new(pool.clone()).buckets(domain.into()).await.unwrap();
    assert_eq!(buckets.len(), 1);
    assert_eq!((buckets[0].name.scope(), buckets[0].tokens), (Some(Scope::AccessIssuanceDomain), 0.0));

    let not_an_id = send(&app, request("acme")).await;
    assert_eq!((not_an_id.status, not_an_id.code().as_str()), (StatusCode::BAD_REQUEST, "invalid_key"));
    assert_eq!(fixture.calls(), 2);
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_store_that_cannot_answer_is_a_500_failing_closed_and_the_fail_mode_decides_otherwise(
    pool: PgPool,
) {
    let fixture = Fixture::new(&pool);
    // The limiters' store is unreachable; the fixture's pool only keeps the test's database.
    let guard = Arc::new(
        Guard::builder(Store::new(unreachable_pool()))
            .decision_timeout(Duration::from_secs(10))
            .capacity(1_000)
            .build(),
    );
    let budget = |fail_mode: FailMode, burst: f64| {
        let limiter = LimiterName::new("tower_test").unwrap();
        let clock: Arc<dyn Clock> = fixture.clock.clone();
        NamedBudget::new(limiter, Limit::new(0.1, burst).unwrap(), guard.clone(), clock)
            .with_enforcement(Enforcement { fail_mode, ..Enforcement::STRICT })
    };
    let layered = |fail_mode, burst| {
        fixture.service(false).layer(BudgetLayer::new(
            budget(fail_mode, burst),
            HeaderKey::new(API_KEY),
            EachRequest,
        ))
    };

    let closed = send(&layered(FailMode::Closed, 5.0), keyed("alice")).await;
    assert_eq!((closed.status, closed.code().as_str()), (StatusCode::INTERNAL_SERVER_ERROR, "internal"));
    assert_eq!(closed.header("retry-after"), None, "an outage is not a refusal");
    assert_eq!(fixture.calls(), 0);

    let open = send(&layered(FailMode::Open, 5.0), keyed("alice")).await;
    assert_eq!((open.status, open.header("ratelimit")), (StatusCode::OK, None));
    assert_eq!(fixture.calls(), 1);

    // Local: this replica's own bucket of the same limit decides.
    let local = layered(FailMode::Static, 1.0);
    assert_eq!(send(&local, keyed("alice")).await.status, StatusCode::OK);
    assert_eq!(send(&local, keyed("alice")).await.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(fixture.calls(), 2);

    // Charged after the response, an undecided charge leaves the service's answer as it was.
    let after = fixture.service(true).layer(
        BudgetLayer::new(budget(FailMode::Closed, 5.0), HeaderKey::new(API_KEY), EachRequest)
            .charge_only_responses([StatusCode::UNAUTHORIZED]),
    );
    assert_eq!(send(&after, keyed("alice")).await.status, StatusCode::UNAUTHORIZED);
    assert_eq!(fixture.calls(), 3);
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn charging_only_failures_refuses_a_spent_address_before_the_service_but_never_a_vouched_for_one(
    pool: PgPool,
) {
    let fixture = Fixture::new(&pool);
    let refused_keys = Arc::new(Mutex::new(Vec::new()));
    let layer = |guard: Arc<Guard>| {
        let limiter = LimiterName::new("tower_test").unwrap();
        let clock: Arc<dyn Clock> = fixture.clock.clone();
        let budget = NamedBudget::new(limiter, Limit::new(0.2, 2.0).unwrap(), guard, clock);
        let refused_keys = refused_keys.clone();
        BudgetLayer::new(budget, PeerAddress::direct(), EachRequest)
            .charge_only_responses([StatusCode::UNAUTHORIZED])
            .skip_precheck_when(|request| {
                request.headers.get("authorization").is_some_and(|value| value == "good")
            })
            .refusal("auth_rate_limited", "too many failed authentications from this address")
            .on_refusal(move |key| refused_keys.lock().unwrap().push(key.clone()))
    };
    let app = fixture.service(true).layer(layer(fixture.guard.clone()));
    let guesser = "203.0.113.9";

    // Successes are never charged.
    for _ in 0..5 {
        let good = send(&app, from_peer(guesser, "good")).await;
        assert_eq!((good.status, good.header("ratelimit")), (StatusCode::OK, None));
    }
    // Two failures spend the burst; each is still the service's own 401.
    let first = send(&app, from_peer(guesser, "bad")).await;
    assert_eq!((first.status, first.body.as_str()), (StatusCode::UNAUTHORIZED, "who are you"));
    assert_eq!(first.header("ratelimit"), Some("\"tower_test\";r=1;t=5"));
    assert_eq!(send(&app, from_peer(guesser, "bad")).await.status, StatusCode::UNAUTHORIZED);
    assert_eq!(fixture.calls(), 7);

    // The budget is known to be spent: refused before the service is called.
    let refused = send(&app, from_peer(guesser, "bad")).await;
    assert_eq!(
        (refused.status, refused.code().as_str()),
        (StatusCode::TOO_MANY_REQUESTS, "auth_rate_limited")
    );
    assert_eq!(refused.header("retry-after"), Some("5"));
    assert_eq!(fixture.calls(), 7);
    // A request vouched for still reaches the service, from the same address.
    assert_eq!(send(&app, from_peer(guesser, "good")).await.status, StatusCode::OK);
    // Another address has a budget of its own.
    assert_eq!(send(&app, from_peer("203.0.113.10", "bad")).await.status, StatusCode::UNAUTHORIZED);
    assert_eq!(fixture.calls(), 9);

    // Another replica (its own guard, the same store) knows nothing yet: the service answers,
    // the charge is refused, and the client gets the 429.
    let other_replica = Fixture::new(&pool);
    let other = fixture.service(true).layer(layer(other_replica.guard.clone()));
    let refused_late = send(&other, from_peer(guesser, "bad")).await;
    assert_eq!(refused_late.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused_late.header("retry-after"), Some("5"));
    assert_eq!(fixture.calls(), 10);
    assert_eq!(*refused_keys.lock().unwrap(), [RequestKey::from(guesser), RequestKey::from(guesser)]);
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_grpc_request_is_refused_with_a_grpc_status(pool: PgPool) {
    let fixture = Fixture::new(&pool);
    let app = fixture.service(false).layer(BudgetLayer::new(
        fixture.budget(0.1, 1.0),
        HeaderKey::new(API_KEY),
        EachRequest,
    ));
    let call = || {
        Request::post("/greeter.Greeter/SayHello")
            .header(API_KEY, "alice")
            .header("content-type", "application/grpc")
            .body(Body::empty())
            .unwrap()
    };
    assert_eq!(send(&app, call()).await.status, StatusCode::OK);

    let refused = send(&app, call()).await;
    // Trailers-only: HTTP 200, the gRPC status in the headers, no body.
    assert_eq!(refused.status, StatusCode::OK);
    assert_eq!(refused.header("grpc-status"), Some("8"), "RESOURCE_EXHAUSTED");
    assert_eq!(refused.header("content-type"), Some("application/grpc"));
    assert_eq!(refused.header("retry-after"), Some("10"));
    assert_eq!(refused.body, "");
    assert_eq!(fixture.calls(), 1);
}

#[sqlx::test(migrator = "ratebudget::MIGRATOR")]
async fn token_buckets_under_a_name_of_their_own_price_a_body_per_key_with_only_ratebudgets_tables(
    pool: PgPool,
) {
    // Issue 22: a user of the crates alone puts token buckets under a name of their own, keyed
    // by any string, in front of a route; the database holds only ratebudget's migrations.
    let fixture = Fixture::new(&pool);
    let clock: Arc<dyn Clock> = fixture.clock.clone();
    let uploads = ratebudget::TokenBuckets::new(
        ratebudget::Name::new("uploads").unwrap(),
        Limit::new(10.0, 25.0).unwrap(),
        fixture.guard.clone(),
        clock,
    );
    let app = fixture.service(false).layer(BudgetLayer::new(
        ratebudget_tower::BucketBudget::new(uploads),
        HeaderKey::new(API_KEY),
        ratebudget_tower::BodyLength,
    ));
    let upload = |key: &str, bytes: usize| {
        Request::post("/upload")
            .header(API_KEY, key)
            .header("content-length", bytes.to_string())
            .body(Body::from(vec![b'x'; bytes]))
            .unwrap()
    };
    // 25 bytes back to back for alice: 10, then 10, then 10 is refused; bob has his own 25.
    for (key, bytes, status) in [
        ("alice", 10, StatusCode::OK),
        ("alice", 10, StatusCode::OK),
        ("alice", 10, StatusCode::TOO_MANY_REQUESTS),
        ("bob", 25, StatusCode::OK),
        ("bob", 26, StatusCode::PAYLOAD_TOO_LARGE),
    ] {
        let answer = send(&app, upload(key, bytes)).await;
        assert_eq!(answer.status, status, "{key} {bytes}: {answer:?}");
    }
    assert_eq!(fixture.calls(), 3);
    // The buckets are rows under the name, keyed by the hash of each key, never the key.
    let rows: Vec<(String, uuid::Uuid, f64)> =
        sqlx::query_as("SELECT scope, bucket_key, tokens FROM plexsphere.rate_budgets ORDER BY tokens")
            .fetch_all(&pool)
            .await
            .unwrap();
    let name = ratebudget::Name::new("uploads").unwrap();
    let hashed = |key: &str| ratebudget::Key::hashed(name, key.as_bytes()).as_uuid();
    assert_eq!(
        rows,
        [("uploads".to_owned(), hashed("bob"), 0.0), ("uploads".to_owned(), hashed("alice"), 5.0)]
    );
    // Nothing of the binary's is there.
    let contexts: Option<String> =
        sqlx::query_scalar("SELECT to_regclass('plexsphere.domains')::text").fetch_one(&pool).await.unwrap();
    assert_eq!(contexts, None);
}
