//! The ingest context's adapters against a real PostgreSQL: batches are committed as sent,
//! wire bytes are what the quotas are charged, and the two quotas are spent all-or-nothing,
//! also under concurrency.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use ingest::{
    BatchRepository, DomainId, IngestError, IngestService, Limiter, NodeId, PgBatchRepository, Quota,
    QuotaError, RateBudgetQuotaLimiter, Sender,
};
use ratebudget::{Limit, ManualClock, Scope};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;
use tokio::sync::Barrier;
use uuid::Uuid;

use crate::support::helpers::{instant, spender, unreachable_pool};

/// A Node quota of 1000 bytes refilling at 250 bytes a second (full in 4 s, the shipped
/// shape), and a Domain quota large enough not to bind unless a test says otherwise.
fn limit(per_second: f64, burst: f64) -> Limit {
    Limit::new(per_second, burst).unwrap()
}

fn node_quota() -> Limit {
    limit(250.0, 1000.0)
}

fn roomy_domain() -> Limit {
    limit(2500.0, 10_000.0)
}

fn sender_in(domain: DomainId) -> Sender {
    Sender { node: NodeId::from(Uuid::new_v4()), domain }
}

fn new_domain() -> DomainId {
    DomainId::from(Uuid::new_v4())
}

fn limiter(pool: &PgPool, clock: &ManualClock, node: Limit, domain: Limit) -> RateBudgetQuotaLimiter {
    RateBudgetQuotaLimiter::new(spender(
        pool,
        clock,
        [(Scope::IngestNode, node), (Scope::IngestDomain, domain)],
    ))
}

fn service(pool: &PgPool, clock: &ManualClock, node: Limit, domain: Limit) -> IngestService {
    IngestService::new(
        Arc::new(PgBatchRepository::new(pool.clone())),
        Arc::new(limiter(pool, clock, node, domain)),
    )
}

/// The stored tokens of one bucket, or None when it has no row.
async fn tokens(pool: &PgPool, scope: &str, key: Uuid) -> Option<f64> {
    sqlx::query_scalar("SELECT tokens FROM plexsphere.rate_budgets WHERE scope = $1 AND bucket_key = $2")
        .bind(scope)
        .bind(key)
        .fetch_optional(pool)
        .await
        .unwrap()
}

async fn node_tokens(pool: &PgPool, sender: Sender) -> Option<f64> {
    tokens(pool, "ingest_node", sender.node.as_uuid()).await
}

async fn domain_tokens(pool: &PgPool, domain: DomainId) -> Option<f64> {
    tokens(pool, "ingest_domain", domain.as_uuid()).await
}

/// The byte counts of every stored batch, in order of size.
async fn stored_byte_counts(pool: &PgPool) -> Vec<i64> {
    sqlx::query_scalar("SELECT byte_count FROM plexsphere.ingest_batches ORDER BY byte_count, id")
        .fetch_all(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn an_accepted_batch_is_committed_with_its_byte_count_payload_node_and_domain(pool: PgPool) {
    let clock = ManualClock::new(instant());
    let sender = sender_in(new_domain());
    let payload = b"cpu=0.25 mem=512\n\x00\xff".to_vec();

    let database_now =
        || sqlx::query_scalar::<_, DateTime<Utc>>("SELECT statement_timestamp()").fetch_one(&pool);
    let before = database_now().await.unwrap();

    let id = service(&pool, &clock, node_quota(), roomy_domain()).accept(sender, &payload).await.unwrap();

    let after = database_now().await.unwrap();
    // Read on a connection of its own: the batch must be committed, not merely written.
    let other = PgPoolOptions::new().max_connections(1).connect_with((*pool.connect_options()).clone());
    let other = other.await.unwrap();
    let (node_id, domain_id, byte_count, stored, received_at): (Uuid, Uuid, i64, Vec<u8>, DateTime<Utc>) =
        sqlx::query_as(
            "SELECT node_id, domain_id, byte_count, payload, received_at
             FROM plexsphere.ingest_batches
             WHERE id = $1",
        )
        .bind(id.as_uuid())
        .fetch_one(&other)
        .await
        .unwrap();
    assert_eq!(node_id, sender.node.as_uuid());
    assert_eq!(domain_id, sender.domain.as_uuid());
    assert_eq!(byte_count, 19);
    assert_eq!(stored, payload);
    // The database's clock stamps the batch, not the limiter's (which stands at instant()).
    assert!(before <= received_at && received_at <= after, "{before} <= {received_at} <= {after}");
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn wire_bytes_are_what_both_quotas_are_charged(pool: PgPool) {
    let clock = ManualClock::new(instant());
    let domain = new_domain();
    let sender = sender_in(domain);
    let service = service(&pool, &clock, node_quota(), roomy_domain());

    service.accept(sender, &[1; 600]).await.unwrap();
    assert_eq!(node_tokens(&pool, sender).await, Some(400.0));
    assert_eq!(domain_tokens(&pool, domain).await, Some(9400.0));

    // 500 bytes do not fit in the 400 left; the wait is what the missing 100 take at 250/s.
    let refused = service.accept(sender, &[2; 500]).await.unwrap_err();
    assert!(
        matches!(refused, IngestError::QuotaExceeded { quota: Quota::Node, retry_after } if retry_after == Duration::from_millis(400)),
        "{refused:?}"
    );
    assert_eq!(node_tokens(&pool, sender).await, Some(400.0));
    assert_eq!(domain_tokens(&pool, domain).await, Some(9400.0));

    service.accept(sender, &[3; 400]).await.unwrap();
    assert_eq!(node_tokens(&pool, sender).await, Some(0.0));
    assert_eq!(domain_tokens(&pool, domain).await, Some(9000.0));
    assert_eq!(stored_byte_counts(&pool).await, vec![400, 600]);
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn the_node_quota_refills_as_the_clock_moves(pool: PgPool) {
    let clock = ManualClock::new(instant());
    let sender = sender_in(new_domain());
    let service = service(&pool, &clock, node_quota(), roomy_domain());
    service.accept(sender, &[0; 1000]).await.unwrap();
    assert!(matches!(
        service.accept(sender, b"x").await,
        Err(IngestError::QuotaExceeded { quota: Quota::Node, .. })
    ));

    // One second at 250 bytes a second covers 250 bytes and not one more.
    clock.advance(chrono::Duration::seconds(1));
    assert!(matches!(
        service.accept(sender, &[0; 251]).await,
        Err(IngestError::QuotaExceeded { quota: Quota::Node, .. })
    ));
    service.accept(sender, &[0; 250]).await.unwrap();
    assert!(matches!(
        service.accept(sender, b"x").await,
        Err(IngestError::QuotaExceeded { quota: Quota::Node, .. })
    ));

    // An hour later the quota is full again, and no fuller: refill is capped at the burst.
    clock.advance(chrono::Duration::hours(1));
    service.accept(sender, &[0; 1000]).await.unwrap();
    assert_eq!(node_tokens(&pool, sender).await, Some(0.0));
    assert_eq!(stored_byte_counts(&pool).await, vec![250, 1000, 1000]);
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn the_domain_quota_refuses_while_the_node_has_budget_and_the_node_is_not_debited(pool: PgPool) {
    let clock = ManualClock::new(instant());
    let domain = new_domain();
    // 400 bytes a second, so the Domain's wait for the 200 bytes it lacks is exactly 0.5 s.
    let small_domain = limit(400.0, 1500.0);
    let service = service(&pool, &clock, node_quota(), small_domain);
    let (thrifty, busy) = (sender_in(domain), sender_in(domain));

    service.accept(thrifty, &[0; 100]).await.unwrap();
    service.accept(busy, &[0; 1000]).await.unwrap();
    assert_eq!(domain_tokens(&pool, domain).await, Some(400.0));

    // The thrifty Node has 900 bytes left, but its Domain only 400.
    let refused = service.accept(thrifty, &[0; 600]).await.unwrap_err();
    assert!(
        matches!(refused, IngestError::QuotaExceeded { quota: Quota::Domain, retry_after } if retry_after == Duration::from_millis(500)),
        "{refused:?}"
    );
    assert_eq!(node_tokens(&pool, thrifty).await, Some(900.0));
    assert_eq!(domain_tokens(&pool, domain).await, Some(400.0));
    assert_eq!(stored_byte_counts(&pool).await, vec![100, 1000]);
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn batches_from_many_nodes_through_two_pools_at_one_instant_never_overspend_their_domain(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let open = || PgPoolOptions::new().max_connections(8).connect_with(connect.clone());
    let pools = [open().await.unwrap(), open().await.unwrap()];
    let clock = ManualClock::new(instant());
    let domain = new_domain();
    // 10 Nodes with 10 batches each: 3000 bytes a Node, well inside its 5000, so only the
    // Domain binds, and it covers floor(10000 / 300) = 33 batches.
    let (size, batches, domain_burst) = (300usize, 100usize, 10_000.0);
    let node_budget = limit(1250.0, 5000.0);
    let domain_budget = limit(2500.0, domain_burst);
    let services = [
        service(&pools[0], &clock, node_budget, domain_budget),
        service(&pools[1], &clock, node_budget, domain_budget),
    ];
    let senders: Vec<Sender> = (0..10).map(|_| sender_in(domain)).collect();
    let barrier = Arc::new(Barrier::new(batches));
    let tasks: Vec<_> = (0..batches)
        .map(|i| {
            let service = services[i % 2].clone();
            let sender = senders[i % senders.len()];
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                service.accept(sender, &vec![0; size]).await
            })
        })
        .collect();

    let mut admitted = 0;
    for task in tasks {
        match task.await.unwrap() {
            Ok(_) => admitted += 1,
            Err(IngestError::QuotaExceeded { quota: Quota::Domain, .. }) => {}
            Err(other) => panic!("only the Domain may refuse, got {other:?}"),
        }
    }

    assert_eq!(admitted, 33);
    assert_eq!(stored_byte_counts(&pools[0]).await, vec![300; 33]);
    assert_eq!(domain_tokens(&pools[0], domain).await, Some(100.0));
    let mut spent_by_nodes = 0.0;
    for sender in &senders {
        if let Some(left) = node_tokens(&pools[0], *sender).await {
            spent_by_nodes += 5000.0 - left;
        }
    }
    assert_eq!(spent_by_nodes, 9900.0, "every Node debit has its Domain debit and no other");
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn the_table_keeps_byte_count_equal_to_the_payload_length(pool: PgPool) {
    let insert = |byte_count: i64, payload: &'static [u8]| {
        sqlx::query(
            "INSERT INTO plexsphere.ingest_batches (id, node_id, domain_id, byte_count, payload)
             VALUES (gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), $1, $2)",
        )
        .bind(byte_count)
        .bind(payload)
        .execute(&pool)
    };
    for (byte_count, payload) in [(4, &b"abc"[..]), (-1, &b""[..])] {
        let error = insert(byte_count, payload).await.unwrap_err();
        let database_error = error.as_database_error().expect("a constraint violation");
        assert_eq!(database_error.code().as_deref(), Some("23514"), "{byte_count}");
        assert_eq!(database_error.constraint(), Some("ingest_batches_byte_count_check"));
    }
    insert(3, b"abc").await.unwrap();
    insert(0, b"").await.unwrap();
}

#[tokio::test]
async fn a_limiter_that_cannot_reach_its_store_is_unavailable_never_a_refusal() {
    let clock = ManualClock::new(instant());
    let pool = unreachable_pool();
    let sender = sender_in(new_domain());

    let quotas = limiter(&pool, &clock, node_quota(), roomy_domain());
    let error = quotas.spend_bytes(sender, 100).await.unwrap_err();
    assert!(matches!(error, QuotaError::Unavailable(_)), "{error:?}");

    let error =
        service(&pool, &clock, node_quota(), roomy_domain()).accept(sender, &[0; 100]).await.unwrap_err();
    assert!(matches!(error, IngestError::Unavailable(_)), "{error:?}");

    let error = PgBatchRepository::new(pool.clone())
        .insert(ingest::BatchId::random(), sender, b"x")
        .await
        .unwrap_err();
    assert_eq!(error.to_string(), "batch store could not answer");
}

#[tokio::test]
async fn a_batch_above_the_node_burst_is_larger_than_the_quota_without_a_query() {
    // Such a batch can never fit, so it is answered before any query (here, one that could
    // not be sent) as never admissible, not as a refusal with a wait that would not help.
    let clock = ManualClock::new(instant());
    let quotas = limiter(&unreachable_pool(), &clock, node_quota(), roomy_domain());
    let error = quotas.spend_bytes(sender_in(new_domain()), 1001).await.unwrap_err();
    assert!(matches!(error, QuotaError::LargerThanQuota { quota: Quota::Node, burst: 1000 }), "{error:?}");
}
