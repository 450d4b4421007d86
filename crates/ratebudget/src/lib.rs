//! Token-bucket rate budgets shared by every replica through PostgreSQL.
//!
//! Each bucket is one row of `plexsphere.rate_budgets`, keyed by a [`Scope`] and the Node or
//! Domain it belongs to, and every decision is one SQL statement against it. Because the row
//! is shared, a deployment admits the configured rate however many replicas serve it.
//!
//! The budget itself, rate and ceiling, is not stored: it travels with every take as a
//! [`Budget`]. Replicas read their budgets from knobs at boot, so a stored copy would hold
//! whichever replica last wrote it; passing it also lets one caller size a bucket from a
//! Domain's own policy while another uses a process-wide default.
//!
//! A take answers `Ok(true)` (covered and debited), `Ok(false)` (refused, nothing written) or
//! `Err` (the budget could not be evaluated). A refusal is not an error here: each caller owns
//! a refusal error that names its budget for its transport. An `Err` must never be reported
//! as a refusal, or an outage would tell a whole fleet to back off from a cap none of them
//! reached.
//!
//! This crate owns the table and every statement that touches it; nothing else does.

mod clock;
mod connections;
mod error;
mod model;
mod store;

pub use clock::{Clock, ManualClock, SystemClock};
pub use error::Error;
pub use model::{Budget, Key, Scope, Spend};
pub use store::{Bucket, PairDecision, Store};
