//! The rules context: the durable rate-limit rules operators write, their history, which one
//! governs a request, and how often each one granted and refused.
//!
//! A [`Rule`] targets ([`Target`]) one of this project's own budgets (a
//! [`ratebudget::Scope`]) for the Domains its [`Selector`] picks (every Domain, the Domains of a
//! [`Tier`], or one Domain), or another service's requests: a [`Service`], an [`Api`] (or every
//! one) and [`Attributes`] every request it governs has. Rules are written by id
//! ([`RulesService::put`]), replaced only by a writer who names the version it read
//! (`If-Match`), rolled back to any earlier version, and deleted; every change is a new
//! version, kept forever with who made it ([`RuleVersion`]).
//!
//! Invariants:
//! - Every rule of our own is a budget `ratebudget::Limit::new` accepts (it refills within the
//!   idle sweep's hour), and every other service's one `ratebudget::Limit::for_any_period`
//!   accepts (within a year and a day: its buckets are swept once its slowest rule has refilled
//!   them), with a burst of at least one; the table's CHECKs make the same float8 comparisons
//!   and the same target checks, so a rule the model accepts is always stored.
//! - A replacement or deletion applies only to the version its writer read, decided by one
//!   conditional statement: of two writers holding the same version, exactly one wins.
//! - Every change adds one version to `plexsphere.rule_versions` (append-only: the table
//!   refuses updates and deletes) and one to the rules' revision, and is announced on
//!   [`CHANGES_CHANNEL`] at commit, in the same statement.
//! - Resolution ([`Snapshot::matching`], and [`Snapshot::resolve`] for our own budgets) follows
//!   one written precedence for every service: the rule naming the most specific attribute,
//!   then a named API over `*`, then the higher priority, then the smaller rule id; for our own
//!   budgets that is the Domain's override, else its tier's template, else an all-Domains
//!   rule. No rule governs what no rule selects.
//!
//! Only [`persistence`](PgRulesRepository) names SQL; the model, snapshot and service build
//! and test without a database. No other context is named here: the composition root reads a
//! Domain's tier from the access context and asks the [`Snapshot`].

mod error;
pub mod files;
mod model;
mod persistence;
mod ports;
mod service;
mod snapshot;
mod usage;

pub use error::{BoxError, RepositoryError, WriteError};
pub use model::{wildcard_matches, DescriptorRule, PathEntry, PathLimit, Unit, MAX_DEPTH};
pub use model::{
    Actor, Algorithm, Change, Charge, FailMode, InvalidRule, Mode, Rule, RuleDraft, RuleId, RuleSpec,
    RuleVersion, Selector, Tier, UsageCount, UsageMinute, Version,
};
pub use model::{
    Api, Attributes, Pattern, Service, ServiceDraft, Services, Target, MAX_ATTRIBUTES, OWN_SERVICE,
};
pub use persistence::{PgRulesRepository, CHANGES_CHANNEL};
#[cfg(feature = "mocks")]
pub use ports::MockRulesRepository;
pub use ports::{Created, Replaced, RolledBack, RulesRepository, Write};
pub use service::{Applied, FileChange, Prune, Put, RulesService};
pub use snapshot::{Level, Matched, Resolved, Snapshot};
pub use usage::{flush_every, Counted, RuleRefs, Usage, MAX_PENDING};
