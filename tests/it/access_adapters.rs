//! The access context's adapters against a real PostgreSQL: the Domain and Node tables, the
//! Domains' tiers and their revision, and the issuance limiter on the shared rate budgets,
//! driven through the real service.

use std::sync::Arc;
use std::time::Duration;

use access::{
    AccessService, AuthError, Domain, DomainId, DomainName, EnrolError, IssuanceLimitError, Limiter,
    NewDomain, NodeName, NodeToken, PgAccessRepository, RateBudgetIssuanceLimiter, Tier,
};
use ratebudget::{Limit, ManualClock, Scope};
use sqlx::PgPool;

use crate::support::helpers::{instant, spender, unreachable_pool};

fn limit(per_second: f64, burst: f64) -> Limit {
    Limit::new(per_second, burst).unwrap()
}

/// The budget the tests' limiters are built with: 1 a second, 5 back to back.
fn default_limit() -> Limit {
    limit(1.0, 5.0)
}

fn limiter(pool: &PgPool, clock: &ManualClock, issuance: Limit) -> RateBudgetIssuanceLimiter {
    RateBudgetIssuanceLimiter::new(spender(pool, clock, [(Scope::AccessIssuanceDomain, issuance)]))
}

/// The real service on `pool`, deciding issuances at `clock`'s now.
fn service(pool: &PgPool, clock: &ManualClock, issuance: Limit) -> AccessService {
    AccessService::new(
        Arc::new(PgAccessRepository::new(pool.clone())),
        Arc::new(limiter(pool, clock, issuance)),
    )
}

async fn create_domain(service: &AccessService, tier: Tier) -> Domain {
    // Names are unique: each Domain is named after its id.
    let id = DomainId::random();
    let new = NewDomain { id, name: DomainName::parse(format!("fleet-{id}")).unwrap(), tier };
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

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_domain_reads_back_as_it_was_created(pool: PgPool) {
    let service = service(&pool, &ManualClock::new(instant()), default_limit());

    let created = create_domain(&service, Tier::Premium).await;

    assert_eq!(service.find_domain(created.id).await.unwrap(), Some(created.clone()));
    assert_eq!(
        (created.name.as_str(), created.tier),
        (format!("fleet-{}", created.id).as_str(), Tier::Premium)
    );
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn an_unknown_domain_is_not_found(pool: PgPool) {
    let service = service(&pool, &ManualClock::new(instant()), default_limit());
    create_domain(&service, Tier::DEFAULT).await;

    assert_eq!(service.find_domain(DomainId::random()).await.unwrap(), None);
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn the_tier_directory_holds_every_domain_off_the_default_and_each_change_is_one_revision(pool: PgPool) {
    let service = service(&pool, &ManualClock::new(instant()), default_limit());
    let mut listener = sqlx::postgres::PgListener::connect_with(&pool).await.unwrap();
    listener.listen(access::TIER_CHANNEL).await.unwrap();
    let empty = service.tiers().await.unwrap();
    assert_eq!((empty.revision, empty.tiers.len()), (0, 0));

    // A Domain created on the default tier is no change; one created off it is.
    let standard = create_domain(&service, Tier::DEFAULT).await;
    let free = create_domain(&service, Tier::Free).await;
    assert_eq!(service.tier_revision().await.unwrap(), 1);
    assert_eq!(listener.recv().await.unwrap().payload(), "1", "announced with its revision");

    let moved = service.set_tier(standard.id, Tier::Enterprise).await.unwrap().unwrap();
    assert_eq!((moved.id, moved.tier), (standard.id, Tier::Enterprise));
    assert_eq!(listener.recv().await.unwrap().payload(), "2");
    // Back to the default: a change too, and the Domain leaves the directory.
    service.set_tier(free.id, Tier::DEFAULT).await.unwrap().unwrap();
    assert_eq!(listener.recv().await.unwrap().payload(), "3");

    let directory = service.tiers().await.unwrap();
    assert_eq!(directory.revision, 3);
    assert_eq!(directory.tiers, vec![(standard.id, Tier::Enterprise)]);
    assert_eq!(service.find_domain(free.id).await.unwrap().unwrap().tier, Tier::DEFAULT);

    // An unknown Domain is not found, and nothing changes.
    assert_eq!(service.set_tier(DomainId::random(), Tier::Premium).await.unwrap(), None);
    assert_eq!(service.tier_revision().await.unwrap(), 3);
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn an_enrolled_node_authenticates_with_its_token_and_no_other(pool: PgPool) {
    let service = service(&pool, &ManualClock::new(instant()), default_limit());
    let domain = create_domain(&service, Tier::DEFAULT).await;

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

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn the_nodes_row_holds_only_the_32_byte_hash_of_the_token(pool: PgPool) {
    let service = service(&pool, &ManualClock::new(instant()), default_limit());
    let domain = create_domain(&service, Tier::DEFAULT).await;

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

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn issuance_follows_the_budget_the_spender_is_given(pool: PgPool) {
    let clock = ManualClock::new(instant());
    let service = service(&pool, &clock, limit(4.0, 3.0));
    let domain = create_domain(&service, Tier::DEFAULT).await;

    for _ in 0..3 {
        assert_eq!(enrol(&service, domain.id).await, None);
    }
    assert_eq!(enrol(&service, domain.id).await, Some(Duration::from_millis(250)));
    assert_eq!(node_count(&pool, domain.id).await, 3);

    clock.advance(chrono::Duration::milliseconds(250));
    assert_eq!(enrol(&service, domain.id).await, None);
    assert_eq!(enrol(&service, domain.id).await, Some(Duration::from_millis(250)));
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn each_domain_spends_from_a_bucket_of_its_own(pool: PgPool) {
    let service = service(&pool, &ManualClock::new(instant()), limit(1.0, 1.0));
    let exhausted = create_domain(&service, Tier::DEFAULT).await;
    let other = create_domain(&service, Tier::DEFAULT).await;

    assert_eq!(enrol(&service, exhausted.id).await, None);
    assert_eq!(enrol(&service, exhausted.id).await, Some(Duration::from_secs(1)));

    assert_eq!(enrol(&service, other.id).await, None);
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn enrolment_into_an_unknown_domain_spends_no_budget(pool: PgPool) {
    let service = service(&pool, &ManualClock::new(instant()), default_limit());
    let unknown = DomainId::random();

    let result = service.enrol_node(unknown, name("edge")).await;

    assert!(matches!(result, Err(EnrolError::UnknownDomain(id)) if id == unknown), "{result:?}");
    let buckets: i64 =
        sqlx::query_scalar("SELECT count(*) FROM plexsphere.rate_budgets").fetch_one(&pool).await.unwrap();
    assert_eq!(buckets, 0);
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_limiter_on_an_unreachable_store_is_unavailable_never_rate_limited(pool: PgPool) {
    let clock = ManualClock::new(instant());
    let unreachable = limiter(&unreachable_pool(), &clock, default_limit());
    let result = unreachable.spend_issuance(DomainId::random()).await;
    assert!(matches!(result, Err(IssuanceLimitError::Unavailable(_))), "{result:?}");

    // Through the service: the Domain is found, the limiter cannot answer, no Node is stored.
    let service = AccessService::new(Arc::new(PgAccessRepository::new(pool.clone())), Arc::new(unreachable));
    let domain = create_domain(&service, Tier::DEFAULT).await;
    let result = service.enrol_node(domain.id, name("edge")).await;
    assert!(matches!(result, Err(EnrolError::Unavailable(_))), "{result:?}");
    assert_eq!(node_count(&pool, domain.id).await, 0);
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn budgets_that_cannot_give_a_policy_make_issuance_unavailable_never_rate_limited(pool: PgPool) {
    // No policy for the issuance scope (as before a replica has loaded its rules): nothing
    // is decided, and that is not a refusal.
    let limiter = RateBudgetIssuanceLimiter::new(spender(&pool, &ManualClock::new(instant()), []));
    let result = limiter.spend_issuance(DomainId::random()).await;
    assert!(matches!(result, Err(IssuanceLimitError::Unavailable(_))), "{result:?}");
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_store_that_cannot_answer_makes_every_use_case_unavailable(pool: PgPool) {
    let clock = ManualClock::new(instant());
    let service = AccessService::new(
        Arc::new(PgAccessRepository::new(unreachable_pool())),
        Arc::new(limiter(&pool, &clock, default_limit())),
    );

    let new =
        NewDomain { id: DomainId::random(), name: DomainName::parse("fleet").unwrap(), tier: Tier::Free };
    assert!(matches!(service.create_domain(new).await, Err(access::CreateDomainError::Unavailable(_))));
    assert!(service.find_domain(DomainId::random()).await.is_err());
    assert!(service.set_tier(DomainId::random(), Tier::Free).await.is_err());
    assert!(service.tiers().await.is_err());
    assert!(service.tier_revision().await.is_err());
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

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn the_tables_reject_an_unknown_tier_a_bad_name_and_a_short_hash(pool: PgPool) {
    let domain = |name: &str, tier: &str| {
        format!("INSERT INTO plexsphere.domains (id, name, tier) VALUES (gen_random_uuid(), {name}, {tier})")
    };
    for tier in ["'gold'", "'Premium'", "''"] {
        assert_eq!(
            violated_constraint(&pool, &domain("'fleet'", tier)).await,
            "domains_tier_check",
            "{tier}"
        );
    }
    for name in ["''", "repeat('x', 101)", "E'fleet\\n'", "E'a\\u0085b'"] {
        assert_eq!(violated_constraint(&pool, &domain(name, "'free'")).await, "domains_name_check", "{name}");
    }
    // A Domain a replica of the previous build creates, naming no tier, is on the default.
    sqlx::query("INSERT INTO plexsphere.domains (id, name) VALUES (gen_random_uuid(), 'fleet')")
        .execute(&pool)
        .await
        .unwrap();
    let tier: String =
        sqlx::query_scalar("SELECT tier FROM plexsphere.domains").fetch_one(&pool).await.unwrap();
    assert_eq!(tier, Tier::DEFAULT.as_str());

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
}

// ---- invisible characters in names ----

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
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
    app::migrations::MIGRATOR.run(&pool).await.unwrap();
    let name: String = sqlx::query_scalar("SELECT name FROM plexsphere.domains WHERE id = $1")
        .bind(domain)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(name, "ad\u{FFFD}min\u{FFFD}");
    assert!(access::DomainName::parse(name).is_ok());
    database.drop_database(pool).await;
}
