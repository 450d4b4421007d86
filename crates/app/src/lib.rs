//! The plexsphere composition root: it owns the database schema as a whole, reads the knobs,
//! builds the pools and binds each context's ports to their adapters.

use sqlx::migrate::Migrator;

/// Every migration of the database, embedded at build time from the top-level `migrations/`.
///
/// One set for the whole database, applied by `plexsphere migrate` and by every test that
/// needs a fresh database.
pub static MIGRATOR: Migrator = sqlx::migrate!("../../migrations");
