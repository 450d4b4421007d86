//! What runs beside the transports for the life of a replica: the leader election, the
//! leader's sweeps (of rate budgets and of the RLQS allocator's rows), the one LISTENing connection and its followers (rules and tiers, revocations,
//! secret changes, resets), and readiness.

pub mod followers;
pub mod leader;
pub mod listener;
pub mod quota_sweep;
pub mod readiness;
pub mod rules_dir;
pub mod sweep;
