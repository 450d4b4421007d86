//! What several test modules share: clocks, keys and databases.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, PgConnection, PgPool};

/// Returns once exactly `sessions` sessions of this test's database wait on a lock: calls held
/// behind a row or a table another transaction of the test has locked.
pub(crate) async fn sessions_wait_on_a_lock(pool: &PgPool, sessions: i64) {
    crate::support::replicas::eventually(Duration::from_secs(5), "calls wait on a lock", || async {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()",
        )
        .fetch_one(pool)
        .await
        .unwrap();
        waiting == sessions
    })
    .await;
}

/// A fixed instant for tests that drive the limiters' clock by hand.
pub(crate) fn instant() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 30, 12, 0, 0).unwrap()
}

/// A spender deciding through a store on `pool` at `clock`'s now, with these budgets, each
/// enforced and failing closed, for every Domain: what a context's limiter adapter binds to.
pub(crate) fn spender(
    pool: &PgPool,
    clock: &ratebudget::ManualClock,
    budgets: impl IntoIterator<Item = (ratebudget::Scope, ratebudget::Limit)>,
) -> ratebudget::Spender {
    let budgets = ratebudget::FixedBudgets::new(
        budgets.into_iter().map(|(scope, limit)| (scope, ratebudget::Policy::strict(limit))),
    );
    ratebudget::Spender::new(
        Arc::new(ratebudget::Store::new(pool.clone())),
        Arc::new(clock.clone()),
        Arc::new(budgets),
    )
}

/// A fresh random key; never the zero key.
pub(crate) fn key() -> ratebudget::Key {
    uuid::Uuid::new_v4().into()
}

/// A pool whose every connection attempt is refused: nothing listens on port 1.
/// A call that answers on it cannot have sent a query; one that queries fails once the
/// pool stops retrying, after a short acquire timeout.
pub(crate) fn unreachable_pool() -> PgPool {
    PgPoolOptions::new()
        .acquire_timeout(Duration::from_millis(300))
        .connect_lazy("postgres://postgres@127.0.0.1:1/unreachable")
        .unwrap()
}

/// A migrated database of its own, for tests that cannot use `#[sqlx::test]` (property tests
/// that drive a runtime of their own). Call [`FreshDatabase::drop_database`] when done.
pub(crate) struct FreshDatabase {
    name: String,
    admin_url: String,
}

impl FreshDatabase {
    pub(crate) async fn create() -> (FreshDatabase, PgPool) {
        FreshDatabase::create_before(i64::MAX).await
    }

    /// A database migrated only up to (not including) migration `version`: as a build before
    /// that migration left it, for tests of what the migration does to existing rows.
    pub(crate) async fn create_before(version: i64) -> (FreshDatabase, PgPool) {
        let admin_url = std::env::var("DATABASE_URL").expect("DATABASE_URL names the test cluster");
        let name = format!("plexsphere_test_{}", uuid::Uuid::new_v4().simple());
        let mut admin = PgConnection::connect(&admin_url).await.unwrap();
        sqlx::query(&format!("CREATE DATABASE {name}")).execute(&mut admin).await.unwrap();
        admin.close().await.unwrap();
        let pool =
            PgPoolOptions::new().max_connections(4).connect(&database_url(&admin_url, &name)).await.unwrap();
        let earlier = sqlx::migrate::Migrator {
            migrations: app::migrations::MIGRATOR
                .iter()
                .filter(|migration| migration.version < version)
                .cloned()
                .collect(),
            ..sqlx::migrate::Migrator::DEFAULT
        };
        earlier.run(&pool).await.unwrap();
        (FreshDatabase { name, admin_url }, pool)
    }

    pub(crate) async fn drop_database(self, pool: PgPool) {
        pool.close().await;
        let mut admin = PgConnection::connect(&self.admin_url).await.unwrap();
        sqlx::query(&format!("DROP DATABASE {} WITH (FORCE)", self.name)).execute(&mut admin).await.unwrap();
    }
}

/// `admin_url` with its database replaced by `name`.
pub(crate) fn database_url(admin_url: &str, name: &str) -> String {
    let (base, _) = admin_url.rsplit_once('/').expect("DATABASE_URL ends in /<database>");
    format!("{base}/{name}")
}

/// The keys named more than once in one object anywhere in `json` (serde_json's `Value` keeps
/// the last and says nothing; a strict parser refuses the document).
pub(crate) fn duplicate_keys(json: &str) -> Vec<String> {
    use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
    use std::cell::RefCell;

    thread_local!(static FOUND: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) });

    struct Strict;
    impl<'de> Deserialize<'de> for Strict {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Strict, D::Error> {
            deserializer.deserialize_any(StrictVisitor)
        }
    }
    struct StrictVisitor;
    impl<'de> Visitor<'de> for StrictVisitor {
        type Value = Strict;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("JSON")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Strict, A::Error> {
            let mut seen = std::collections::HashSet::new();
            while let Some(key) = map.next_key::<String>()? {
                if !seen.insert(key.clone()) {
                    FOUND.with(|found| found.borrow_mut().push(key));
                }
                map.next_value::<Strict>()?;
            }
            Ok(Strict)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Strict, A::Error> {
            while seq.next_element::<Strict>()?.is_some() {}
            Ok(Strict)
        }
        fn visit_bool<E>(self, _: bool) -> Result<Strict, E> {
            Ok(Strict)
        }
        fn visit_i64<E>(self, _: i64) -> Result<Strict, E> {
            Ok(Strict)
        }
        fn visit_u64<E>(self, _: u64) -> Result<Strict, E> {
            Ok(Strict)
        }
        fn visit_f64<E>(self, _: f64) -> Result<Strict, E> {
            Ok(Strict)
        }
        fn visit_str<E>(self, _: &str) -> Result<Strict, E> {
            Ok(Strict)
        }
        fn visit_unit<E>(self) -> Result<Strict, E> {
            Ok(Strict)
        }
    }
    FOUND.with(|found| found.borrow_mut().clear());
    serde_json::from_str::<Strict>(json).expect("valid JSON");
    FOUND.with(|found| found.borrow_mut().drain(..).collect())
}
