//! The rules context's use cases: write, replace, roll back and delete rules under version
//! preconditions; read them and their history; compile them into a snapshot; count usage.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use ratebudget::Scope;

use crate::ports::{Created, Replaced, RolledBack};
use crate::{
    Actor, RepositoryError, Rule, RuleId, RuleSpec, RuleVersion, RulesRepository, Snapshot, UsageCount,
    UsageMinute, Version, WriteError,
};

#[cfg(test)]
mod tests;

/// What a write that may create a rule did.
#[derive(Clone, Debug, PartialEq)]
pub enum Put {
    /// There was no rule of this id; there is now (HTTP 201).
    Created(Rule),
    /// The rule existed and now has a new version (HTTP 200).
    Replaced(Rule),
}

impl Put {
    /// The rule as it now stands.
    pub fn rule(&self) -> &Rule {
        match self {
            Put::Created(rule) | Put::Replaced(rule) => rule,
        }
    }
}

/// What applying files did, or would do, to one rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    /// The files hold it and no rule of its id stood.
    Created,
    /// The files hold it otherwise than it stood.
    Replaced,
    /// The files hold it as it stands: nothing written.
    Unchanged,
    /// A rule of a file no longer holds it (`--prune`).
    Deleted,
}

impl Applied {
    /// Its text: `created`, `replaced`, `unchanged` or `deleted`.
    pub fn as_str(self) -> &'static str {
        match self {
            Applied::Created => "created",
            Applied::Replaced => "replaced",
            Applied::Unchanged => "unchanged",
            Applied::Deleted => "deleted",
        }
    }
}

/// One rule's change by an apply of files.
#[derive(Clone, Debug, PartialEq)]
pub struct FileChange {
    /// The rule.
    pub id: RuleId,
    /// Its descriptor path, as envoyproxy/ratelimit names it (`domain.key_value.key`).
    pub path: String,
    /// The file it is from (for a deletion, the file it was from).
    pub source: String,
    /// What happened to it.
    pub applied: Applied,
    /// The version the change made; `None` when nothing was written (unchanged, or a dry run).
    pub version: Option<Version>,
}

/// Which rules from files that the files no longer hold an apply deletes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prune {
    /// None.
    Nothing,
    /// Those of the domains the files hold (`rules apply --prune`).
    SameDomains,
    /// Every rule applied from files (`PLEXSPHERE_RULES_DIR`: the directory is the truth).
    EveryFileRule,
}

/// How many times an apply is planned again when a rule changed between its plan and its
/// writes.
const APPLY_ATTEMPTS: usize = 3;

/// Rules over a store. Cloning is cheap and clones share the store.
#[derive(Clone)]
pub struct RulesService {
    repository: Arc<dyn RulesRepository>,
}

impl RulesService {
    /// A service over `repository`.
    pub fn new(repository: Arc<dyn RulesRepository>) -> RulesService {
        RulesService { repository }
    }

    /// Writes rule `id`: creates it when `if_match` is `None`, replaces it when `if_match` is
    /// its current version.
    ///
    /// # Errors
    /// - [`WriteError::PreconditionRequired`] when no version was named and the rule exists.
    /// - [`WriteError::PreconditionFailed`] when the version named is not the rule's (or the
    ///   rule does not exist).
    /// - [`WriteError::Unavailable`] when the store could not answer.
    #[tracing::instrument(level = "debug", skip_all, fields(rule = %id))]
    pub async fn put(
        &self,
        id: &RuleId,
        spec: &RuleSpec,
        if_match: Option<Version>,
        actor: &Actor,
    ) -> Result<Put, WriteError> {
        match if_match {
            None => match self.repository.create(id, spec, actor).await? {
                Created::Created(rule) => Ok(Put::Created(rule)),
                Created::Exists(current) => Err(WriteError::PreconditionRequired { current }),
            },
            Some(expected) => match self.repository.replace(id, spec, expected, actor).await? {
                Replaced::Applied(rule) => Ok(Put::Replaced(rule)),
                Replaced::Stale { current } => Err(WriteError::PreconditionFailed { current }),
            },
        }
    }

    /// Makes the rules stand as `files` say (each a rule of a file), all in one transaction,
    /// each change a version as a `PUT` is; with `prune`, deletes the rules from files that
    /// the files no longer hold. With `dry_run`, only says what it would do. Applying the same
    /// files again changes nothing: a file rule's id is its domain and path.
    ///
    /// # Errors
    /// [`WriteError::Unavailable`] when the store could not answer (nothing written), or
    /// [`WriteError::PreconditionFailed`] when rules kept changing under it.
    pub async fn apply(
        &self,
        files: &crate::files::FileRules,
        prune: Prune,
        dry_run: bool,
        actor: &Actor,
    ) -> Result<Vec<FileChange>, WriteError> {
        for _ in 0..APPLY_ATTEMPTS {
            let standing = self.repository.list(None, None).await?;
            let (changes, writes) = plan(files, prune, &standing);
            if dry_run || writes.is_empty() {
                return Ok(changes);
            }
            let Some(versions) = self.repository.apply(&writes, actor).await? else {
                continue;
            };
            let mut versions = versions.into_iter();
            return Ok(changes
                .into_iter()
                .map(|mut change| {
                    if change.applied != Applied::Unchanged {
                        change.version = versions.next();
                    }
                    change
                })
                .collect());
        }
        Err(WriteError::PreconditionFailed { current: None })
    }

    /// Deletes rule `id` if it is at version `if_match`; returns the deletion's version. Its
    /// history stays, and a rollback can bring it back.
    ///
    /// # Errors
    /// [`WriteError::PreconditionFailed`] when the rule is not at that version (or does not
    /// exist); [`WriteError::Unavailable`] when the store could not answer.
    #[tracing::instrument(level = "debug", skip_all, fields(rule = %id))]
    pub async fn delete(&self, id: &RuleId, if_match: Version, actor: &Actor) -> Result<Version, WriteError> {
        match self.repository.delete(id, if_match, actor).await? {
            Replaced::Applied(version) => Ok(version),
            Replaced::Stale { current } => Err(WriteError::PreconditionFailed { current }),
        }
    }

    /// Writes the content of version `to` as rule `id`'s new version (recreating a deleted
    /// rule); only if the rule is at `if_match`, when one is named.
    ///
    /// # Errors
    /// [`WriteError::UnknownRule`], [`WriteError::UnknownVersion`],
    /// [`WriteError::DeletionVersion`], [`WriteError::PreconditionFailed`] (nothing written),
    /// or [`WriteError::Unavailable`].
    #[tracing::instrument(level = "debug", skip_all, fields(rule = %id, to = %to))]
    pub async fn rollback(
        &self,
        id: &RuleId,
        to: Version,
        if_match: Option<Version>,
        actor: &Actor,
    ) -> Result<Put, WriteError> {
        match self.repository.rollback(id, to, if_match, actor).await? {
            RolledBack::Applied { rule, recreated: true } => Ok(Put::Created(rule)),
            RolledBack::Applied { rule, recreated: false } => Ok(Put::Replaced(rule)),
            RolledBack::Stale { current } => Err(WriteError::PreconditionFailed { current }),
            RolledBack::UnknownRule => Err(WriteError::UnknownRule),
            RolledBack::UnknownVersion => Err(WriteError::UnknownVersion(to)),
            RolledBack::DeletionVersion => Err(WriteError::DeletionVersion(to)),
        }
    }

    /// The rule of this id, or `None`.
    ///
    /// # Errors
    /// [`RepositoryError`] when the store could not answer.
    pub async fn get(&self, id: &RuleId) -> Result<Option<Rule>, RepositoryError> {
        self.repository.get(id).await
    }

    /// Every rule, or every rule of `scope`, by id.
    ///
    /// # Errors
    /// [`RepositoryError`] when the store could not answer.
    pub async fn list(
        &self,
        scope: Option<Scope>,
        service: Option<&str>,
    ) -> Result<Vec<Rule>, RepositoryError> {
        self.repository.list(scope, service).await
    }

    /// Every version of rule `id`, oldest first; `None` when it was never written.
    ///
    /// # Errors
    /// [`RepositoryError`] when the store could not answer.
    pub async fn history(&self, id: &RuleId) -> Result<Option<Vec<RuleVersion>>, RepositoryError> {
        let versions = self.repository.history(id).await?;
        Ok((!versions.is_empty()).then_some(versions))
    }

    /// Every rule, compiled for resolution, as of one revision.
    ///
    /// # Errors
    /// [`RepositoryError`] when the store could not answer.
    pub async fn snapshot(&self) -> Result<Snapshot, RepositoryError> {
        let (revision, rules) = self.repository.load().await?;
        Ok(Snapshot::compile(revision, rules))
    }

    /// The rules' revision: a snapshot of an older one is missing a change.
    ///
    /// # Errors
    /// [`RepositoryError`] when the store could not answer.
    pub async fn revision(&self) -> Result<i64, RepositoryError> {
        self.repository.revision().await
    }

    /// Adds one replica's counts to the stored usage, in one statement.
    ///
    /// # Errors
    /// [`RepositoryError`] when they were not added (none of them were).
    pub async fn add_usage(&self, counts: &[UsageCount]) -> Result<(), RepositoryError> {
        if counts.is_empty() {
            return Ok(());
        }
        self.repository.add_usage(counts).await
    }

    /// Rule `id`'s usage per minute from `since` on; `None` when the rule was never written.
    ///
    /// # Errors
    /// [`RepositoryError`] when the store could not answer.
    pub async fn usage(
        &self,
        id: &RuleId,
        since: DateTime<Utc>,
    ) -> Result<Option<Vec<UsageMinute>>, RepositoryError> {
        if self.repository.history(id).await?.is_empty() {
            return Ok(None);
        }
        self.repository.usage(id, since).await.map(Some)
    }

    /// Deletes the usage of minutes before `before`.
    ///
    /// # Errors
    /// [`RepositoryError`] when the store could not answer.
    pub async fn prune_usage(&self, before: DateTime<Utc>) -> Result<u64, RepositoryError> {
        self.repository.prune_usage(before).await
    }
}

/// What applying `files` to the `standing` rules changes, and the writes that make it so (one
/// for each change that is not [`Applied::Unchanged`], in the same order).
fn plan(
    files: &crate::files::FileRules,
    prune: Prune,
    standing: &[Rule],
) -> (Vec<FileChange>, Vec<crate::Write>) {
    use crate::Write;
    let by_id: std::collections::HashMap<&RuleId, &Rule> =
        standing.iter().map(|rule| (&rule.id, rule)).collect();
    let mut changes = Vec::new();
    let mut writes = Vec::new();
    for rules in files.domains.values() {
        for (id, spec) in rules {
            let descriptor = spec.descriptor().expect("a file's rules are descriptor rules");
            let (applied, write) = match by_id.get(id) {
                None => (Applied::Created, Some(Write::Create { id: id.clone(), spec: spec.clone() })),
                Some(rule) if rule.spec == *spec => (Applied::Unchanged, None),
                Some(rule) => (
                    Applied::Replaced,
                    Some(Write::Replace { id: id.clone(), spec: spec.clone(), expected: rule.version }),
                ),
            };
            changes.push(FileChange {
                id: id.clone(),
                path: descriptor.stats_key(),
                source: descriptor.source.clone(),
                applied,
                version: None,
            });
            writes.extend(write);
        }
    }
    if prune != Prune::Nothing {
        for rule in standing {
            let Some(descriptor) = rule.spec.descriptor() else { continue };
            let held = files.domains.get(&descriptor.service);
            if held.is_some_and(|rules| rules.contains_key(&rule.id)) {
                continue;
            }
            if prune == Prune::SameDomains && held.is_none() {
                continue;
            }
            changes.push(FileChange {
                id: rule.id.clone(),
                path: descriptor.stats_key(),
                source: descriptor.source.clone(),
                applied: Applied::Deleted,
                version: None,
            });
            writes.push(Write::Delete { id: rule.id.clone(), expected: rule.version });
        }
    }
    (changes, writes)
}
