//! Token-bucket rate budgets shared by every replica through PostgreSQL.
//!
//! Each bucket is one row of `plexsphere.rate_budgets`, keyed by a [`Scope`] and the Node or
//! Domain it belongs to, and every decision is one SQL statement against it. Because the row
//! is shared, a deployment admits the configured rate however many replicas serve it.
//!
//! The budget itself, rate and ceiling, is not stored: it travels with every take as a
//! [`Limit`] (validated when it is built, so a take never checks it again), inside the
//! [`Policy`] the caller's [`Budgets`] gives for that take: the limit, the algorithm, whether
//! a refusal refuses ([`Mode::Shadow`] only counts it) and what decides when the store cannot
//! answer ([`FailMode`]). Policies change at run time (the composition root reads them from
//! operators' rules), and each replica hears of a change at its own moment, so a stored copy
//! would hold whichever replica last wrote it; asking on every take makes a change apply at
//! the next one.
//!
//! A take answers a [`Decision`]: granted (with what is left), refused (which bucket, and how
//! long until the refused cost could be covered), or a cost above the burst that no wait will
//! ever cover. A refusal is not an error: each caller owns a refusal error that names its
//! budget for its transport. An `Err` means the budget could not be evaluated, and must never
//! be reported as a refusal, or an outage would tell a whole fleet to back off from a cap
//! none of them reached. [`Store::take`] is the reference's API (`Ok(bool)`) over the same
//! decision.
//!
//! This crate owns the table and every statement that touches it; nothing else does.

mod batch;
mod clock;
mod connections;
mod decision;
mod error;
mod guard;
mod model;
mod named;
mod policy;
mod spender;
mod store;

pub use batch::Coalescing;
pub use clock::{Clock, ManualClock, SystemClock};
pub use decision::{Decider, Decision, Grant, InsufficientCapacity, Refusal, Take, Which};
pub use error::{Error, Undecided};
pub use guard::{follow_resets, Guard, GuardConfig, Observer, Source, Unobserved};
pub use model::{Budget, Fill, InvalidLimit, Key, Limit, Scope, Spend, IDLE_RETENTION};
pub use named::{InvalidName, LimiterName, NamedKey, NamedSpend};
pub use policy::{Algorithm, BoxError, Budgets, Enforcement, FailMode, FixedBudgets, Mode, Policy, RuleRef};
pub use spender::{PairBudget, SingleBudget, Spender, Spent};
pub use store::{Bucket, IdleSweep, Store};
