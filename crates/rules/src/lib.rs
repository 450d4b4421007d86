//! The rules context: the durable rate-budget rules operators write, their history, which one
//! governs a Domain's budget, and how often each one granted and refused.
//!
//! A [`Rule`] sizes one scope's budget (a [`ratebudget::Scope`]) for the Domains its
//! [`Selector`] picks: every Domain, the Domains of a [`Tier`], or one Domain. Rules are
//! written by id ([`RulesService::put`]), replaced only by a writer who names the version it
//! read (`If-Match`), rolled back to any earlier version, and deleted; every change is a new
//! version, kept forever with who made it ([`RuleVersion`]).
//!
//! Invariants:
//! - Every rule is a budget `ratebudget::Limit::new` accepts (it refills within the idle
//!   sweep's hour), with a burst of at least one; the table's CHECKs make the same float8
//!   comparisons, so a rule the model accepts is always stored.
//! - A replacement or deletion applies only to the version its writer read, decided by one
//!   conditional statement: of two writers holding the same version, exactly one wins.
//! - Every change adds one version to `plexsphere.rule_versions` (append-only: the table
//!   refuses updates and deletes) and one to the rules' revision, and is announced on
//!   [`CHANGES_CHANNEL`] at commit, in the same statement.
//! - Resolution ([`Snapshot::resolve`]) follows one written precedence: the Domain's
//!   override, else its tier's template, else an all-Domains rule; within a level the higher
//!   priority wins, then the smaller rule id. No rule governs what no rule selects.
//!
//! Only [`persistence`](PgRulesRepository) names SQL; the model, snapshot and service build
//! and test without a database. No other context is named here: the composition root reads a
//! Domain's tier from the access context and asks the [`Snapshot`].

mod error;
mod model;
mod persistence;
mod ports;
mod service;
mod snapshot;
mod usage;

pub use error::{BoxError, RepositoryError, WriteError};
pub use model::{
    Actor, Algorithm, Change, FailMode, InvalidRule, Mode, Rule, RuleDraft, RuleId, RuleSpec, RuleVersion,
    Selector, Tier, UsageCount, UsageMinute, Version,
};
pub use persistence::{PgRulesRepository, CHANGES_CHANNEL};
pub use ports::{Created, Replaced, RolledBack, RulesRepository};
pub use service::{Put, RulesService};
pub use snapshot::{Level, Resolved, Snapshot};
pub use usage::{flush_every, Counted, RuleRefs, Usage, MAX_PENDING};
