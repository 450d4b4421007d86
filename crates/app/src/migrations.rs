//! The database's migrations: applied in one order everywhere.
//!
//! sqlx applies every migration a database lacks, including one whose version is below a
//! migration already applied. The files of this repository were once written out of version
//! order (0001–0007, 0030–0033, 0008–0009, 0050–0056, 0010, 0057, 0011–0014), so a database
//! upgraded across those builds ran them in another order than a fresh one: a migration could
//! run before one it was written after. From 20261201120000 on, every migration's version is a
//! timestamp (as `sqlx migrate add` makes them), greater than every version before it, and a
//! database that lacks a migration below one it has is refused before anything is applied,
//! unless the operator says, having checked, that the gap may be filled out of order. Since
//! `ratebudget` ships its own migrations, the order that matters is each owner's own: the
//! crate's and the contexts' never depend on each other.

use std::fmt;
use std::sync::LazyLock;

use sqlx::migrate::Migrator;
use sqlx::PgPool;

/// Every migration of the database: `ratebudget`'s own ([`ratebudget::MIGRATOR`]) and the
/// contexts' ([`OWN`]), in version order, which is the order they were always applied in on a
/// fresh database.
///
/// One set for the whole database, applied by `plexsphere migrate` (and `serve`, first) and
/// by every test that needs a fresh database.
pub static MIGRATOR: LazyLock<Migrator> = LazyLock::new(|| {
    let mut migrations: Vec<_> = ratebudget::MIGRATOR.iter().chain(OWN.iter()).cloned().collect();
    migrations.sort_by_key(|migration| migration.version);
    Migrator { migrations: migrations.into(), ..Migrator::DEFAULT }
});

/// The contexts' migrations, the top-level `migrations/`: access, secrets, ingest, audit and
/// rules. [`MIGRATOR`] applies them with `ratebudget`'s.
pub static OWN: sqlx::migrate::Migrator =
    sqlx::migrate::Migrator { ignore_missing: true, ..sqlx::migrate!("../../migrations") };

/// A migration this build has that the database lacks, below one the database has applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gap {
    /// The missing migration's version.
    pub version: i64,
    /// Its description.
    pub description: String,
}

/// The database lacks migrations below the highest one of their owner it has applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutOfOrder {
    /// What it lacks, in version order.
    pub missing: Vec<Gap>,
    /// The highest version it has applied.
    pub highest_applied: i64,
}

impl fmt::Display for OutOfOrder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let missing: Vec<String> =
            self.missing.iter().map(|gap| format!("{} ({})", gap.version, gap.description)).collect();
        write!(
            f,
            "the database has applied migration {} but lacks {}, which come before it: applying them now would run \
             them in another order than on a fresh database. Check that they do not depend on anything applied \
             after them, then run `plexsphere migrate --allow-out-of-order`",
            self.highest_applied,
            missing.join(", ")
        )
    }
}

impl std::error::Error for OutOfOrder {}

/// Why the migrations could not be checked or applied.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    /// The database lacks migrations below one it has (see [`OutOfOrder`]).
    #[error(transparent)]
    OutOfOrder(#[from] OutOfOrder),
    /// The database did not answer, or a migration failed.
    #[error("failed to apply migrations")]
    Database(#[source] sqlx::migrate::MigrateError),
    /// The applied migrations could not be read.
    #[error("failed to read the applied migrations")]
    Read(#[source] sqlx::Error),
}

/// The gaps, if any: for each owner of migrations (`ratebudget`'s and the contexts'), what it
/// has that the database lacks below the highest of its own the database has applied. Two
/// owners' migrations never depend on each other, so only each one's own order matters.
///
/// # Errors
/// [`MigrateError::Read`] when the applied versions cannot be read.
pub async fn gaps(pool: &PgPool) -> Result<Option<OutOfOrder>, MigrateError> {
    // A database never migrated has no table: nothing applied, nothing out of order.
    let applied: Vec<i64> = sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success")
        .fetch_all(pool)
        .await
        .or_else(|error| match &error {
            sqlx::Error::Database(database) if database.code().as_deref() == Some("42P01") => Ok(Vec::new()),
            _ => Err(error),
        })
        .map_err(MigrateError::Read)?;
    let mut found: Option<OutOfOrder> = None;
    for owner in [&ratebudget::MIGRATOR, &OWN] {
        let Some(highest_applied) =
            owner.iter().map(|migration| migration.version).filter(|version| applied.contains(version)).max()
        else {
            continue;
        };
        let missing = owner
            .iter()
            .filter(|migration| migration.version < highest_applied && !applied.contains(&migration.version))
            .map(|migration| Gap {
                version: migration.version,
                description: migration.description.to_string(),
            });
        let gap = found.get_or_insert(OutOfOrder { missing: Vec::new(), highest_applied });
        gap.missing.extend(missing);
        gap.highest_applied = gap.highest_applied.max(highest_applied);
    }
    Ok(found.filter(|gap| !gap.missing.is_empty()).map(|mut gap| {
        gap.missing.sort_by_key(|missing| missing.version);
        gap
    }))
}

/// Applies every pending migration ([`MIGRATOR`]) to `pool`, refusing a database with a
/// gap ([`gaps`]) unless `allow_out_of_order`.
///
/// # Errors
/// [`MigrateError::OutOfOrder`] for such a database (nothing is applied); otherwise what
/// reading or applying failed with.
pub async fn apply(pool: &PgPool, allow_out_of_order: bool) -> Result<(), MigrateError> {
    if let Some(out_of_order) = gaps(pool).await? {
        if !allow_out_of_order {
            return Err(out_of_order.into());
        }
        tracing::warn!(%out_of_order, "applying migrations out of order, as told");
    }
    MIGRATOR.run(pool).await.map_err(MigrateError::Database)
}
