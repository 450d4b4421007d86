use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::*;
use crate::ports::{MockAccessRepository, MockLimiter};
use crate::{DomainName, IssuanceLimitError, TokenHash};

fn domain() -> Domain {
    Domain { id: DomainId::random(), name: DomainName::parse("fleet").unwrap(), tier: Tier::DEFAULT }
}

fn node_name() -> NodeName {
    NodeName::parse("edge-1").unwrap()
}

fn service(repository: MockAccessRepository, limiter: MockLimiter) -> AccessService {
    AccessService::new(Arc::new(repository), Arc::new(limiter))
}

/// A repository that knows exactly `domain` and expects `inserts` Node inserts.
fn repository_with(domain: &Domain, inserts: usize) -> MockAccessRepository {
    let mut repository = MockAccessRepository::new();
    let known = domain.clone();
    repository
        .expect_find_domain()
        .withf(move |id| *id == known.id)
        .times(1)
        .returning(move |_| Ok(Some(known.clone())));
    repository.expect_insert_node().times(inserts).returning(|_, _| Ok(()));
    repository
}

fn store_down() -> RepositoryError {
    RepositoryError("connection refused".into())
}

#[tokio::test]
async fn an_enrolment_the_limiter_refuses_is_rate_limited_with_its_retry_after_and_stores_no_node() {
    let domain = domain();
    let repository = repository_with(&domain, 0);
    let mut limiter = MockLimiter::new();
    limiter
        .expect_spend_issuance()
        .times(1)
        .returning(|_| Err(IssuanceLimitError::RateLimited { retry_after: Duration::from_millis(2500) }));

    let result = service(repository, limiter).enrol_node(domain.id, node_name()).await;

    match result {
        Err(EnrolError::IssuanceRateLimited { retry_after }) => {
            assert_eq!(retry_after, Duration::from_millis(2500));
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn a_limiter_that_cannot_answer_makes_enrolment_unavailable_not_refused() {
    let domain = domain();
    let repository = repository_with(&domain, 0);
    let mut limiter = MockLimiter::new();
    limiter
        .expect_spend_issuance()
        .times(1)
        .returning(|_| Err(IssuanceLimitError::Unavailable("pool timed out".into())));

    let result = service(repository, limiter).enrol_node(domain.id, node_name()).await;

    let Err(EnrolError::Unavailable(error)) = result else {
        panic!("expected Unavailable, got {result:?}");
    };
    // The cause stays reachable for the log.
    assert_eq!(error.to_string(), "issuance limiter could not answer");
    assert_eq!(error.source().unwrap().to_string(), "pool timed out");
}

#[tokio::test]
async fn an_unknown_domain_is_refused_without_spending_any_budget() {
    let unknown = DomainId::random();
    let mut repository = MockAccessRepository::new();
    repository.expect_find_domain().withf(move |id| *id == unknown).times(1).returning(|_| Ok(None));
    repository.expect_insert_node().times(0);
    let mut limiter = MockLimiter::new();
    limiter.expect_spend_issuance().times(0);

    let result = service(repository, limiter).enrol_node(unknown, node_name()).await;

    assert!(matches!(result, Err(EnrolError::UnknownDomain(id)) if id == unknown), "{result:?}");
}

#[tokio::test]
async fn a_store_that_cannot_find_the_domain_makes_enrolment_unavailable_without_spending() {
    let mut repository = MockAccessRepository::new();
    repository.expect_find_domain().times(1).returning(|_| Err(store_down()));
    repository.expect_insert_node().times(0);
    let mut limiter = MockLimiter::new();
    limiter.expect_spend_issuance().times(0);

    let result = service(repository, limiter).enrol_node(DomainId::random(), node_name()).await;

    assert!(matches!(result, Err(EnrolError::Unavailable(_))), "{result:?}");
}

#[tokio::test]
async fn the_limiter_is_asked_for_the_domains_issuance() {
    let domain = domain();
    let repository = repository_with(&domain, 1);
    let mut limiter = MockLimiter::new();
    let id = domain.id;
    limiter.expect_spend_issuance().withf(move |asked_for| *asked_for == id).times(1).returning(|_| Ok(()));

    service(repository, limiter).enrol_node(domain.id, node_name()).await.unwrap();
}

#[tokio::test]
async fn an_enrolment_stores_the_node_with_the_hash_of_the_token_it_returns() {
    let domain = domain();
    let mut repository = MockAccessRepository::new();
    let known = domain.clone();
    repository.expect_find_domain().times(1).returning(move |_| Ok(Some(known.clone())));
    let stored: Arc<Mutex<Option<(Node, TokenHash)>>> = Arc::default();
    let sink = stored.clone();
    repository.expect_insert_node().times(1).returning(move |node, hash| {
        *sink.lock().unwrap() = Some((node.clone(), *hash));
        Ok(())
    });
    let mut limiter = MockLimiter::new();
    limiter.expect_spend_issuance().times(1).returning(|_| Ok(()));

    let enrolment = service(repository, limiter).enrol_node(domain.id, node_name()).await.unwrap();

    assert_eq!(enrolment.node.domain_id, domain.id);
    assert_eq!(enrolment.node.name, node_name());
    let (node, hash) = stored.lock().unwrap().clone().unwrap();
    assert_eq!(node, enrolment.node);
    assert_eq!(hash, enrolment.token.hash());
    assert!(NodeToken::parse(enrolment.token.expose()).is_ok());
}

#[tokio::test]
async fn a_store_that_cannot_insert_the_node_makes_enrolment_unavailable() {
    let domain = domain();
    let mut repository = MockAccessRepository::new();
    let known = domain.clone();
    repository.expect_find_domain().times(1).returning(move |_| Ok(Some(known.clone())));
    repository.expect_insert_node().times(1).returning(|_, _| Err(store_down()));
    let mut limiter = MockLimiter::new();
    limiter.expect_spend_issuance().times(1).returning(|_| Ok(()));

    let result = service(repository, limiter).enrol_node(domain.id, node_name()).await;

    assert!(matches!(result, Err(EnrolError::Unavailable(_))), "{result:?}");
}

#[tokio::test]
async fn authenticate_finds_the_node_by_the_hash_of_the_token() {
    let token = NodeToken::generate();
    let expected = AuthenticatedNode { node_id: NodeId::random(), domain_id: DomainId::random() };
    let mut repository = MockAccessRepository::new();
    let hash = token.hash();
    repository
        .expect_find_node_by_token()
        .withf(move |asked| *asked == hash)
        .times(1)
        .returning(move |_| Ok(Some(expected)));

    let found = service(repository, MockLimiter::new()).authenticate(token.expose()).await.unwrap();

    assert_eq!(found, expected);
}

#[tokio::test]
async fn authenticate_reports_a_well_formed_token_nobody_holds_as_unknown() {
    let mut repository = MockAccessRepository::new();
    repository.expect_find_node_by_token().times(1).returning(|_| Ok(None));

    let result = service(repository, MockLimiter::new()).authenticate(NodeToken::generate().expose()).await;

    assert!(matches!(result, Err(AuthError::UnknownToken)), "{result:?}");
}

#[tokio::test]
async fn authenticate_reports_a_malformed_token_without_asking_the_store() {
    let mut repository = MockAccessRepository::new();
    repository.expect_find_node_by_token().times(0);
    let service = service(repository, MockLimiter::new());

    for text in ["", "psn_short", "Bearer psn_x", "not a token at all"] {
        let result = service.authenticate(text).await;
        assert!(matches!(result, Err(AuthError::MalformedToken)), "{text:?}: {result:?}");
    }
}

#[tokio::test]
async fn authenticate_against_a_store_that_cannot_answer_is_unavailable() {
    let mut repository = MockAccessRepository::new();
    repository.expect_find_node_by_token().times(1).returning(|_| Err(store_down()));

    let result = service(repository, MockLimiter::new()).authenticate(NodeToken::generate().expose()).await;

    assert!(matches!(result, Err(AuthError::Unavailable(_))), "{result:?}");
}

#[tokio::test]
async fn create_domain_stores_the_domain_under_its_id_and_returns_it() {
    let stored: Arc<Mutex<Option<Domain>>> = Arc::default();
    let sink = stored.clone();
    let mut repository = MockAccessRepository::new();
    repository.expect_insert_domain().times(1).returning(move |domain| {
        *sink.lock().unwrap() = Some(domain.clone());
        Ok(())
    });
    let service = service(repository, MockLimiter::new());

    let id = DomainId::random();
    let new = NewDomain { id, name: DomainName::parse("fleet").unwrap(), tier: Tier::Premium };
    let created = service.create_domain(new).await.unwrap();

    assert_eq!((created.id, created.name.as_str(), created.tier), (id, "fleet", Tier::Premium));
    assert_eq!(stored.lock().unwrap().as_ref(), Some(&created));
}

#[tokio::test]
async fn create_domain_with_a_name_another_domain_has_names_that_domain() {
    let existing = DomainId::random();
    let mut repository = MockAccessRepository::new();
    repository
        .expect_insert_domain()
        .times(1)
        .returning(move |_| Err(crate::InsertDomainError::NameTaken { existing }));
    let new =
        NewDomain { id: DomainId::random(), name: DomainName::parse("fleet").unwrap(), tier: Tier::Free };
    let result = service(repository, MockLimiter::new()).create_domain(new).await;

    assert!(
        matches!(&result, Err(CreateDomainError::NameTaken { name, existing: taken }) if name == "fleet" && *taken == existing),
        "{result:?}"
    );
}

#[tokio::test]
async fn create_domain_against_a_store_that_cannot_answer_is_unavailable() {
    let mut repository = MockAccessRepository::new();
    repository.expect_insert_domain().times(1).returning(|_| Err(store_down().into()));

    let new =
        NewDomain { id: DomainId::random(), name: DomainName::parse("fleet").unwrap(), tier: Tier::Free };
    let result = service(repository, MockLimiter::new()).create_domain(new).await;

    assert!(matches!(result, Err(CreateDomainError::Unavailable(_))), "{result:?}");
}

#[tokio::test]
async fn revoking_deletes_the_domains_node_and_an_unknown_one_is_named() {
    let (domain_id, node_id) = (DomainId::random(), NodeId::random());
    let mut repository = MockAccessRepository::new();
    repository
        .expect_delete_node()
        .withf(move |domain, node| *domain == domain_id && *node == node_id)
        .times(1)
        .returning(|_, _| Ok(true));
    repository.expect_delete_node().times(1).returning(|_, _| Ok(false));
    repository.expect_delete_node().times(1).returning(|_, _| Err(store_down()));
    let service = service(repository, MockLimiter::new());
    service.revoke_node(domain_id, node_id).await.unwrap();
    let unknown = service.revoke_node(domain_id, node_id).await.unwrap_err();
    assert!(
        matches!(unknown, RevokeError::UnknownNode { domain, node } if domain == domain_id && node == node_id),
        "{unknown:?}"
    );
    let down = service.revoke_node(domain_id, node_id).await.unwrap_err();
    assert!(matches!(down, RevokeError::Unavailable(_)), "{down:?}");
}
