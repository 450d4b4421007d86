//! The secrets context's adapters against a real PostgreSQL: the secret store, the read
//! limiter on the shared rate budgets, and the service wired to both.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use ratebudget::{Clock, Limit, ManualClock, Scope};
use secrets::{
    DomainId, Keyring, Limiter, NodeId, OpenError, PgSecretRepository, RateBudgetReadLimiter, ReadError,
    ReadLimitError, Reader, SecretName, SecretRef, SecretRepository, SecretValue, SecretsKey, SecretsService,
    StoredSecret, StoredValue,
};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;
use tokio::sync::Barrier;

use crate::support::helpers::{instant, spender, unreachable_pool};

fn domain() -> DomainId {
    uuid::Uuid::new_v4().into()
}

fn reader_in(domain: DomainId) -> Reader {
    Reader { node: uuid::Uuid::new_v4().into(), domain }
}

fn name(text: &str) -> SecretName {
    SecretName::parse(text).unwrap()
}

fn value(text: &str) -> SecretValue {
    SecretValue::new(text).unwrap()
}

fn key(byte: u8) -> SecretsKey {
    SecretsKey::from_bytes(&[byte; 32])
}

/// The keyring the store tests seal with.
fn keyring() -> Keyring {
    Keyring::new(key(1), [])
}

/// Puts `text` as `domain`'s secret `name`, sealed as the service would.
async fn put(repository: &PgSecretRepository, domain: DomainId, secret: &SecretName, text: &str) {
    let sealed = keyring().seal(domain, secret, &value(text));
    repository.put(domain, secret, &sealed).await.unwrap();
}

/// The value the store holds as `domain`'s secret `name`, opened.
async fn got(repository: &PgSecretRepository, domain: DomainId, secret: &SecretName) -> Option<SecretValue> {
    let stored = repository.get(domain, secret).await.unwrap()?;
    Some(keyring().open(domain, secret, &stored).unwrap())
}

fn budget(per_second: f64, burst: f64) -> Limit {
    Limit::new(per_second, burst).unwrap()
}

fn limiter(pool: &PgPool, clock: &ManualClock, node: Limit, domain: Limit) -> RateBudgetReadLimiter {
    RateBudgetReadLimiter::new(spender(
        pool,
        clock,
        [(Scope::SecretReadNode, node), (Scope::SecretReadDomain, domain)],
    ))
}

/// The stored (tokens, refilled_at) of one read bucket, or None when it has no row.
async fn bucket(pool: &PgPool, scope: &str, key: uuid::Uuid) -> Option<(f64, DateTime<Utc>)> {
    sqlx::query_as(
        "SELECT tokens, refilled_at FROM plexsphere.rate_budgets WHERE scope = $1 AND bucket_key = $2",
    )
    .bind(scope)
    .bind(key)
    .fetch_optional(pool)
    .await
    .unwrap()
}

async fn node_bucket(pool: &PgPool, node: NodeId) -> Option<(f64, DateTime<Utc>)> {
    bucket(pool, "secret_read_node", node.as_uuid()).await
}

async fn domain_bucket(pool: &PgPool, domain: DomainId) -> Option<(f64, DateTime<Utc>)> {
    bucket(pool, "secret_read_domain", domain.as_uuid()).await
}

// ---- the secret store ----

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_put_secret_is_got_back_and_a_second_put_replaces_it(pool: PgPool) {
    let repository = PgSecretRepository::new(pool.clone());
    let domain = domain();
    assert_eq!(repository.get(domain, &name("db-password")).await.unwrap(), None);

    put(&repository, domain, &name("db-password"), "first").await;
    assert_eq!(got(&repository, domain, &name("db-password")).await, Some(value("first")));

    put(&repository, domain, &name("db-password"), "second").await;
    assert_eq!(got(&repository, domain, &name("db-password")).await, Some(value("second")));
    let rows: i64 =
        sqlx::query_scalar("SELECT count(*) FROM plexsphere.secrets").fetch_one(&pool).await.unwrap();
    assert_eq!(rows, 1, "the overwrite replaced the row instead of adding one");
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn the_largest_name_and_value_round_trip_exactly(pool: PgPool) {
    let repository = PgSecretRepository::new(pool);
    let domain = domain();
    let longest = name(&"Az09._-".repeat(19)[..128]);
    // Multi-byte text right at the limit, with the characters a careless encoder mangles.
    let largest = value(&format!("{}é'\"\\\n\t", "x".repeat(65_536 - 7)));
    assert_eq!(largest.expose().len(), 65_536);
    put(&repository, domain, &longest, largest.expose()).await;
    assert_eq!(got(&repository, domain, &longest).await, Some(largest));
    put(&repository, domain, &name("empty"), "").await;
    assert_eq!(got(&repository, domain, &name("empty")).await, Some(value("")));
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_domains_secret_is_invisible_to_another_domain(pool: PgPool) {
    let repository = PgSecretRepository::new(pool);
    let (a, b) = (domain(), domain());
    put(&repository, a, &name("token"), "a's token").await;
    assert_eq!(repository.get(b, &name("token")).await.unwrap(), None);

    // The same name in two Domains is two secrets; writing one leaves the other alone.
    put(&repository, b, &name("token"), "b's token").await;
    assert_eq!(got(&repository, a, &name("token")).await, Some(value("a's token")));
    assert_eq!(got(&repository, b, &name("token")).await, Some(value("b's token")));
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn the_table_accepts_exactly_the_names_and_values_the_model_accepts(pool: PgPool) {
    let insert = |name: String, value: String| {
        sqlx::query("INSERT INTO plexsphere.secrets (domain_id, name, value) VALUES ($1, $2, $3)")
            .bind(uuid::Uuid::new_v4())
            .bind(name)
            .bind(value)
            .execute(&pool)
    };
    let names = [
        "a".to_owned(),
        ".".to_owned(),
        "..".to_owned(),
        ".env".to_owned(),
        "A-Z_a-z.0-9".to_owned(),
        "x".repeat(128),
        String::new(),
        "x".repeat(129),
        "a/b".to_owned(),
        "a b".to_owned(),
        "é".to_owned(),
        "a\n".to_owned(),
        "\na".to_owned(),
        "a%2F".to_owned(),
        "[a]".to_owned(),
        "a^b".to_owned(),
        "a\\b".to_owned(),
    ];
    for candidate in names {
        let model = SecretName::parse(candidate.clone()).is_ok();
        match insert(candidate.clone(), "v".to_owned()).await {
            Ok(_) => assert!(model, "the table took {candidate:?}, which the model refuses"),
            Err(error) => {
                assert!(!model, "the table refused {candidate:?}, which the model accepts: {error}");
                let error = error.as_database_error().expect("a constraint violation");
                assert_eq!(error.constraint(), Some("secrets_name_check"), "{candidate:?}");
            }
        }
    }
    for size in [0, 65_536, 65_537] {
        let candidate = "é".repeat(size / 2) + &"v".repeat(size % 2);
        let model = SecretValue::new(candidate.clone()).is_ok();
        match insert("name".to_owned(), candidate).await {
            Ok(_) => assert!(model, "the table took {size} bytes, which the model refuses"),
            Err(error) => {
                assert!(!model, "the table refused {size} bytes, which the model accepts: {error}");
                let error = error.as_database_error().expect("a constraint violation");
                assert_eq!(error.constraint(), Some("secrets_value_check"), "{size} bytes");
            }
        }
    }
}

#[tokio::test]
async fn a_store_that_cannot_be_reached_is_an_error_not_an_absent_secret() {
    let repository = PgSecretRepository::new(unreachable_pool());
    let domain = domain();
    let get = repository.get(domain, &name("token")).await.unwrap_err();
    let sealed = keyring().seal(domain, &name("token"), &value("v"));
    let put = repository.put(domain, &name("token"), &sealed).await.unwrap_err();
    for error in [get, put] {
        assert_eq!(error.to_string(), "secret store could not answer");
    }
}

// ---- the read limiter ----

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_node_out_of_budget_is_refused_until_one_read_has_refilled(pool: PgPool) {
    let clock = ManualClock::new(instant());
    let limiter = limiter(&pool, &clock, budget(2.0, 3.0), budget(100.0, 100.0));
    let reader = reader_in(domain());
    for _ in 0..3 {
        limiter.spend_read(reader).await.unwrap();
    }
    let refused = limiter.spend_read(reader).await.unwrap_err();
    assert!(
        matches!(refused, ReadLimitError::NodeRateLimited { retry_after } if retry_after == Duration::from_millis(500)),
        "{refused:?}"
    );
    assert_eq!(node_bucket(&pool, reader.node).await, Some((0.0, instant())));
    assert_eq!(
        domain_bucket(&pool, reader.domain).await,
        Some((97.0, instant())),
        "the refusal cost the domain"
    );

    clock.advance(chrono::Duration::microseconds(499_999));
    assert!(matches!(limiter.spend_read(reader).await, Err(ReadLimitError::NodeRateLimited { .. })));
    clock.advance(chrono::Duration::microseconds(1));
    limiter.spend_read(reader).await.unwrap();
    assert!(matches!(limiter.spend_read(reader).await, Err(ReadLimitError::NodeRateLimited { .. })));
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_domain_refusal_leaves_the_nodes_bucket_undebited(pool: PgPool) {
    let clock = ManualClock::new(instant());
    let limiter = limiter(&pool, &clock, budget(1.0, 5.0), budget(0.25, 2.0));
    let domain = domain();
    let (first, second) = (reader_in(domain), reader_in(domain));
    limiter.spend_read(first).await.unwrap();
    limiter.spend_read(second).await.unwrap();

    // The first Node still has 4 reads of its own, but its Domain has none left.
    let refused = limiter.spend_read(first).await.unwrap_err();
    assert!(
        matches!(refused, ReadLimitError::DomainRateLimited { retry_after } if retry_after == Duration::from_secs(4)),
        "{refused:?}"
    );
    assert_eq!(node_bucket(&pool, first.node).await, Some((4.0, instant())));
    assert_eq!(domain_bucket(&pool, domain).await, Some((0.0, instant())));

    clock.advance(chrono::Duration::seconds(4));
    limiter.spend_read(first).await.unwrap();
    assert_eq!(node_bucket(&pool, first.node).await, Some((4.0, clock.now())));
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn many_readers_through_two_replicas_admit_exactly_the_domains_burst(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let open = || PgPoolOptions::new().max_connections(8).connect_with(connect.clone());
    let pools = [open().await.unwrap(), open().await.unwrap()];
    let clock = ManualClock::new(instant());
    let domain = domain();
    // Ten Nodes with 8 reads each could admit 80; the Domain's 30 must bind.
    let (node_burst, domain_burst) = (8.0, 30.0);
    let replicas: Vec<SecretsService> = pools
        .iter()
        .map(|pool| {
            SecretsService::new(
                Arc::new(PgSecretRepository::new(pool.clone())),
                Arc::new(limiter(pool, &clock, budget(1.0, node_burst), budget(1.0, domain_burst))),
                Arc::new(keyring()),
            )
        })
        .collect();
    replicas[0].write(domain, name("token"), value("shared")).await.unwrap();

    let readers: Vec<Reader> = (0..10).map(|_| reader_in(domain)).collect();
    let reads = 200;
    let barrier = Arc::new(Barrier::new(reads));
    let tasks: Vec<_> = (0..reads)
        .map(|i| {
            let service = replicas[i % 2].clone();
            let reader = readers[i % readers.len()];
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                service.read(reader, &name("token")).await
            })
        })
        .collect();
    let mut granted = 0;
    for task in tasks {
        match task.await.unwrap() {
            Ok(secret) => {
                assert_eq!(secret.value.expose(), "shared");
                granted += 1;
            }
            Err(ReadError::NodeRateLimited { .. } | ReadError::DomainRateLimited { .. }) => {}
            Err(other) => panic!("a read under load failed other than by refusal: {other:?}"),
        }
    }
    assert_eq!(granted, 30);
    assert_eq!(domain_bucket(&pools[0], domain).await, Some((0.0, instant())));
    let mut spent_by_nodes = 0.0;
    for reader in &readers {
        if let Some((tokens, _)) = node_bucket(&pools[0], reader.node).await {
            spent_by_nodes += node_burst - tokens;
        }
    }
    assert_eq!(spent_by_nodes, domain_burst, "every node debit has its domain debit and no other");
}

#[tokio::test]
async fn a_limiter_that_cannot_reach_its_store_is_unavailable_never_a_refusal() {
    let clock = ManualClock::new(instant());
    let limiter = limiter(&unreachable_pool(), &clock, budget(1.0, 5.0), budget(1.0, 5.0));
    let error = limiter.spend_read(reader_in(domain())).await.unwrap_err();
    assert!(matches!(error, ReadLimitError::Unavailable(_)), "{error:?}");
}

#[tokio::test]
async fn a_limiter_whose_burst_is_below_one_read_is_unavailable_never_a_refusal() {
    // No bucket of such a budget could ever cover a read: misconfiguration, not a cap. It is
    // decided before any query, so no database is needed to see it.
    let clock = ManualClock::new(instant());
    let unusable = budget(1.0, 0.5);
    for (node_budget, domain_budget) in [(unusable, budget(1.0, 5.0)), (budget(1.0, 5.0), unusable)] {
        let limiter = limiter(&unreachable_pool(), &clock, node_budget, domain_budget);
        let error = limiter.spend_read(reader_in(domain())).await.unwrap_err();
        assert!(
            matches!(error, ReadLimitError::Unavailable(_)),
            "{node_budget:?} {domain_budget:?}: {error:?}"
        );
    }
}

// ---- the service on both adapters ----

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_node_reads_its_domains_secret_and_not_another_domains_and_each_read_is_spent(pool: PgPool) {
    let clock = ManualClock::new(instant());
    let service = SecretsService::new(
        Arc::new(PgSecretRepository::new(pool.clone())),
        Arc::new(limiter(&pool, &clock, budget(1.0, 5.0), budget(1.0, 10.0))),
        Arc::new(keyring()),
    );
    let (a, b) = (domain(), domain());
    service.write(a, name("token"), value("a's token")).await.unwrap();
    let reader_of_a = reader_in(a);
    let reader_of_b = reader_in(b);

    let secret = service.read(reader_of_a, &name("token")).await.unwrap();
    assert_eq!((secret.name.as_str(), secret.value.expose()), ("token", "a's token"));
    assert!(matches!(service.read(reader_of_b, &name("token")).await, Err(ReadError::NotFound)));
    assert!(matches!(service.read(reader_of_a, &name("missing")).await, Err(ReadError::NotFound)));

    // Both the found and the missing reads were spent, from the Node and from its Domain.
    assert_eq!(node_bucket(&pool, reader_of_a.node).await, Some((3.0, instant())));
    assert_eq!(domain_bucket(&pool, a).await, Some((8.0, instant())));
    assert_eq!(node_bucket(&pool, reader_of_b.node).await, Some((4.0, instant())));
    assert_eq!(domain_bucket(&pool, b).await, Some((9.0, instant())));
}

// ---- values at rest ----

/// A service on `pool` sealing with `keyring`, whose budgets never bind.
fn sealing_service(pool: &PgPool, keyring: Keyring) -> SecretsService {
    let clock = ManualClock::new(instant());
    SecretsService::new(
        Arc::new(PgSecretRepository::new(pool.clone())),
        Arc::new(limiter(pool, &clock, budget(1000.0, 1000.0), budget(1000.0, 1000.0))),
        Arc::new(keyring),
    )
}

/// Every row's (name, plain-text value, key id, ciphertext).
async fn rows(pool: &PgPool) -> Vec<(String, Option<String>, Option<String>, Option<Vec<u8>>)> {
    sqlx::query_as("SELECT name, value, key_id, ciphertext FROM plexsphere.secrets ORDER BY name")
        .fetch_all(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn the_table_holds_values_sealed_under_the_current_key_never_in_the_clear(pool: PgPool) {
    let service = sealing_service(&pool, Keyring::new(key(2), [key(1)]));
    let domain = domain();
    service.write(domain, name("db-password"), value("correct horse battery staple")).await.unwrap();
    let [(_, plaintext, key_id, ciphertext)] = rows(&pool).await.try_into().unwrap();
    assert_eq!(plaintext, None);
    assert_eq!(key_id.as_deref(), Some(key(2).id().as_str()));
    let ciphertext = ciphertext.unwrap();
    assert!(!ciphertext.windows(5).any(|window| window == b"horse"), "{ciphertext:?}");
    let secret = service.read(reader_in(domain), &name("db-password")).await.unwrap();
    assert_eq!(secret.value, value("correct horse battery staple"));
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn a_sealed_value_moved_to_another_row_does_not_open(pool: PgPool) {
    let service = sealing_service(&pool, keyring());
    let (victim, attacker) = (domain(), domain());
    service.write(victim, name("db-password"), value("the victim's")).await.unwrap();
    service.write(attacker, name("db-password"), value("the attacker's")).await.unwrap();
    service.write(attacker, name("other-name"), value("also the attacker's")).await.unwrap();
    // Whoever can write the table copies the victim's sealed value under the attacker's Domain,
    // and under another name.
    sqlx::query(
        "UPDATE plexsphere.secrets AS target
         SET key_id = source.key_id, nonce = source.nonce, ciphertext = source.ciphertext
         FROM plexsphere.secrets AS source
         WHERE source.domain_id = $1 AND target.domain_id = $2",
    )
    .bind(victim.as_uuid())
    .bind(attacker.as_uuid())
    .execute(&pool)
    .await
    .unwrap();
    for moved in ["db-password", "other-name"] {
        let error = service.read(reader_in(attacker), &name(moved)).await.unwrap_err();
        assert!(matches!(error, ReadError::Unreadable(OpenError::NotAuthentic(_))), "{moved}: {error:?}");
    }
    assert_eq!(
        service.read(reader_in(victim), &name("db-password")).await.unwrap().value,
        value("the victim's")
    );
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn rekey_seals_plaintext_rows_and_moves_old_keys_to_the_current_one_in_batches(pool: PgPool) {
    let domain = domain();
    // Two rows as a build before sealing wrote them, three under the old key.
    for (secret, text) in [("plain-1", "p1"), ("plain-2", "p2")] {
        sqlx::query("INSERT INTO plexsphere.secrets (domain_id, name, value) VALUES ($1, $2, $3)")
            .bind(domain.as_uuid())
            .bind(secret)
            .bind(text)
            .execute(&pool)
            .await
            .unwrap();
    }
    let before_rotation = sealing_service(&pool, Keyring::new(key(1), []));
    for (secret, text) in [("old-1", "o1"), ("old-2", "o2"), ("old-3", "o3")] {
        before_rotation.write(domain, name(secret), value(text)).await.unwrap();
    }
    let rotated = sealing_service(&pool, Keyring::new(key(2), [key(1)]));
    let mut after = None;
    let (mut batches, mut resealed, mut from_plaintext) = (0, 0, 0);
    loop {
        let batch = rotated.rekey_batch(after.as_ref(), 2).await.unwrap();
        batches += 1;
        resealed += batch.resealed;
        from_plaintext += batch.sealed_from_plaintext;
        after = batch.next;
        if after.is_none() {
            break;
        }
    }
    assert_eq!((batches, resealed, from_plaintext), (3, 3, 2));
    for (_, plaintext, key_id, _) in rows(&pool).await {
        assert_eq!((plaintext, key_id.as_deref()), (None, Some(key(2).id().as_str())));
    }
    // The old key can go: the current one opens everything.
    let retired = sealing_service(&pool, Keyring::new(key(2), []));
    for (secret, text) in
        [("plain-1", "p1"), ("plain-2", "p2"), ("old-1", "o1"), ("old-2", "o2"), ("old-3", "o3")]
    {
        assert_eq!(retired.read(reader_in(domain), &name(secret)).await.unwrap().value, value(text));
    }
    assert_eq!(retired.rekey_batch(None, 2).await.unwrap().resealed, 0);
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn rekey_never_undoes_a_write_that_raced_it(pool: PgPool) {
    let repository = PgSecretRepository::new(pool.clone());
    let domain = domain();
    let old = Keyring::new(key(1), []);
    let current = Keyring::new(key(2), [key(1)]);
    repository.put(domain, &name("n"), &old.seal(domain, &name("n"), &value("before"))).await.unwrap();
    let [listed]: [StoredSecret; 1] =
        repository.not_sealed_under(current.current_key_id(), None, 10).await.unwrap().try_into().unwrap();
    // A write lands between the listing and the replace.
    repository.put(domain, &name("n"), &current.seal(domain, &name("n"), &value("after"))).await.unwrap();
    let resealed = current.seal(domain, &name("n"), &value("before"));
    assert!(!repository.replace(&listed, &resealed).await.unwrap());
    let stored = repository.get(domain, &name("n")).await.unwrap().unwrap();
    assert_eq!(current.open(domain, &name("n"), &stored), Ok(value("after")));
    assert_eq!(listed.secret, SecretRef { domain, name: name("n") });
    assert!(matches!(listed.value, StoredValue::Sealed(_)));
}
