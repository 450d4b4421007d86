//! What the rules context needs from the outside: a store for rules, their history and usage.

use chrono::{DateTime, Utc};
use ratebudget::Scope;

use crate::{Actor, RepositoryError, Rule, RuleId, RuleSpec, RuleVersion, UsageCount, UsageMinute, Version};

/// What writing a rule where the writer expected none came to.
#[derive(Clone, Debug, PartialEq)]
pub enum Created {
    /// It was written, as its version 1 (or the version after its deletion).
    Created(Rule),
    /// A rule of that id exists, at this version; nothing was written.
    Exists(Version),
}

/// What a change conditional on the rule's version came to.
#[derive(Clone, Debug, PartialEq)]
pub enum Replaced<T> {
    /// The rule was at the version named, and the change was made.
    Applied(T),
    /// It was not; nothing was written. `current` is its version now, `None` when it does not
    /// exist.
    Stale {
        /// The rule's version, if it exists.
        current: Option<Version>,
    },
}

/// What a rollback came to.
#[derive(Clone, Debug, PartialEq)]
pub enum RolledBack {
    /// The rule now has the content of the version named, as a new version; `recreated` when
    /// it had been deleted.
    Applied {
        /// The rule as it now stands.
        rule: Rule,
        /// Whether the rule did not exist before the rollback.
        recreated: bool,
    },
    /// A version was named as the expected one, and the rule is not at it; nothing written.
    Stale {
        /// The rule's version, if it exists.
        current: Option<Version>,
    },
    /// No rule of this id was ever written.
    UnknownRule,
    /// The rule has no such version.
    UnknownVersion,
    /// The version named deleted the rule.
    DeletionVersion,
}

/// One write of a set applied together ([`RulesRepository::apply`]).
#[derive(Clone, Debug, PartialEq)]
pub enum Write {
    /// Write a rule where none stands.
    Create {
        /// Its id.
        id: RuleId,
        /// Its content.
        spec: RuleSpec,
    },
    /// Replace a rule at version `expected`.
    Replace {
        /// Its id.
        id: RuleId,
        /// Its new content.
        spec: RuleSpec,
        /// The version it must be at.
        expected: Version,
    },
    /// Delete a rule at version `expected`.
    Delete {
        /// Its id.
        id: RuleId,
        /// The version it must be at.
        expected: Version,
    },
}

/// Where rules, their history and their usage are kept.
///
/// Every method that changes a rule MUST, in one atomic step with the change: add one version
/// to the rule's history (with the actor and the time), add one to the rules' revision, and
/// announce the new revision to every listener. A conditional change MUST be decided by the
/// store itself against the rule's version at the moment of the change, never by reading the
/// version first: of two writers naming the same version, exactly one MUST win.
#[cfg_attr(any(test, feature = "mocks"), mockall::automock)]
#[async_trait::async_trait]
pub trait RulesRepository: Send + Sync {
    /// Writes `spec` as rule `id` unless a rule of that id exists.
    ///
    /// # Errors
    /// [`RepositoryError`] MUST be returned when the store could not answer.
    async fn create(&self, id: &RuleId, spec: &RuleSpec, actor: &Actor) -> Result<Created, RepositoryError>;

    /// Replaces rule `id` with `spec` if it is at version `expected`.
    ///
    /// # Errors
    /// [`RepositoryError`] MUST be returned when the store could not answer.
    async fn replace(
        &self,
        id: &RuleId,
        spec: &RuleSpec,
        expected: Version,
        actor: &Actor,
    ) -> Result<Replaced<Rule>, RepositoryError>;

    /// Deletes rule `id` if it is at version `expected`; the deletion's own version on
    /// success.
    ///
    /// # Errors
    /// [`RepositoryError`] MUST be returned when the store could not answer.
    async fn delete(
        &self,
        id: &RuleId,
        expected: Version,
        actor: &Actor,
    ) -> Result<Replaced<Version>, RepositoryError>;

    /// Writes the content of version `to` of rule `id` as its new version, recreating the rule
    /// if it was deleted; only if it is at `expected`, when one is named (a deleted rule is at
    /// no version).
    ///
    /// # Errors
    /// [`RepositoryError`] MUST be returned when the store could not answer.
    async fn rollback(
        &self,
        id: &RuleId,
        to: Version,
        expected: Option<Version>,
        actor: &Actor,
    ) -> Result<RolledBack, RepositoryError>;

    /// Makes every write of `writes` in one transaction, each as its own method would (a
    /// version, a history row, the revision and the announcement), or none of them: the
    /// version each made, in order, or `None` when one of them found its rule not as expected
    /// (nothing written).
    ///
    /// # Errors
    /// [`RepositoryError`] MUST be returned when the store could not answer (nothing written).
    async fn apply(&self, writes: &[Write], actor: &Actor) -> Result<Option<Vec<Version>>, RepositoryError>;

    /// The rule of this id, or `None`.
    ///
    /// # Errors
    /// [`RepositoryError`] MUST be returned when the store could not answer or holds a rule
    /// that does not validate.
    async fn get(&self, id: &RuleId) -> Result<Option<Rule>, RepositoryError>;

    /// Every rule, or every rule of one scope, by id.
    ///
    /// # Errors
    /// As [`RulesRepository::get`].
    async fn list<'a>(
        &self,
        scope: Option<Scope>,
        service: Option<&'a str>,
    ) -> Result<Vec<Rule>, RepositoryError>;

    /// Every version of rule `id`, oldest first; empty when it was never written.
    ///
    /// # Errors
    /// As [`RulesRepository::get`].
    async fn history(&self, id: &RuleId) -> Result<Vec<RuleVersion>, RepositoryError>;

    /// The rules' revision and every rule as of it, read at one instant.
    ///
    /// # Errors
    /// As [`RulesRepository::get`].
    async fn load(&self) -> Result<(i64, Vec<Rule>), RepositoryError>;

    /// The rules' revision: how many changes were ever made.
    ///
    /// # Errors
    /// [`RepositoryError`] MUST be returned when the store could not answer.
    async fn revision(&self) -> Result<i64, RepositoryError>;

    /// Adds `counts` to the stored usage, all of them in one statement, or none.
    ///
    /// # Errors
    /// [`RepositoryError`] MUST be returned when they were not all added.
    async fn add_usage(&self, counts: &[UsageCount]) -> Result<(), RepositoryError>;

    /// Rule `id`'s usage from the minute `since` on, oldest first.
    ///
    /// # Errors
    /// [`RepositoryError`] MUST be returned when the store could not answer.
    async fn usage(&self, id: &RuleId, since: DateTime<Utc>) -> Result<Vec<UsageMinute>, RepositoryError>;

    /// Deletes the usage of minutes before `before`; how many minutes (of any rule) it deleted.
    ///
    /// # Errors
    /// [`RepositoryError`] MUST be returned when the store could not answer.
    async fn prune_usage(&self, before: DateTime<Utc>) -> Result<u64, RepositoryError>;
}
