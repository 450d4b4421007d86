//! Bad input, tried exhaustively over the real HTTP API (property tests): malformed and
//! oversized JSON, numbers out of range or non-finite, bad uuids, names too long or holding
//! invisible characters, missing or doubled headers, bodies over their limit. Every case must
//! be a 4xx with a JSON `{"error", "code"}` (never a 500, never a dropped connection) and must
//! write nothing: no Domain, Node, secret, batch, audit entry or budget row changes.

use std::sync::Arc;

use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, TestCaseError, TestRunner};
use ratebudget::ManualClock;
use reqwest::Method;
use sqlx::PgPool;

use crate::support::helpers::{instant, FreshDatabase};
use crate::support::replicas::{config, Answer, Replica, OPERATOR_TOKEN};

/// The largest operator body (`app::http::OPERATOR_BODY_LIMIT`).
const OPERATOR_BODY_LIMIT: usize = 512 * 1024;
/// The largest batch the replica under test accepts.
const MAX_BATCH: usize = 1024;

/// One hostile request; the credential it carries is the [`Bearer`] beside it.
#[derive(Clone)]
struct Hostile {
    method: Method,
    path: String,
    headers: Vec<(&'static str, String)>,
    body: Option<Vec<u8>>,
}

/// Shows at most the first 200 bytes of a body: a failing case of 600 KiB stays readable.
impl std::fmt::Debug for Hostile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let body = self.body.as_ref().map(|body| {
            let shown = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
            format!("{shown:?} ({} bytes)", body.len())
        });
        f.debug_struct("Hostile")
            .field("method", &self.method)
            .field("path", &self.path)
            .field("headers", &self.headers)
            .field("body", &body)
            .finish()
    }
}

/// Whose token a request carries: filled in once the fixture exists.
#[derive(Clone, Copy, Debug)]
enum Bearer {
    Operator,
    Node,
}

/// What every case works on: a Domain with a Node and a secret.
struct Fixture {
    domain: String,
    node: String,
    token: String,
}

fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b == b'-' {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Text that is not JSON at all.
fn not_json() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..200),
        "\\{[^}]{0,40}".prop_map(String::into_bytes),
        Just(b"{\"name\": \"unterminated".to_vec()),
        Just(b"[]".to_vec()),
        Just(b"null".to_vec()),
    ]
    .prop_filter("must not be a JSON object", |body| {
        !matches!(serde_json::from_slice::<serde_json::Value>(body), Ok(serde_json::Value::Object(_)))
    })
}

/// Numbers a policy must refuse: out of range, non-finite (which JSON spells only as text or
/// overflow), negative, zero, or refilling slower than the hour allows.
fn bad_numbers() -> impl Strategy<Value = (String, String)> {
    let bad = prop_oneof![
        Just("1e400".to_owned()),
        Just("-1e400".to_owned()),
        Just("\"NaN\"".to_owned()),
        Just("\"Infinity\"".to_owned()),
        Just("0".to_owned()),
        Just("-0".to_owned()),
        Just("true".to_owned()),
        (-1e300..-1e-300_f64).prop_map(|n| format!("{n:e}")),
        (1e12..1e300_f64).prop_map(|n| format!("{n:e}")),
    ];
    let good = (1.0..100.0_f64).prop_map(|n| n.to_string());
    // Both null is no policy at all, which is fine; one null is half a policy, which is not.
    let half = prop_oneof![
        good.clone().prop_map(|good| ("null".to_owned(), good)),
        good.clone().prop_map(|good| (good, "null".to_owned())),
    ];
    prop_oneof![(bad.clone(), good.clone()), (good, bad.clone()), (bad.clone(), bad), half]
}

/// A visible name with one invisible character inside it. Inside, because names are trimmed
/// first and the line and paragraph separators are whitespace: at either end they are trimmed
/// away, and what remains is a valid name.
fn invisible_name() -> impl Strategy<Value = String> {
    let invisible = proptest::sample::select(access::INVISIBLE.to_vec()).prop_flat_map(|(first, last)| {
        (first as u32..=last as u32).prop_filter_map("a char", char::from_u32)
    });
    let letter = || proptest::char::range('a', 'z');
    (letter(), "[a-z]{0,10}", invisible, letter())
        .prop_map(|(first, more, c, last)| format!("{first}{more}{c}{last}"))
}

/// Every kind of hostile request, given the fixture's ids.
fn hostile(domain: &str, node: &str) -> impl Strategy<Value = (Hostile, Bearer)> {
    let (domain, node) = (domain.to_owned(), node.to_owned());
    let json_routes = vec![
        (Method::POST, "/v1/domains".to_owned()),
        (Method::POST, format!("/v1/domains/{domain}/nodes")),
        (Method::PUT, format!("/v1/domains/{domain}/secrets/key")),
    ];
    let operator = |method: Method, path: String, body: Option<Vec<u8>>| {
        (Hostile { method, path, headers: Vec::new(), body }, Bearer::Operator)
    };
    let d = domain.clone();
    prop_oneof![
        // Malformed JSON on every JSON route.
        (proptest::sample::select(json_routes.clone()), not_json())
            .prop_map(move |((method, path), body)| operator(method, path, Some(body))),
        // Well-formed JSON of the wrong shape.
        (proptest::sample::select(json_routes.clone()), "[a-z_]{1,12}", any::<i64>()).prop_map(
            move |((method, path), field, number)| {
                operator(method, path, Some(format!("{{\"{field}\": {number}}}").into_bytes()))
            }
        ),
        // Oversized JSON: past the body limit before it is read.
        (proptest::sample::select(json_routes), 1..65_536_usize).prop_map(move |((method, path), extra)| {
            let body = format!("{{\"name\": \"{}\"}}", "x".repeat(OPERATOR_BODY_LIMIT + extra));
            operator(method, path, Some(body.into_bytes()))
        }),
        // Numbers out of range or non-finite.
        bad_numbers().prop_map(move |(rate, burst)| {
            let body =
                format!(r#"{{"name": "d", "issuance_per_second": {rate}, "issuance_burst": {burst}}}"#);
            operator(Method::POST, "/v1/domains".to_owned(), Some(body.into_bytes()))
        }),
        // Bad uuids in every path that takes one.
        ("[^/?#]{1,40}".prop_filter("not a uuid", |text| uuid::Uuid::parse_str(text).is_err()), 0..5_usize)
            .prop_map(move |(text, route)| {
                let bad = percent_encode(&text);
                let (method, path, body) = match route {
                    0 => {
                        (Method::POST, format!("/v1/domains/{bad}/nodes"), Some(br#"{"name": "n"}"#.to_vec()))
                    }
                    1 => (
                        Method::PUT,
                        format!("/v1/domains/{bad}/secrets/key"),
                        Some(br#"{"value": "v"}"#.to_vec()),
                    ),
                    2 => (Method::GET, format!("/v1/budgets/{bad}"), None),
                    3 => (Method::DELETE, format!("/v1/domains/{bad}/nodes/{node}"), None),
                    _ => (Method::DELETE, format!("/v1/domains/{d}/nodes/{bad}"), None),
                };
                operator(method, path, body)
            }),
        // Names too long, or holding an invisible or bidi-override character.
        (prop_oneof!["[a-zé東]{101,300}", invisible_name()], any::<bool>()).prop_map({
            let domain = domain.clone();
            move |(name, node)| {
                let body = serde_json::json!({ "name": name }).to_string().into_bytes();
                let path =
                    if node { format!("/v1/domains/{domain}/nodes") } else { "/v1/domains".to_owned() };
                operator(Method::POST, path, Some(body))
            }
        }),
        // Secret names too long or outside the alphabet; values too large or holding NUL.
        ("[A-Za-z0-9]{129,200}|[^A-Za-z0-9._/?#-]{1,20}", any::<bool>()).prop_map({
            let domain = domain.clone();
            move |(name, as_node)| {
                let name = percent_encode(&name);
                if as_node {
                    (
                        Hostile {
                            method: Method::GET,
                            path: format!("/v1/secrets/{name}"),
                            headers: Vec::new(),
                            body: None,
                        },
                        Bearer::Node,
                    )
                } else {
                    let body = br#"{"value": "v"}"#.to_vec();
                    operator(Method::PUT, format!("/v1/domains/{domain}/secrets/{name}"), Some(body))
                }
            }
        }),
        (1..1000_usize, any::<bool>()).prop_map({
            let domain = domain.clone();
            move |(extra, nul)| {
                let value =
                    if nul { format!("a\u{0}{}", "b".repeat(extra)) } else { "v".repeat(65_536 + extra) };
                let body = serde_json::json!({ "value": value }).to_string().into_bytes();
                operator(Method::PUT, format!("/v1/domains/{domain}/secrets/key"), Some(body))
            }
        }),
        // Missing, malformed or doubled credentials, on every kind of route.
        (0..4_usize, 0..4_usize, "[ -~]{0,60}")
            .prop_map(move |(route, credential, garbage)| {
                let (method, path, body) = match route {
                    0 => (Method::POST, "/v1/domains".to_owned(), Some(br#"{"name": "d"}"#.to_vec())),
                    1 => (Method::GET, "/v1/secrets/key".to_owned(), None),
                    2 => (Method::POST, "/v1/ingest".to_owned(), Some(b"cpu=1".to_vec())),
                    _ => (Method::GET, "/v1/audit".to_owned(), None),
                };
                let headers = match credential {
                    0 => Vec::new(),
                    1 => vec![("authorization", format!("Bearer {garbage}"))],
                    2 => vec![("authorization", garbage.clone())],
                    _ => vec![
                        ("authorization", format!("Bearer {OPERATOR_TOKEN}")),
                        ("authorization", format!("Bearer {OPERATOR_TOKEN}")),
                    ],
                };
                (Hostile { method, path, headers, body }, Bearer::Operator)
            })
            .prop_map(|(mut hostile, bearer)| {
                // These carry their own (bad) credentials.
                hostile.headers.push(("x-plexsphere-test-own-credentials", "1".to_owned()));
                (hostile, bearer)
            }),
        // Empty batches, and batches over the limit.
        prop_oneof![Just(0_usize), (MAX_BATCH + 1)..(MAX_BATCH * 4)].prop_map(|size| {
            (
                Hostile {
                    method: Method::POST,
                    path: "/v1/ingest".to_owned(),
                    headers: Vec::new(),
                    body: Some(vec![b'x'; size]),
                },
                Bearer::Node,
            )
        }),
    ]
}

/// Every row the cases must leave alone, counted in one round trip.
async fn counts(pool: &PgPool) -> (i64, i64, i64, i64, i64, i64) {
    sqlx::query_as(
        "SELECT (SELECT count(*) FROM plexsphere.domains),
                (SELECT count(*) FROM plexsphere.nodes),
                (SELECT count(*) FROM plexsphere.secrets),
                (SELECT count(*) FROM plexsphere.ingest_batches),
                (SELECT count(*) FROM plexsphere.audit_events),
                (SELECT count(*) FROM plexsphere.rate_budgets)",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn send(replica: &Replica, fixture: &Fixture, (hostile, bearer): &(Hostile, Bearer)) -> Answer {
    let mut headers: Vec<(&str, String)> = Vec::new();
    let own_credentials =
        hostile.headers.iter().any(|(name, _)| *name == "x-plexsphere-test-own-credentials");
    if !own_credentials {
        let token = match bearer {
            Bearer::Operator => OPERATOR_TOKEN,
            Bearer::Node => fixture.token.as_str(),
        };
        headers.push(("authorization", format!("Bearer {token}")));
    }
    headers
        .extend(hostile.headers.iter().filter(|(name, _)| !name.starts_with("x-plexsphere-test")).cloned());
    let headers: Vec<(&str, &str)> = headers.iter().map(|(name, value)| (*name, value.as_str())).collect();
    replica.request_with_headers(hostile.method.clone(), &hostile.path, &headers, hostile.body.clone()).await
}

#[test]
fn every_hostile_request_is_a_json_4xx_and_writes_nothing() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (database, pool, replica, fixture) = runtime.block_on(async {
        let (database, pool) = FreshDatabase::create().await;
        let connect = pool.connect_options().as_ref().clone();
        let max_batch = MAX_BATCH.to_string();
        let replica = Replica::start(
            config(&connect, &[("PLEXSPHERE_INGEST_MAX_BATCH_BYTES", &max_batch)]),
            Arc::new(ManualClock::new(instant())),
        )
        .await;
        let domain = replica.create_domain("d", None).await;
        let (node, token) = replica.enrol(&domain, "n").await;
        replica.put_secret(&domain, "key", "value").await;
        (database, pool, replica, Fixture { domain, node, token })
    });
    let mut runner = TestRunner::new(ProptestConfig {
        cases: 512,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let strategy = hostile(&fixture.domain, &fixture.node);
    let outcome = runner.run(&strategy, |case| {
        let before = runtime.block_on(counts(&pool));
        let answer = runtime.block_on(send(&replica, &fixture, &case));
        let status = answer.status.as_u16();
        prop_assert!((400..500).contains(&status), "{case:?} answered {answer:?}");
        prop_assert!(!answer.code().is_empty(), "{case:?} answered without a JSON code: {answer:?}");
        prop_assert!(answer.body["error"].as_str().is_some_and(|error| !error.is_empty()), "{answer:?}");
        let after = runtime.block_on(counts(&pool));
        prop_assert_eq!(after, before, "{:?} wrote something", case);
        Ok::<(), TestCaseError>(())
    });
    runtime.block_on(async {
        replica.stop().await;
        database.drop_database(pool).await;
    });
    outcome.unwrap();
}
