use std::sync::Arc;
use std::time::Duration;

use mockall::Sequence;
use uuid::Uuid;

use crate::ports::{MockLimiter, MockSecretRepository};
use crate::{
    DomainId, Keyring, NodeId, OpenError, ReadError, ReadLimitError, Reader, RekeyBatch, RekeyError,
    RepositoryError, Secret, SecretName, SecretRef, SecretValue, SecretsKey, SecretsService, StoredSecret,
    StoredValue, WriteError,
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

/// The keyring every test service seals with: current key 2, old key 1.
fn keyring() -> Keyring {
    Keyring::new(SecretsKey::from_bytes(&[2; 32]), [old_key()])
}

fn old_key() -> SecretsKey {
    SecretsKey::from_bytes(&[1; 32])
}

/// `value` as the store would hold it after a write under `keyring`.
fn sealed_by(keyring: &Keyring, domain: DomainId, name: &SecretName, value: &str) -> StoredValue {
    StoredValue::Sealed(keyring.seal(domain, name, &SecretValue::new(value).unwrap()))
}

fn service(repository: MockSecretRepository, limiter: MockLimiter) -> SecretsService {
    SecretsService::new(Arc::new(repository), Arc::new(limiter), Arc::new(keyring()))
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
        .returning(|domain, name| Ok(Some(sealed_by(&keyring(), domain, name, "hunter2"))));
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
        .returning(move |domain, name| {
            Ok((domain == domain_a).then(|| sealed_by(&keyring(), domain, name, "domain a's secret")))
        });
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
        .withf(move |d, n, sealed| {
            let opened = keyring().open(*d, n, &StoredValue::Sealed(sealed.clone()));
            *d == domain
                && n.as_str() == "api-key"
                && sealed.key_id() == keyring().current_key_id()
                && opened == Ok(value("abc123"))
        })
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

#[tokio::test]
async fn a_value_that_does_not_open_is_unreadable_not_missing() {
    let reader = reader();
    let other_domain = DomainId::from(Uuid::new_v4());
    let mut repository = MockSecretRepository::new();
    // Sealed for another Domain, then copied under this one: it must not open here.
    repository
        .expect_get()
        .times(1)
        .returning(move |_, name| Ok(Some(sealed_by(&keyring(), other_domain, name, "x"))));
    let error = service(repository, admits_once(reader)).read(reader, &name("token")).await.unwrap_err();
    assert!(matches!(error, ReadError::Unreadable(OpenError::NotAuthentic(_))), "{error:?}");
}

fn stored(domain: DomainId, text: &str, value: StoredValue) -> StoredSecret {
    StoredSecret { secret: SecretRef { domain, name: name(text) }, value }
}

#[tokio::test]
async fn rekey_reseals_old_keys_and_plaintext_under_the_current_key_and_resumes_after_a_full_batch() {
    let domain = DomainId::from(Uuid::new_v4());
    let old_keyring = Keyring::new(old_key(), []);
    let batch = vec![
        stored(domain, "a", sealed_by(&old_keyring, domain, &name("a"), "from the old key")),
        stored(domain, "b", StoredValue::Plaintext(value("written before sealing"))),
    ];
    let mut repository = MockSecretRepository::new();
    let listed = batch.clone();
    repository
        .expect_not_sealed_under()
        .withf(|key, after, limit| key == keyring().current_key_id() && after.is_none() && *limit == 2)
        .times(1)
        .returning(move |_, _, _| Ok(listed.clone()));
    let expected = [("a", "from the old key"), ("b", "written before sealing")];
    repository
        .expect_replace()
        .withf(move |stored, sealed| {
            let secret = &stored.secret;
            let opened = keyring().open(secret.domain, &secret.name, &StoredValue::Sealed(sealed.clone()));
            sealed.key_id() == keyring().current_key_id()
                && expected.iter().any(|(n, v)| secret.name.as_str() == *n && opened == Ok(value(v)))
        })
        .times(2)
        .returning(|_, _| Ok(true));
    let done = service(repository, MockLimiter::new()).rekey_batch(None, 2).await.unwrap();
    assert_eq!(
        done,
        RekeyBatch {
            resealed: 1,
            sealed_from_plaintext: 1,
            replaced_meanwhile: 0,
            next: Some(SecretRef { domain, name: name("b") }),
        }
    );
}

#[tokio::test]
async fn rekey_leaves_a_value_written_meanwhile_and_ends_on_a_short_batch() {
    let domain = DomainId::from(Uuid::new_v4());
    let mut repository = MockSecretRepository::new();
    repository
        .expect_not_sealed_under()
        .times(1)
        .returning(move |_, _, _| Ok(vec![stored(domain, "a", StoredValue::Plaintext(value("v")))]));
    repository.expect_replace().times(1).returning(|_, _| Ok(false));
    let after = SecretRef { domain, name: name("0") };
    let done = service(repository, MockLimiter::new()).rekey_batch(Some(&after), 10).await.unwrap();
    assert_eq!(done, RekeyBatch { resealed: 0, sealed_from_plaintext: 0, replaced_meanwhile: 1, next: None });
}

#[tokio::test]
async fn rekey_stops_at_a_value_no_key_opens_and_names_it() {
    let domain = DomainId::from(Uuid::new_v4());
    let forgotten = Keyring::new(SecretsKey::from_bytes(&[9; 32]), []);
    let mut repository = MockSecretRepository::new();
    repository.expect_not_sealed_under().times(1).returning(move |_, _, _| {
        Ok(vec![stored(domain, "lost", sealed_by(&forgotten, domain, &name("lost"), "v"))])
    });
    // No expectation on replace: nothing may be written.
    let error = service(repository, MockLimiter::new()).rekey_batch(None, 10).await.unwrap_err();
    match error {
        RekeyError::Unreadable { secret, source: OpenError::UnknownKey(_) } => {
            assert_eq!(secret, SecretRef { domain, name: name("lost") });
        }
        other => panic!("expected Unreadable, got {other:?}"),
    }
}
