//! The plexsphere composition root: it owns the database schema as a whole, reads the knobs
//! once at boot, builds the pools, binds each context's ports to their adapters, serves the
//! HTTP API and runs the leader-elected background loops.

pub mod budgets;
pub mod cli;
pub mod config;
pub mod credentials;
pub mod decide;
pub mod fill;
pub mod http;
pub mod leader;
pub mod limits;
pub mod listener;
pub mod metrics;
pub mod migrations;
pub mod otlp;
pub mod revocations;
pub mod startup;
pub mod sweep;
pub mod telemetry;

use std::sync::LazyLock;

use sqlx::migrate::Migrator;

/// Every migration of the database: `ratebudget`'s own ([`ratebudget::MIGRATOR`]) and the
/// contexts' (the top-level `migrations/`, [`migrations::OWN`]), in version order, which is
/// the order they were always applied in on a fresh database.
///
/// One set for the whole database, applied by `plexsphere migrate` (and `serve`, first) and
/// by every test that needs a fresh database.
pub static MIGRATOR: LazyLock<Migrator> = LazyLock::new(|| {
    let mut migrations: Vec<_> = ratebudget::MIGRATOR.iter().chain(migrations::OWN.iter()).cloned().collect();
    migrations.sort_by_key(|migration| migration.version);
    Migrator { migrations: migrations.into(), ..Migrator::DEFAULT }
});
