//! The plexsphere composition root: it owns the database schema as a whole, reads the knobs
//! once at boot, builds the pools, binds each context's ports to their adapters, serves the
//! HTTP API and runs the leader-elected background loops.

pub mod budgets;
pub mod cli;
pub mod clock;
pub mod config;
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
pub mod usage;

use sqlx::migrate::Migrator;

/// Every migration of the database, embedded at build time from the top-level `migrations/`.
///
/// One set for the whole database, applied by `plexsphere migrate` (and `serve`, first) and
/// by every test that needs a fresh database.
pub static MIGRATOR: Migrator = sqlx::migrate!("../../migrations");
