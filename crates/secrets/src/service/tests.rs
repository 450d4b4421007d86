use std::sync::Arc;
use std::time::Duration;

use mockall::Sequence;
use uuid::Uuid;

use crate::ports::{MockLimiter, MockSecretRepository};
use crate::{
    DomainId, NodeId, ReadError, ReadLimitError, Reader, RepositoryError, Secret, SecretName, SecretValue,
    SecretsService, WriteError,
};

fn reader() -> Reader {
    Reader { node: NodeId::from(Uuid::new_v4()), domain: DomainId::from(Uuid::new_v4()) }
}

fn name(text: &str) -> SecretName {
    SecretName::parse(text).unwrap()
}

fn value(text: &str) -> SecretValue {
    SecretValue::new(text).unwrap()
}

fn service(repository: MockSecretRepository, limiter: MockLimiter) -> SecretsService {
    SecretsService::new(Arc::new(repository), Arc::new(limiter))
}

/// A limiter that admits exactly one read, by `reader`.
fn admits_once(reader: Reader) -> MockLimiter {
    let mut limiter = MockLimiter::new();
    limiter.expect_spend_read().withf(move |r| *r == reader).times(1).returning(|_| Ok(()));
    limiter
}

/// A limiter that refuses exactly one read, by `reader`, with `refusal`.
fn refuses_once(reader: Reader, refusal: fn() -> ReadLimitError) -> MockLimiter {
    let mut limiter = MockLimiter::new();
    limiter.expect_spend_read().withf(move |r| *r == reader).times(1).returning(move |_| Err(refusal()));
    limiter
}

#[tokio::test]
async fn a_read_in_the_readers_own_domain_returns_the_secret() {
    let reader = reader();
    let mut repository = MockSecretRepository::new();
    repository
        .expect_get()
        .withf(move |domain, n| *domain == reader.domain && n.as_str() == "db-password")
        .times(1)
        .returning(|_, _| Ok(Some(value("hunter2"))));
    let secret = service(repository, admits_once(reader)).read(reader, &name("db-password")).await.unwrap();
    assert_eq!(secret, Secret { name: name("db-password"), value: value("hunter2") });
}

#[tokio::test]
async fn a_node_refusal_is_node_rate_limited_with_its_retry_after_and_looks_nothing_up() {
    let reader = reader();
    let limiter =
        refuses_once(reader, || ReadLimitError::NodeRateLimited { retry_after: Duration::from_millis(500) });
    // No expectation: a lookup would panic the mock.
    let repository = MockSecretRepository::new();
    let error = service(repository, limiter).read(reader, &name("token")).await.unwrap_err();
    assert!(
        matches!(error, ReadError::NodeRateLimited { retry_after } if retry_after == Duration::from_millis(500)),
        "{error:?}"
    );
}

#[tokio::test]
async fn a_domain_refusal_is_domain_rate_limited_with_its_retry_after_and_looks_nothing_up() {
    let reader = reader();
    let limiter =
        refuses_once(reader, || ReadLimitError::DomainRateLimited { retry_after: Duration::from_secs(3) });
    let repository = MockSecretRepository::new();
    let error = service(repository, limiter).read(reader, &name("token")).await.unwrap_err();
    assert!(
        matches!(error, ReadError::DomainRateLimited { retry_after } if retry_after == Duration::from_secs(3)),
        "{error:?}"
    );
}

#[tokio::test]
async fn a_limiter_that_cannot_answer_makes_the_read_unavailable_and_the_repository_is_never_asked() {
    let reader = reader();
    let limiter = refuses_once(reader, || ReadLimitError::Unavailable("connection refused".into()));
    let repository = MockSecretRepository::new();
    let error = service(repository, limiter).read(reader, &name("token")).await.unwrap_err();
    match error {
        ReadError::Unavailable(source) => assert_eq!(source.to_string(), "connection refused"),
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

#[tokio::test]
async fn a_node_never_reads_another_domains_secret() {
    let domain_a = DomainId::from(Uuid::new_v4());
    let reader_of_b = reader();
    let mut repository = MockSecretRepository::new();
    // The store holds "token" under Domain A only, and answers by the Domain it is asked for.
    repository
        .expect_get()
        .withf(move |domain, n| *domain == reader_of_b.domain && n.as_str() == "token")
        .times(1)
        .returning(move |domain, _| Ok((domain == domain_a).then(|| value("domain a's secret"))));
    let error =
        service(repository, admits_once(reader_of_b)).read(reader_of_b, &name("token")).await.unwrap_err();
    assert!(matches!(error, ReadError::NotFound), "{error:?}");
}

#[tokio::test]
async fn the_budget_is_spent_before_the_lookup_even_when_the_secret_is_missing() {
    let reader = reader();
    let mut order = Sequence::new();
    let mut limiter = MockLimiter::new();
    limiter
        .expect_spend_read()
        .withf(move |r| *r == reader)
        .times(1)
        .in_sequence(&mut order)
        .returning(|_| Ok(()));
    let mut repository = MockSecretRepository::new();
    repository
        .expect_get()
        .withf(move |domain, n| *domain == reader.domain && n.as_str() == "no-such-secret")
        .times(1)
        .in_sequence(&mut order)
        .returning(|_, _| Ok(None));
    let error = service(repository, limiter).read(reader, &name("no-such-secret")).await.unwrap_err();
    assert!(matches!(error, ReadError::NotFound), "{error:?}");
}

#[tokio::test]
async fn a_store_that_cannot_answer_a_read_is_unavailable_not_not_found() {
    let reader = reader();
    let mut repository = MockSecretRepository::new();
    repository.expect_get().times(1).returning(|_, _| Err(RepositoryError("disk on fire".into())));
    let error = service(repository, admits_once(reader)).read(reader, &name("token")).await.unwrap_err();
    match error {
        ReadError::Unavailable(source) => {
            assert_eq!(source.to_string(), "secret store could not answer");
            assert_eq!(source.source().unwrap().to_string(), "disk on fire");
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

#[tokio::test]
async fn a_write_puts_the_value_under_its_domain_and_spends_no_budget() {
    let domain = DomainId::from(Uuid::new_v4());
    let mut repository = MockSecretRepository::new();
    repository
        .expect_put()
        .withf(move |d, n, v| *d == domain && n.as_str() == "api-key" && v.expose() == "abc123")
        .times(1)
        .returning(|_, _, _| Ok(()));
    // No expectation on the limiter: writes are not rate limited, and a spend would panic.
    let limiter = MockLimiter::new();
    service(repository, limiter).write(domain, name("api-key"), value("abc123")).await.unwrap();
}

#[tokio::test]
async fn a_write_the_store_cannot_answer_is_unavailable() {
    let mut repository = MockSecretRepository::new();
    repository.expect_put().times(1).returning(|_, _, _| Err(RepositoryError("disk on fire".into())));
    let error = service(repository, MockLimiter::new())
        .write(DomainId::from(Uuid::new_v4()), name("api-key"), value("abc123"))
        .await
        .unwrap_err();
    let WriteError::Unavailable(source) = error;
    assert_eq!(source.to_string(), "secret store could not answer");
}
