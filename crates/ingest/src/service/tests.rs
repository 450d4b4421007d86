//! The service's decisions, against mocked ports.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use uuid::Uuid;

use crate::ports::{MockBatchRepository, MockLimiter};
use crate::{IngestError, IngestService, Quota, QuotaError, RepositoryError, Sender};

fn sender() -> Sender {
    Sender { node: Uuid::new_v4().into(), domain: Uuid::new_v4().into() }
}

fn service(repository: MockBatchRepository, limiter: MockLimiter) -> IngestService {
    IngestService::new(Arc::new(repository), Arc::new(limiter))
}

/// A repository that must never be asked to store anything.
fn storing_nothing() -> MockBatchRepository {
    let mut repository = MockBatchRepository::new();
    repository.expect_insert().times(0);
    repository
}

/// A repository that stores one batch and returns its id, sender and payload to the test.
type Stored = Arc<Mutex<Vec<(crate::BatchId, Sender, Vec<u8>)>>>;

fn storing_one() -> (MockBatchRepository, Stored) {
    let stored = Stored::default();
    let mut repository = MockBatchRepository::new();
    let sink = stored.clone();
    repository.expect_insert().times(1).returning(move |id, sender, payload| {
        sink.lock().unwrap().push((id, sender, payload.to_vec()));
        Ok(())
    });
    (repository, stored)
}

fn limiter_answering(answer: fn() -> Result<(), QuotaError>) -> MockLimiter {
    let mut limiter = MockLimiter::new();
    limiter.expect_spend_bytes().times(1).returning(move |_, _| answer());
    limiter
}

#[tokio::test]
async fn the_limiter_is_asked_for_exactly_the_payloads_length_and_the_batch_is_stored() {
    let from = sender();
    let payload = vec![7u8; 1234];
    let mut limiter = MockLimiter::new();
    limiter
        .expect_spend_bytes()
        .withf(move |asked_for, bytes| *asked_for == from && *bytes == 1234)
        .times(1)
        .returning(|_, _| Ok(()));
    let (repository, stored) = storing_one();

    let id = service(repository, limiter).accept(from, &payload).await.unwrap();

    assert_eq!(*stored.lock().unwrap(), vec![(id, from, payload)]);
}

#[tokio::test]
async fn a_node_refusal_is_node_quota_exceeded_with_its_retry_after_and_stores_nothing() {
    let limiter = limiter_answering(|| {
        Err(QuotaError::Exceeded { quota: Quota::Node, retry_after: Duration::from_millis(2500) })
    });

    let error = service(storing_nothing(), limiter).accept(sender(), b"cpu=0.5").await.unwrap_err();

    assert!(
        matches!(error, IngestError::QuotaExceeded { quota: Quota::Node, retry_after } if retry_after == Duration::from_millis(2500)),
        "{error:?}"
    );
}

#[tokio::test]
async fn a_domain_refusal_is_domain_quota_exceeded_with_its_retry_after_and_stores_nothing() {
    let limiter = limiter_answering(|| {
        Err(QuotaError::Exceeded { quota: Quota::Domain, retry_after: Duration::from_secs(4) })
    });

    let error = service(storing_nothing(), limiter).accept(sender(), b"cpu=0.5").await.unwrap_err();

    assert!(
        matches!(error, IngestError::QuotaExceeded { quota: Quota::Domain, retry_after } if retry_after == Duration::from_secs(4)),
        "{error:?}"
    );
}

#[tokio::test]
async fn a_batch_larger_than_a_quota_is_never_admitted_and_stores_nothing() {
    let limiter = limiter_answering(|| Err(QuotaError::LargerThanQuota { quota: Quota::Domain, burst: 4 }));

    let error = service(storing_nothing(), limiter).accept(sender(), b"cpu=0.5").await.unwrap_err();

    assert!(matches!(error, IngestError::LargerThanQuota { quota: Quota::Domain, burst: 4 }), "{error:?}");
}

#[tokio::test]
async fn a_limiter_that_cannot_answer_is_unavailable_and_stores_nothing() {
    let limiter = limiter_answering(|| Err(QuotaError::Unavailable("connection refused".into())));

    let error = service(storing_nothing(), limiter).accept(sender(), b"cpu=0.5").await.unwrap_err();

    let IngestError::Unavailable(cause) = &error else { panic!("expected Unavailable, got {error:?}") };
    // The chain keeps what failed and why; the top message does not print it.
    assert_eq!(error.to_string(), "ingest could not answer");
    assert_eq!(cause.to_string(), "ingest quota could not answer");
    assert_eq!(cause.source().unwrap().to_string(), "connection refused");
}

#[tokio::test]
async fn an_empty_batch_is_refused_as_bad_input_and_neither_spends_nor_stores() {
    let mut limiter = MockLimiter::new();
    limiter.expect_spend_bytes().times(0);

    let error = service(storing_nothing(), limiter).accept(sender(), b"").await.unwrap_err();

    assert!(matches!(error, IngestError::EmptyBatch), "{error:?}");
}

#[tokio::test]
async fn a_batch_store_that_cannot_answer_is_unavailable() {
    let limiter = limiter_answering(|| Ok(()));
    let mut repository = MockBatchRepository::new();
    repository.expect_insert().times(1).returning(|_, _, _| Err(RepositoryError("disk full".into())));

    let error = service(repository, limiter).accept(sender(), b"cpu=0.5").await.unwrap_err();

    let IngestError::Unavailable(cause) = &error else { panic!("expected Unavailable, got {error:?}") };
    assert_eq!(cause.to_string(), "batch store could not answer");
    assert_eq!(cause.source().unwrap().to_string(), "disk full");
}

#[tokio::test]
async fn each_accepted_batch_gets_an_id_of_its_own() {
    let mut limiter = MockLimiter::new();
    limiter.expect_spend_bytes().times(2).returning(|_, _| Ok(()));
    let mut repository = MockBatchRepository::new();
    repository.expect_insert().times(2).returning(|_, _, _| Ok(()));
    let service = service(repository, limiter);
    let from = sender();

    let first = service.accept(from, b"a").await.unwrap();
    let second = service.accept(from, b"a").await.unwrap();

    assert_ne!(first, second);
}
