//! The rules context's store against a real PostgreSQL: the table's CHECK and the model agree
//! on every number, history cannot be rewritten, concurrent creators of one id get one rule,
//! every change is announced with its revision, and migration 0056 turns the Domains' old
//! issuance policies into override rules.

use std::sync::Arc;

use proptest::prelude::*;
use ratebudget::Limit;
use rules::{Actor, Created, PgRulesRepository, RuleDraft, RuleId, RulesRepository, Selector};
use sqlx::migrate::Migrate as _;
use sqlx::PgPool;

use crate::support::helpers::FreshDatabase;

fn draft(scope: &str, rate: f64, per_ms: i64, burst: f64) -> RuleDraft {
    RuleDraft {
        service: None,
        scope: scope.into(),
        selector: Selector::AllDomains,
        rate,
        per_ms: Some(per_ms),
        burst,
        algorithm: None,
        mode: None,
        fail_mode: None,
        priority: None,
        charge: None,
    }
}

/// Rates, periods and bursts around every edge of the rule: the retention boundary to the
/// last bit, the upper bounds, and the floor of one.
fn rule_numbers() -> impl Strategy<Value = (f64, i64, f64)> {
    let at_boundary = (1e-3f64..1e9, prop_oneof![Just(1000i64), 1i64..=86_400_000], -3i64..=3).prop_map(
        |(rate, per_ms, ulps)| {
            let boundary = rate / (per_ms as f64 / 1000.0) * 3600.0;
            (rate, per_ms, f64::from_bits((boundary.to_bits() as i64 + ulps) as u64))
        },
    );
    let anywhere = (
        prop_oneof![1e-6f64..10.0, 1e9f64..2e12],
        prop_oneof![Just(1000i64), 1i64..=86_400_000],
        prop_oneof![0.5f64..10.0, 1e14f64..2e15],
    );
    prop_oneof![at_boundary, anywhere]
}

#[test]
fn a_rule_the_model_accepts_is_stored_and_one_it_refuses_trips_the_check() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let (database, pool) = runtime.block_on(FreshDatabase::create());
    let config = ProptestConfig { cases: 256, ..ProptestConfig::default() };
    proptest!(config, |((rate, per_ms, burst) in rule_numbers())| {
        let accepted = draft("ingest_node", rate, per_ms, burst).validate().is_ok();
        let inserted = runtime.block_on(
            sqlx::query(
                "INSERT INTO plexsphere.rules (rule_id, scope, selector, rate, per_ms, burst, algorithm, mode, fail_mode, priority, version, created_by, updated_at)
                 VALUES ($1, 'ingest_node', '{}', $2, $3, $4, 'TOKEN_BUCKET', 'ENFORCE', 'CLOSED', 0, 1, 'test', now())",
            )
            .bind(uuid::Uuid::new_v4().to_string())
            .bind(rate)
            .bind(i32::try_from(per_ms).unwrap())
            .bind(burst)
            .execute(&pool),
        );
        if let Err(error) = &inserted {
            let constraint = error.as_database_error().and_then(|e| e.constraint());
            prop_assert!(
                matches!(constraint, Some("rules_limit_check" | "rules_per_ms_check")),
                "{}", error
            );
        }
        prop_assert_eq!(accepted, inserted.is_ok(), "{} per {} ms, burst {}", rate, per_ms, burst);
    });
    runtime.block_on(database.drop_database(pool));
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn history_cannot_be_rewritten(pool: PgPool) {
    let repository = PgRulesRepository::new(pool.clone());
    let spec = draft("secret_read_node", 1.0, 1000, 1.0).validate().unwrap();
    let id = RuleId::parse("kept").unwrap();
    repository.create(&id, &spec, &Actor::new("operator").unwrap()).await.unwrap();
    for statement in [
        "UPDATE plexsphere.rule_versions SET created_by = 'someone else'",
        "DELETE FROM plexsphere.rule_versions",
        "TRUNCATE plexsphere.rule_versions",
    ] {
        let error = sqlx::query(statement).execute(&pool).await.unwrap_err();
        assert!(error.to_string().contains("append-only"), "{statement}: {error}");
    }
    assert_eq!(repository.history(&id).await.unwrap().len(), 1);
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn concurrent_creators_of_one_id_get_one_rule_and_every_change_is_announced(pool: PgPool) {
    let mut listener = sqlx::postgres::PgListener::connect_with(&pool).await.unwrap();
    listener.listen(rules::CHANGES_CHANNEL).await.unwrap();
    let repository = Arc::new(PgRulesRepository::new(pool.clone()));
    let id = RuleId::parse("contended").unwrap();
    let actor = Actor::new("operator").unwrap();
    let creates = (0..8).map(|burst| {
        let (repository, id, actor) = (repository.clone(), id.clone(), actor.clone());
        let spec = draft("ingest_domain", 1e6, 1000, 1e6 + f64::from(burst)).validate().unwrap();
        tokio::spawn(async move { repository.create(&id, &spec, &actor).await.unwrap() })
    });
    let outcomes: Vec<Created> =
        futures::future::join_all(creates).await.into_iter().map(Result::unwrap).collect();
    let created = outcomes.iter().filter(|outcome| matches!(outcome, Created::Created(_))).count();
    assert_eq!(created, 1, "{outcomes:?}");
    assert!(outcomes.iter().all(|outcome| match outcome {
        Created::Created(rule) => rule.version.get() == 1,
        Created::Exists(version) => version.get() == 1,
    }));
    assert_eq!(listener.recv().await.unwrap().payload(), "1");
    assert_eq!(repository.revision().await.unwrap(), 1);
    let (revision, loaded) = repository.load().await.unwrap();
    assert_eq!((revision, loaded.len()), (1, 1));
}

#[sqlx::test(migrations = false)]
async fn migration_0056_turns_every_domains_issuance_policy_into_its_override_rule(pool: PgPool) {
    let mut connection = pool.acquire().await.unwrap();
    connection.ensure_migrations_table().await.unwrap();
    for migration in app::migrations::MIGRATOR.iter().filter(|migration| migration.version < 56) {
        connection.apply(migration).await.unwrap();
    }
    drop(connection);
    // Two Domains with policies (one at the retention boundary to the last bit, as 0007 lets
    // through) and one without, created in this order.
    let boundary_rate = 544.7026188767409;
    let boundary_burst = boundary_rate * 3600.0;
    assert!(Limit::new(boundary_rate, boundary_burst).is_ok());
    assert!(Limit::new(boundary_rate, f64::from_bits(boundary_burst.to_bits() + 1)).is_err());
    let domains = [uuid::Uuid::new_v4(), uuid::Uuid::new_v4(), uuid::Uuid::new_v4()];
    for (offset, (id, policy)) in
        domains.iter().zip([Some((0.5, 2.0)), None, Some((boundary_rate, boundary_burst))]).enumerate()
    {
        sqlx::query(
            "INSERT INTO plexsphere.domains (id, name, issuance_per_second, issuance_burst, created_at)
             VALUES ($1, 'd', $2, $3, now() + make_interval(secs => $4))",
        )
        .bind(id)
        .bind(policy.map(|(rate, _)| rate))
        .bind(policy.map(|(_, burst)| burst))
        .bind(offset as f64)
        .execute(&pool)
        .await
        .unwrap();
    }

    app::migrations::MIGRATOR.run(&pool).await.unwrap();

    let repository = PgRulesRepository::new(pool.clone());
    let (revision, rules) = repository.load().await.unwrap();
    assert_eq!((revision, rules.len()), (2, 2));
    for (domain, (rate, burst), expected_revision) in
        [(domains[0], (0.5, 2.0), 1), (domains[2], (boundary_rate, boundary_burst), 2)]
    {
        let id = RuleId::issuance_override(domain);
        let rule = rules.iter().find(|rule| rule.id == id).unwrap();
        assert_eq!(rule.spec.scope(), Some(ratebudget::Scope::AccessIssuanceDomain));
        assert_eq!(rule.spec.selector(), Some(Selector::Domain(domain)));
        assert_eq!(
            rule.spec.limit(),
            Limit::new(rate, burst).unwrap(),
            "the policy's budget, to the last bit"
        );
        assert_eq!((rule.spec.per_ms(), rule.spec.fail_mode()), (1000, rules::FailMode::Closed));
        assert_eq!((rule.version.get(), rule.created_by.as_str()), (1, "migration 0056"));
        let history = repository.history(&id).await.unwrap();
        assert_eq!(history.len(), 1);
        assert_eq!((history[0].change, history[0].revision), (rules::Change::Created, expected_revision));
    }
}
