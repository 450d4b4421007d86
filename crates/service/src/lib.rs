//! What plexsphere decides and does, with no transport, no environment and no database
//! driver: the library the `plexsphere` binary (`app`) serves, as Kuadrant's `limitador`
//! library is to its server.
//!
//! - [`budgets`]: [`RuleBudgets`], the [`ratebudget::Budgets`] every take of this project's own
//!   is sized by (the rules snapshot, the Domains' tiers and the [`defaults`]), and [`follow`],
//!   which keeps it current from what a channel the binary's listener feeds says.
//! - [`decide`]: [`DecideService`], decisions for other services' requests (descriptor, rule,
//!   bucket, one take, Envoy's answer), whatever transport asked.
//! - [`operations`]: [`Operations`], every operator action once (act, reload, audit), called
//!   by the HTTP routes and the command line alike.
//!
//! Its ports are what it cannot do itself: [`budgets::Precheck`] (what a replica's guard
//! remembers), [`decide::DecideObserver`] (the metrics), [`operations::BucketStore`] (the
//! rate-budget store's operator reads and resets); the contexts are reached through their own
//! services, over their own ports.

pub mod budgets;
pub mod decide;
pub mod defaults;
pub mod operations;
pub mod quota;

#[cfg(test)]
mod fixtures;

pub use budgets::{follow, service_buckets, Heard, NotLoaded, Precheck, RuleBudgets, Sources};
pub use decide::{DecideError, DecideObserver, DecideService};
pub use defaults::{DefaultBudget, DefaultBudgets};
pub use operations::{BucketStore, Holder, OperationError, Operations, Replica};
