//! The access context's adapters against a real PostgreSQL: the Domain and Node tables, and
//! the issuance limiter on the shared rate budgets, driven through the real service.

use std::sync::Arc;
use std::time::Duration;

use access::{
    AccessService, AuthError, Domain, DomainId, DomainName, EnrolError, IssuanceLimitError, IssuancePolicy,
    Limiter, NewDomain, NodeName, NodeToken, PgAccessRepository, RateBudgetIssuanceLimiter,
};
use proptest::prelude::*;
use ratebudget::{Limit, ManualClock, Spender, Store};
use sqlx::PgPool;

use crate::support::helpers::{instant, unreachable_pool};

/// The default budget the tests' limiters are built with: 1 a second, 5 back to back.
fn limit(per_second: f64, burst: f64) -> Limit {
    Limit::new(per_second, burst).unwrap()
}

fn default_limit() -> Limit {
    limit(1.0, 5.0)
}

fn limiter(pool: &PgPool, clock: &ManualClock, default_limit: Limit) -> RateBudgetIssuanceLimiter {
    RateBudgetIssuanceLimiter::new(
        Spender::new(Arc::new(Store::new(pool.clone())), Arc::new(clock.clone())),
        default_limit,
    )
}

/// The real service on `pool`, deciding issuances at `clock`'s now.
fn service(pool: &PgPool, clock: &ManualClock, default_limit: Limit) -> AccessService {
    AccessService::new(
        Arc::new(PgAccessRepository::new(pool.clone())),
        Arc::new(limiter(pool, clock, default_limit)),
    )
}

async fn create_domain(service: &AccessService, policy: Option<IssuancePolicy>) -> Domain {
    let new = NewDomain { name: DomainName::parse("fleet").unwrap(), issuance_policy: policy };
    service.create_domain(new).await.unwrap()
}

fn name(text: &str) -> NodeName {
    NodeName::parse(text).unwrap()
}

async fn node_count(pool: &PgPool, domain: DomainId) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM plexsphere.nodes WHERE domain_id = $1")
        .bind(domain.as_uuid())
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Enrols one Node and returns the refusal's `retry_after`, or None when it was admitted.
async fn enrol(service: &AccessService, domain: DomainId) -> Option<Duration> {
    match service.enrol_node(domain, name("edge")).await {
        Ok(_) => None,
        Err(EnrolError::IssuanceRateLimited { retry_after }) => Some(retry_after),
        Err(other) => panic!("enrolment neither admitted nor refused: {other:?}"),
    }
}

#[sqlx::test(migrator = "app::MIGRATOR")]
async fn a_domain_with_a_policy_reads_back_as_it_was_created(pool: PgPool) {
    let service = service(&pool, &ManualClock::new(instant()), default_limit());
    let policy = IssuancePolicy::new(0.125, 7.5).unwrap();

    let created = create_domain(&service, Some(policy)).await;

    assert_eq!(service.find_domain(created.id).await.unwrap(), Some(created.clone()));
    let by_repository = PgAccessRepository::new(pool.clone());
    let found = access::AccessRepository::find_domain(&by_repository, created.id).await.unwrap().unwrap();
    assert_eq!(found.issuance_policy, Some(policy));
    assert_eq!(found.name.as_str(), "fleet");
}

#[sqlx::test(migrator = "app::MIGRATOR")]
async fn a_domain_without_a_policy_reads_back_without_one(pool: PgPool) {
    let service = service(&pool, &ManualClock::new(instant()), default_limit());

    let created = create_domain(&service, None).await;

    let found = service.find_domain(created.id).await.unwrap().unwrap();
    assert_eq!(found, created);
    assert_eq!(found.issuance_policy, None);
    let stored: (Option<f64>, Option<f64>) =
        sqlx::query_as("SELECT issuance_per_second, issuance_burst FROM plexsphere.domains WHERE id = $1")
            .bind(created.id.as_uuid())
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(stored, (None, None));
}

#[sqlx::test(migrator = "app::MIGRATOR")]
async fn an_unknown_domain_is_not_found(pool: PgPool) {
    let service = service(&pool, &ManualClock::new(instant()), default_limit());
    create_domain(&service, None).await;

    assert_eq!(service.find_domain(DomainId::random()).await.unwrap(), None);
}

#[sqlx::test(migrator = "app::MIGRATOR")]
async fn an_enrolled_node_authenticates_with_its_token_and_no_other(pool: PgPool) {
    let service = service(&pool, &ManualClock::new(instant()), default_limit());
    let domain = create_domain(&service, None).await;

    let first = service.enrol_node(domain.id, name("edge-1")).await.unwrap();
    let second = service.enrol_node(domain.id, name("edge-2")).await.unwrap();

    let authenticated = service.authenticate(first.token.expose()).await.unwrap();
    assert_eq!((authenticated.node_id, authenticated.domain_id), (first.node.id, domain.id));
    let authenticated = service.authenticate(second.token.expose()).await.unwrap();
    assert_eq!((authenticated.node_id, authenticated.domain_id), (second.node.id, domain.id));
    assert_ne!(first.node.id, second.node.id);

    let never_issued = NodeToken::generate();
    assert!(matches!(service.authenticate(never_issued.expose()).await, Err(AuthError::UnknownToken)));
    let tampered = format!("{}x", first.token.expose());
    assert!(matches!(service.authenticate(&tampered).await, Err(AuthError::MalformedToken)));
}

#[sqlx::test(migrator = "app::MIGRATOR")]
async fn the_nodes_row_holds_only_the_32_byte_hash_of_the_token(pool: PgPool) {
    let service = service(&pool, &ManualClock::new(instant()), default_limit());
    let domain = create_domain(&service, None).await;

    let enrolment = service.enrol_node(domain.id, name("edge-1")).await.unwrap();

    let (stored_hash, whole_row): (Vec<u8>, String) = sqlx::query_as(
        "SELECT n.token_hash, row_to_json(n)::text FROM plexsphere.nodes AS n WHERE n.id = $1",
    )
    .bind(enrolment.node.id.as_uuid())
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(stored_hash.len(), 32);
    assert_eq!(stored_hash.as_slice(), enrolment.token.hash().as_bytes());
    let secret = &enrolment.token.expose()["psn_".len()..];
    assert!(!whole_row.contains(secret), "the row holds the token: {whole_row}");
}

#[sqlx::test(migrator = "app::MIGRATOR")]
async fn issuance_follows_the_domains_own_policy(pool: PgPool) {
    let clock = ManualClock::new(instant());
    // The default would admit five; the Domain's own policy admits two, then one every 2 s.
    let service = service(&pool, &clock, default_limit());
    let domain = create_domain(&service, Some(IssuancePolicy::new(0.5, 2.0).unwrap())).await;

    assert_eq!(enrol(&service, domain.id).await, None);
    assert_eq!(enrol(&service, domain.id).await, None);
    assert_eq!(enrol(&service, domain.id).await, Some(Duration::from_secs(2)));
    assert_eq!(node_count(&pool, domain.id).await, 2, "a refused enrolment stores no Node");

    // The wait is exact: what is left of the two seconds.
    clock.advance(chrono::Duration::milliseconds(1999));
    assert_eq!(enrol(&service, domain.id).await, Some(Duration::from_millis(1)));
    clock.advance(chrono::Duration::milliseconds(1));
    assert_eq!(enrol(&service, domain.id).await, None);
    assert_eq!(enrol(&service, domain.id).await, Some(Duration::from_secs(2)));
    assert_eq!(node_count(&pool, domain.id).await, 3);
}

#[sqlx::test(migrator = "app::MIGRATOR")]
async fn issuance_follows_the_default_budget_when_the_domain_has_no_policy(pool: PgPool) {
    let clock = ManualClock::new(instant());
    let service = service(&pool, &clock, limit(4.0, 3.0));
    let domain = create_domain(&service, None).await;

    for _ in 0..3 {
        assert_eq!(enrol(&service, domain.id).await, None);
    }
    assert_eq!(enrol(&service, domain.id).await, Some(Duration::from_millis(250)));
    assert_eq!(node_count(&pool, domain.id).await, 3);

    clock.advance(chrono::Duration::milliseconds(250));
    assert_eq!(enrol(&service, domain.id).await, None);
    assert_eq!(enrol(&service, domain.id).await, Some(Duration::from_millis(250)));
}

#[sqlx::test(migrator = "app::MIGRATOR")]
async fn each_domain_spends_from_a_bucket_of_its_own(pool: PgPool) {
    let service = service(&pool, &ManualClock::new(instant()), default_limit());
    let one_at_a_time = Some(IssuancePolicy::new(1.0, 1.0).unwrap());
    let exhausted = create_domain(&service, one_at_a_time).await;
    let other = create_domain(&service, one_at_a_time).await;

    assert_eq!(enrol(&service, exhausted.id).await, None);
    assert_eq!(enrol(&service, exhausted.id).await, Some(Duration::from_secs(1)));

    assert_eq!(enrol(&service, other.id).await, None);
}

#[sqlx::test(migrator = "app::MIGRATOR")]
async fn enrolment_into_an_unknown_domain_spends_no_budget(pool: PgPool) {
    let service = service(&pool, &ManualClock::new(instant()), default_limit());
    let unknown = DomainId::random();

    let result = service.enrol_node(unknown, name("edge")).await;

    assert!(matches!(result, Err(EnrolError::UnknownDomain(id)) if id == unknown), "{result:?}");
    let buckets: i64 =
        sqlx::query_scalar("SELECT count(*) FROM plexsphere.rate_budgets").fetch_one(&pool).await.unwrap();
    assert_eq!(buckets, 0);
}

#[sqlx::test(migrator = "app::MIGRATOR")]
async fn a_limiter_on_an_unreachable_store_is_unavailable_never_rate_limited(pool: PgPool) {
    let clock = ManualClock::new(instant());
    let unreachable = limiter(&unreachable_pool(), &clock, default_limit());
    let policy = Some(IssuancePolicy::new(1.0, 1.0).unwrap());
    for policy in [None, policy] {
        let result = unreachable.spend_issuance(DomainId::random(), policy).await;
        assert!(matches!(result, Err(IssuanceLimitError::Unavailable(_))), "{result:?}");
    }

    // Through the service: the Domain is found, the limiter cannot answer, no Node is stored.
    let service = AccessService::new(Arc::new(PgAccessRepository::new(pool.clone())), Arc::new(unreachable));
    let domain = create_domain(&service, None).await;
    let result = service.enrol_node(domain.id, name("edge")).await;
    assert!(matches!(result, Err(EnrolError::Unavailable(_))), "{result:?}");
    assert_eq!(node_count(&pool, domain.id).await, 0);
}

#[sqlx::test(migrator = "app::MIGRATOR")]
async fn a_policy_the_store_refuses_is_unavailable_never_rate_limited(pool: PgPool) {
    // Valid for the access context (a rate above zero, a burst of one), but it would take
    // over an hour to refill, which the rate-budget store refuses: misconfiguration, not a cap.
    let clock = ManualClock::new(instant());
    let slow = Some(IssuancePolicy::new(1e-9, 1.0).unwrap());
    let result = limiter(&pool, &clock, default_limit()).spend_issuance(DomainId::random(), slow).await;
    assert!(matches!(result, Err(IssuanceLimitError::Unavailable(_))), "{result:?}");
}

#[sqlx::test(migrator = "app::MIGRATOR")]
async fn a_store_that_cannot_answer_makes_every_use_case_unavailable(pool: PgPool) {
    let clock = ManualClock::new(instant());
    let service = AccessService::new(
        Arc::new(PgAccessRepository::new(unreachable_pool())),
        Arc::new(limiter(&pool, &clock, default_limit())),
    );

    let new = NewDomain { name: DomainName::parse("fleet").unwrap(), issuance_policy: None };
    assert!(matches!(service.create_domain(new).await, Err(access::CreateDomainError::Unavailable(_))));
    assert!(service.find_domain(DomainId::random()).await.is_err());
    let enrolment = service.enrol_node(DomainId::random(), name("edge")).await;
    assert!(matches!(enrolment, Err(EnrolError::Unavailable(_))), "{enrolment:?}");
    let authentication = service.authenticate(NodeToken::generate().expose()).await;
    assert!(matches!(authentication, Err(AuthError::Unavailable(_))), "{authentication:?}");
}

/// Runs `sql` and returns the name of the constraint it violated.
async fn violated_constraint(pool: &PgPool, sql: &str) -> String {
    let Err(error) = sqlx::query(sql).execute(pool).await else {
        panic!("accepted: {sql}");
    };
    match error.as_database_error().and_then(|error| error.constraint()) {
        Some(constraint) => constraint.to_owned(),
        None => panic!("{sql}: not a constraint violation: {error}"),
    }
}

#[sqlx::test(migrator = "app::MIGRATOR")]
async fn the_tables_reject_half_a_policy_an_unusable_policy_a_bad_name_and_a_short_hash(pool: PgPool) {
    let domain = |per_second: &str, burst: &str, name: &str| {
        format!(
            "INSERT INTO plexsphere.domains (id, name, issuance_per_second, issuance_burst)
             VALUES (gen_random_uuid(), {name}, {per_second}, {burst})"
        )
    };
    for (per_second, burst) in [
        ("1", "NULL"),
        ("NULL", "1"),
        ("0", "1"),
        ("1", "0.5"),
        ("'NaN'", "1"),
        ("1", "'NaN'"),
        ("'Infinity'", "1"),
        ("1", "'Infinity'"),
        // Refills in over an hour: the idle sweep would delete it before it is full.
        ("0.001", "4"),
        ("1", "3601"),
    ] {
        assert_eq!(
            violated_constraint(&pool, &domain(per_second, burst, "'fleet'")).await,
            "domains_issuance_policy_check",
            "({per_second}, {burst})"
        );
    }
    for name in ["''", "repeat('x', 101)", "E'fleet\\n'", "E'a\\u0085b'"] {
        assert_eq!(
            violated_constraint(&pool, &domain("NULL", "NULL", name)).await,
            "domains_name_check",
            "{name}"
        );
    }

    sqlx::query(&domain("NULL", "NULL", "'fleet'")).execute(&pool).await.unwrap();
    let node = |hash: &str| {
        format!(
            "INSERT INTO plexsphere.nodes (id, domain_id, name, token_hash)
             SELECT gen_random_uuid(), id, 'edge', {hash} FROM plexsphere.domains"
        )
    };
    assert_eq!(violated_constraint(&pool, &node("'\\x00'::bytea")).await, "nodes_token_hash_check");
    assert_eq!(violated_constraint(&pool, &node("sha512('x')")).await, "nodes_token_hash_check");
    sqlx::query(&node("sha256('x')")).execute(&pool).await.unwrap();
    assert_eq!(violated_constraint(&pool, &node("sha256('x')")).await, "nodes_token_hash_key");
    let orphan = "INSERT INTO plexsphere.nodes (id, domain_id, name, token_hash)
                  VALUES (gen_random_uuid(), gen_random_uuid(), 'edge', sha256('y'))";
    assert_eq!(violated_constraint(&pool, orphan).await, "nodes_domain_id_fkey");
    // Exactly an hour is the slowest refill allowed.
    sqlx::query(&domain("1", "3600", "'hourly'")).execute(&pool).await.unwrap();
}

/// Rates and bursts around every edge of the rule: the retention boundary to the last bit,
/// the upper bounds, and the floor of one.
fn policy_numbers() -> impl Strategy<Value = (f64, f64)> {
    let at_boundary = (1e-3f64..1e9, -3i64..=3).prop_map(|(per_second, ulps)| {
        let boundary = per_second * 3600.0;
        (per_second, f64::from_bits((boundary.to_bits() as i64 + ulps) as u64))
    });
    let anywhere = (prop_oneof![1e-6f64..10.0, 1e9f64..2e12], prop_oneof![0.5f64..10.0, 1e14f64..2e15]);
    prop_oneof![at_boundary, anywhere]
}

#[test]
fn a_policy_that_passes_rust_is_stored_and_one_that_fails_trips_the_check() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let (database, pool) = runtime.block_on(crate::support::helpers::FreshDatabase::create());
    let config = ProptestConfig { cases: 256, ..ProptestConfig::default() };
    proptest!(config, |((per_second, burst) in policy_numbers())| {
        // What POST /v1/domains checks: the store's rule and the access context's own.
        let passes = Limit::new(per_second, burst).is_ok() && IssuancePolicy::new(per_second, burst).is_ok();
        let inserted = runtime.block_on(
            sqlx::query(
                "INSERT INTO plexsphere.domains (id, name, issuance_per_second, issuance_burst) VALUES ($1, 'd', $2, $3)",
            )
            .bind(uuid::Uuid::new_v4())
            .bind(per_second)
            .bind(burst)
            .execute(&pool),
        );
        if let Err(error) = &inserted {
            let constraint = error.as_database_error().and_then(|e| e.constraint());
            prop_assert_eq!(constraint, Some("domains_issuance_policy_check"), "{}", error);
        }
        prop_assert_eq!(passes, inserted.is_ok(), "{}/s, burst {}", per_second, burst);
    });
    runtime.block_on(database.drop_database(pool));
}

// ---- invisible characters in names ----

#[sqlx::test(migrator = "app::MIGRATOR")]
async fn the_tables_refuse_exactly_the_characters_the_model_calls_invisible(pool: PgPool) {
    // The CHECK's own pattern, run over every code point PostgreSQL can hold in text.
    let definition: String = sqlx::query_scalar(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'domains_name_visible_check'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let pattern = definition.split('\'').nth(1).expect("the CHECK holds one quoted pattern");
    let refused: Vec<i32> = sqlx::query_scalar(
        "SELECT c FROM generate_series(1, 1114111) AS c
         WHERE (c < 55296 OR c > 57343) AND chr(c) ~ $1
         ORDER BY c",
    )
    .bind(pattern)
    .fetch_all(&pool)
    .await
    .unwrap();
    let model: Vec<i32> = (1..=0x10FFFF_u32)
        .filter_map(char::from_u32)
        .filter(|c| access::is_invisible(*c))
        .map(|c| c as i32)
        .collect();
    assert_eq!(refused, model);
    let node_definition: String = sqlx::query_scalar(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'nodes_name_visible_check'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(node_definition, definition);
}

#[tokio::test]
async fn names_stored_before_the_rule_show_their_invisible_characters_as_replacement_characters() {
    let (database, pool) = crate::support::helpers::FreshDatabase::create_before(33).await;
    let domain = uuid::Uuid::new_v4();
    sqlx::query("INSERT INTO plexsphere.domains (id, name) VALUES ($1, $2)")
        .bind(domain)
        .bind("ad\u{200B}min\u{202E}")
        .execute(&pool)
        .await
        .unwrap();
    app::MIGRATOR.run(&pool).await.unwrap();
    let name: String = sqlx::query_scalar("SELECT name FROM plexsphere.domains WHERE id = $1")
        .bind(domain)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(name, "ad\u{FFFD}min\u{FFFD}");
    assert!(access::DomainName::parse(name).is_ok());
    database.drop_database(pool).await;
}
