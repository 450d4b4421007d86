//! Rate budgets shared by every process through PostgreSQL: token buckets and GCRA limiters
//! under names of their user's own, keyed by any string.
//!
//! Each bucket is one row (of `plexsphere.rate_budgets` for a token bucket, of
//! `plexsphere.named_limits` for a GCRA key), keyed by its budget's [`Name`] and its key, and
//! every decision is one SQL statement against it. Because the row is shared, a deployment
//! admits the configured rate however many replicas serve it. A refusal writes nothing; one
//! the statement's snapshot already foresees does not even lock the row.
//!
//! # Using it
//!
//! Apply [`MIGRATOR`] (the crate's own tables and functions only). Build one [`Guard`] per
//! process in front of a [`Store`] ([`Guard::builder`]): its pre-check refuses a bucket
//! already known to be spent without a statement, its circuit and each take's [`FailMode`]
//! decide while the database cannot answer, and with a [`DatabaseClock`]'s status
//! ([`GuardBuilder::trusted_only`]) it decides nothing while this process's clock cannot be
//! trusted: every process must decide on one clock, the database's (docs/adr/0015). Then take:
//!
//! - **The one way to take** is [`Decider::decide`]: a [`Take`] (one [`Spend`], two spent
//!   all-or-nothing, or a [`NamedSpend`] of a GCRA limiter) at an instant, answered with a
//!   [`Decision`] or [`Undecided`]. The [`Guard`] and the [`Store`] are deciders.
//! - [`TokenBuckets`] and [`GcraLimiter`] hold a budget under a name (its [`Limit`], how it is
//!   enforced, the decider and the clock) and build that take for a key and a cost:
//!   `uploads.take("api-key-alice", 1500.0).await?`. `examples/token_buckets.rs` is a whole
//!   program in a dozen lines.
//! - [`Store::take`] is the first reference's API (`Ok(bool)`), kept as it was written.
//!
//! A [`Decision`] is granted (with what is left), refused (which bucket, and how long until
//! the refused cost could be covered), or a cost above the burst that no wait will ever cover.
//! A refusal is not an error: each caller owns a refusal error that names its budget for its
//! transport. An `Err` means the budget could not be evaluated, and must never be reported as a
//! refusal, or an outage would tell a whole fleet to back off from a cap none of them reached.
//!
//! The budget itself, rate and ceiling, is not stored: it travels with every take as a
//! [`Limit`] (validated when it is built), so a changed limit applies at the next take. The
//! `plexsphere` binary's five budgets are [`Scope`]s, names like any other, whose keys are
//! Node and Domain ids; they are sized per take by a [`Policy`] its [`Budgets`] give
//! ([`Spender`]).
//!
//! This crate owns its tables and every statement that touches them; nothing else does.

mod batch;
mod clock;
mod connections;
mod decision;
pub mod discipline;
mod error;
mod guard;
mod handles;
mod model;
mod name;
mod named;
mod policy;
mod sides;
mod spender;
mod statements;
mod store;

pub use batch::Coalescing;
pub use clock::{Clock, ManualClock, SystemClock};
pub use connections::{transaction_begin, REFUSE_READ_ONLY_SERVER};
pub use decision::{
    Decider, Decision, Grant, InsufficientCapacity, LeaseRequest, Leased, Refusal, Take, Which,
};
pub use discipline::{ClockStatus, DatabaseClock, UntrustedClock};
pub use error::{cause_chain, Error, Undecided};
pub use guard::{follow_resets, Guard, GuardBuilder, Observer, Source, Unobserved};
pub use handles::{GcraLimiter, TokenBuckets};
pub use model::{Budget, Fill, InvalidLimit, Key, Limit, Scope, Spend, IDLE_RETENTION};
pub use name::{InvalidName, Name};
pub use named::{LimiterName, NamedKey, NamedSpend};
pub use policy::{Algorithm, BoxError, Budgets, Enforcement, FailMode, FixedBudgets, Mode, Policy, RuleRef};
pub use spender::{PairBudget, SingleBudget, Spender, Spent};
pub use statements::{through_transaction_pooler, Statements};
pub use store::{Bucket, IdleSweep, Store, RESET_CHANNEL};

/// The crate's own migrations: schema `plexsphere`, its tables `rate_budgets` and
/// `named_limits`, and the functions that decide. Apply them before a [`Store`] is used:
/// `ratebudget::MIGRATOR.run(&pool).await?`.
///
/// Other owners' migrations may share the database and its `_sqlx_migrations` table (the
/// `plexsphere` binary's do): this migrator leaves the versions it does not know alone.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate::Migrator {
    migrations: std::borrow::Cow::Borrowed(include!(concat!(env!("OUT_DIR"), "/migrations.rs"))),
    ignore_missing: true,
    ..sqlx::migrate::Migrator::DEFAULT
};
