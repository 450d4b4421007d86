use chrono::{DateTime, Utc};

use super::*;
use crate::ports::MockRulesRepository;
use crate::{RuleDraft, Selector};

fn id() -> RuleId {
    RuleId::parse("premium-reads").unwrap()
}

fn spec() -> RuleSpec {
    RuleDraft {
        service: None,
        scope: "secret_read_node".into(),
        selector: Selector::AllDomains,
        rate: 5.0,
        per_ms: None,
        burst: 10.0,
        algorithm: None,
        mode: None,
        fail_mode: None,
        priority: None,
        charge: None,
    }
    .validate()
    .unwrap()
}

fn actor() -> Actor {
    Actor::new("operator").unwrap()
}

fn version(number: i64) -> Version {
    Version::new(number).unwrap()
}

fn rule(number: i64) -> Rule {
    Rule {
        id: id(),
        spec: spec(),
        version: version(number),
        created_by: actor(),
        updated_at: DateTime::<Utc>::UNIX_EPOCH,
    }
}

fn service(repository: MockRulesRepository) -> RulesService {
    RulesService::new(Arc::new(repository))
}

#[tokio::test]
async fn a_put_without_a_version_creates_and_never_replaces() {
    let mut repository = MockRulesRepository::new();
    repository.expect_create().times(1).returning(|_, _, _| Ok(Created::Created(rule(1))));
    repository.expect_replace().times(0);
    let put = service(repository).put(&id(), &spec(), None, &actor()).await.unwrap();
    assert_eq!(put, Put::Created(rule(1)));

    let mut repository = MockRulesRepository::new();
    repository.expect_create().times(1).returning(|_, _, _| Ok(Created::Exists(version(4))));
    let refused = service(repository).put(&id(), &spec(), None, &actor()).await.unwrap_err();
    assert!(
        matches!(refused, WriteError::PreconditionRequired { current } if current == version(4)),
        "{refused:?}"
    );
}

#[tokio::test]
async fn a_put_with_a_version_replaces_only_that_version() {
    let mut repository = MockRulesRepository::new();
    repository
        .expect_replace()
        .withf(|_, _, expected, _| *expected == version(2))
        .times(1)
        .returning(|_, _, _, _| Ok(Replaced::Stale { current: Some(version(3)) }));
    repository.expect_create().times(0);
    let refused = service(repository).put(&id(), &spec(), Some(version(2)), &actor()).await.unwrap_err();
    assert!(
        matches!(refused, WriteError::PreconditionFailed { current: Some(current) } if current == version(3)),
        "{refused:?}"
    );
}

#[tokio::test]
async fn a_rollback_says_why_it_wrote_nothing() {
    for (answer, expected) in [
        (RolledBack::UnknownRule, "no such rule"),
        (RolledBack::UnknownVersion, "the rule has no version 2"),
        (RolledBack::DeletionVersion, "version 2 deleted the rule; roll back to a version that defined it"),
        (RolledBack::Stale { current: None }, "the rule is not at the version named"),
    ] {
        let mut repository = MockRulesRepository::new();
        repository.expect_rollback().times(1).return_once(move |_, _, _, _| Ok(answer));
        let error = service(repository).rollback(&id(), version(2), None, &actor()).await.unwrap_err();
        assert_eq!(error.to_string(), expected);
    }
    let mut repository = MockRulesRepository::new();
    repository
        .expect_rollback()
        .times(1)
        .returning(|_, _, _, _| Ok(RolledBack::Applied { rule: rule(6), recreated: true }));
    let put = service(repository).rollback(&id(), version(2), None, &actor()).await.unwrap();
    assert_eq!(put, Put::Created(rule(6)), "a rollback that recreates a deleted rule creates it");
}

#[tokio::test]
async fn nothing_to_count_costs_no_statement() {
    let mut repository = MockRulesRepository::new();
    repository.expect_add_usage().times(0);
    service(repository).add_usage(&[]).await.unwrap();
}
