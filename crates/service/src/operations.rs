//! Every operator action, once: what it does across the contexts, what it reloads on this
//! replica, and its audit entry. The HTTP routes and the command line both call these, so a
//! reset, a Domain's creation or a rekey means one thing whichever door it came through.
//!
//! Each action that changes something is recorded in the audit log, in the acting operator's
//! name, once it succeeded: the log holds what happened, not what was attempted. The action
//! and its entry are two writes; if the entry cannot be written the action stands and the
//! caller is told ([`OperationError::Audit`]), so the operator, seeing the failure, checks and
//! retries. A change made through a serving replica reloads that replica's rules or tiers
//! before it answers, so the operator's next request here is decided by it; a reload that fails
//! is logged, not answered, since the change is made and the listener or the poll brings it in.

use std::sync::Arc;

use ratebudget::{cause_chain, Bucket, Key, Limit, Name, Scope};
use uuid::Uuid;

use crate::budgets::{Precheck, RuleBudgets};

/// The buckets of the rate-budget store an operator reads and resets: [`ratebudget::Store`],
/// or a mock in a unit test.
#[cfg_attr(test, mockall::automock)]
#[async_trait::async_trait]
pub trait BucketStore: Send + Sync {
    /// Every bucket kept under `key`, of any budget.
    ///
    /// # Errors
    /// When the store could not answer.
    async fn buckets(&self, key: Key) -> Result<Vec<Bucket>, ratebudget::Error>;

    /// Forgets the bucket of `key` under `name` (a scope's, or another service's) and tells
    /// every replica; whether there was one.
    ///
    /// # Errors
    /// When the store could not answer; then nothing MUST have been forgotten, and the reset
    /// MUST have committed before `Ok`.
    async fn reset(&self, name: Name, key: Key) -> Result<bool, ratebudget::Error>;
}

#[async_trait::async_trait]
impl BucketStore for ratebudget::Store {
    async fn buckets(&self, key: Key) -> Result<Vec<Bucket>, ratebudget::Error> {
        ratebudget::Store::buckets(self, key).await
    }

    async fn reset(&self, name: Name, key: Key) -> Result<bool, ratebudget::Error> {
        ratebudget::Store::reset(self, name, key).await
    }
}

/// Whose id a bucket's key is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holder {
    /// A Domain's.
    Domain,
    /// A Node's.
    Node,
}

impl Holder {
    /// The holder's name, as messages say it.
    pub fn as_str(self) -> &'static str {
        match self {
            Holder::Domain => "Domain",
            Holder::Node => "Node",
        }
    }

    /// Whose id `scope`'s buckets are keyed by.
    pub fn keying(scope: Scope) -> Holder {
        if scope.is_per_domain() {
            Holder::Domain
        } else {
            Holder::Node
        }
    }

    fn subject(self, key: Uuid) -> audit::Subject {
        match self {
            Holder::Domain => audit::Subject { domain_id: Some(key), ..audit::Subject::default() },
            Holder::Node => audit::Subject { node_id: Some(key), ..audit::Subject::default() },
        }
    }
}

/// Why an operator action did not happen (or, for [`OperationError::Audit`], happened but was
/// not recorded).
#[derive(Debug, thiserror::Error)]
pub enum OperationError {
    /// No Domain has the id.
    #[error("no domain has the id {0}")]
    UnknownDomain(Uuid),
    /// The id is a Node's and the scope is keyed by a Domain's, or the other way round: nothing
    /// was reset.
    #[error("{key} is a {}'s id, and {scope} is keyed by a {}'s; nothing was reset", .holder.as_str(), Holder::keying(*.scope).as_str())]
    WrongHolder {
        /// The id.
        key: Uuid,
        /// Whose it is.
        holder: Holder,
        /// The scope asked for.
        scope: Scope,
    },
    /// No rule of the service governs the descriptor: it has no bucket to reset.
    #[error("no rule of service {service} governs that descriptor: it has no bucket")]
    Ungoverned {
        /// The service.
        service: String,
    },
    /// A field of the request is invalid; nothing was written.
    #[error("invalid {field}: {reason}")]
    Invalid {
        /// The field, as the request names it.
        field: &'static str,
        /// What it must be.
        reason: String,
    },
    /// The operator's name is not one a rule's history can record (never: an operator's name
    /// is 1 to 64 printable ASCII characters, a subset of what the history accepts).
    #[error("the operator's name cannot be recorded in a rule's history")]
    Actor(#[source] rules::InvalidRule),
    /// The Domain could not be created.
    #[error(transparent)]
    CreateDomain(#[from] access::CreateDomainError),
    /// The access context's store could not answer.
    #[error(transparent)]
    Access(#[from] access::RepositoryError),
    /// The Node could not be enrolled.
    #[error(transparent)]
    Enrol(#[from] access::EnrolError),
    /// The Node could not be revoked.
    #[error(transparent)]
    Revoke(#[from] access::RevokeError),
    /// The secret could not be written.
    #[error(transparent)]
    SecretWrite(#[from] secrets::WriteError),
    /// Re-sealing stopped in a batch.
    #[error("re-sealing stopped in batch {batch}")]
    Rekey {
        /// The batch, counted from 1.
        batch: usize,
        /// Why.
        #[source]
        source: secrets::RekeyError,
    },
    /// A rule could not be written.
    #[error(transparent)]
    RuleWrite(#[from] rules::WriteError),
    /// The rules' store could not answer.
    #[error(transparent)]
    Rules(#[from] rules::RepositoryError),
    /// The rate-budget store could not answer.
    #[error("the rate-budget store could not answer")]
    Store(#[source] ratebudget::Error),
    /// This replica has not loaded the rules yet.
    #[error(transparent)]
    NotLoaded(crate::budgets::NotLoaded),
    /// The action happened, but its audit entry could not be written.
    #[error(transparent)]
    Audit(#[from] audit::AuditLogError),
}

/// What a serving replica adds to the actions: its budgets, reloaded after a change made
/// through it, and its guard, which forgets a reset bucket at once (the others hear of it by
/// notification).
#[derive(Clone)]
pub struct Replica {
    /// The budgets its takes are sized by.
    pub budgets: Arc<RuleBudgets>,
    /// Its guard.
    pub precheck: Arc<dyn Precheck>,
}

/// The operator actions over the contexts' services.
#[derive(Clone)]
pub struct Operations {
    access: access::AccessService,
    rules: rules::RulesService,
    audit: Arc<dyn audit::AuditLog>,
    buckets: Arc<dyn BucketStore>,
    replica: Option<Replica>,
}

/// A Domain to create.
#[derive(Clone, Debug)]
pub struct NewDomain {
    /// Its name.
    pub name: access::DomainName,
    /// Its tier.
    pub tier: access::Tier,
    /// Its own issuance budget, which becomes its issuance override rule.
    pub issuance: Option<Limit>,
}

/// A Domain created, and the override rule its own issuance budget became.
#[derive(Clone, Debug)]
pub struct CreatedDomain {
    /// The Domain.
    pub domain: access::Domain,
    /// Its issuance override, if it has one.
    pub issuance: Option<rules::RuleSpec>,
}

/// One key's buckets, and whose id the key is (`None`: no Node or Domain has it, any more).
#[derive(Clone, Debug)]
pub struct Shown {
    /// Whose id it is.
    pub holder: Option<Holder>,
    /// Its buckets, as stored.
    pub buckets: Vec<Bucket>,
}

/// A reset done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reset {
    /// Whether there was a bucket (none: it was full already).
    pub existed: bool,
    /// Whose id the scope is keyed by.
    pub keyed_by: Holder,
    /// Whether a Node or Domain has the id (`false`: a typo, or one since deleted).
    pub held: bool,
}

/// A service's bucket reset: the rule that governs it, and whether there was one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceReset {
    /// The governing rule.
    pub rule_id: rules::RuleId,
    /// Whether there was a bucket (none: it was full already).
    pub existed: bool,
}

/// What a rekey did, in all.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rekeyed {
    /// Values re-sealed from old keys.
    pub resealed: usize,
    /// Values sealed from plain text.
    pub sealed_from_plaintext: usize,
    /// Values written meanwhile, left as they were.
    pub replaced_meanwhile: usize,
}

impl Operations {
    /// Actions over `access`, `rules` and the `buckets` store, recorded in `audit`.
    pub fn new(
        access: access::AccessService,
        rules: rules::RulesService,
        audit: Arc<dyn audit::AuditLog>,
        buckets: Arc<dyn BucketStore>,
    ) -> Operations {
        Operations { access, rules, audit, buckets, replica: None }
    }

    /// The same actions on a serving replica, which reloads and forgets as it acts.
    pub fn on_replica(self, replica: Replica) -> Operations {
        Operations { replica: Some(replica), ..self }
    }

    /// Creates a Domain. Its own issuance budget is its issuance override rule
    /// (`domain-<id>-issuance`), written first, under the Domain's id-to-be: if the Domain is
    /// then refused (its name taken), the rule governs no Domain and is deleted again (a store
    /// that could not answer may have stored the Domain, so its rule stays), whereas a Domain
    /// stored without its rule would be governed by the default. Every field is checked
    /// before either is written.
    ///
    /// # Errors
    /// [`OperationError::Invalid`] naming `issuance_per_second` or `issuance_burst`, a
    /// refusal of the Domain (its name in use), or a store that could not answer.
    pub async fn create_domain(
        &self,
        actor: audit::Actor,
        new: NewDomain,
    ) -> Result<CreatedDomain, OperationError> {
        let id = access::DomainId::random();
        let issuance = new.issuance.map(|limit| self.issuance_override(id, limit)).transpose()?;
        let mut written_override = None;
        if let Some(spec) = &issuance {
            let rule_id = rules::RuleId::issuance_override(id.as_uuid());
            let rules_actor = rules_actor(&actor)?;
            let put = self.rules.put(&rule_id, spec, None, &rules_actor).await?;
            written_override = Some((rule_id, put.rule().version, rules_actor));
        }
        let created =
            self.access.create_domain(access::NewDomain { id, name: new.name, tier: new.tier }).await;
        let domain = match created {
            Ok(domain) => domain,
            Err(refused) => {
                // Only a refusal leaves no Domain behind: a store that could not answer may
                // have stored it, and deleting its override would leave it governed by the
                // looser default. The rule governs only this id, so keeping it costs nothing.
                let stored_nothing = matches!(refused, access::CreateDomainError::NameTaken { .. });
                if let Some((rule_id, version, rules_actor)) = written_override.filter(|_| stored_nothing) {
                    // It governs an id nothing has; deleting it only keeps the rules tidy, so
                    // a failure here is logged and the caller hears of the Domain's refusal.
                    if let Err(error) = self.rules.delete(&rule_id, version, &rules_actor).await {
                        tracing::warn!(rule = %rule_id, error = %cause_chain(&error), "could not delete the issuance override of a domain that was not created");
                    }
                }
                return Err(refused.into());
            }
        };
        if issuance.is_some() {
            self.reload_rules().await;
        }
        if domain.tier != access::Tier::DEFAULT {
            self.reload_tiers().await;
        }
        let subject = audit::Subject { domain_id: Some(domain.id.as_uuid()), ..audit::Subject::default() };
        self.record(actor, audit::Action::CreateDomain, subject).await?;
        Ok(CreatedDomain { domain, issuance })
    }

    /// The override rule a Domain's own issuance budget stands for: its issuances a second,
    /// over a second, failing as the issuance scope's default does where this runs on a
    /// replica (else closed).
    fn issuance_override(
        &self,
        domain: access::DomainId,
        limit: Limit,
    ) -> Result<rules::RuleSpec, OperationError> {
        let scope = Scope::AccessIssuanceDomain;
        let fail_mode = self.replica.as_ref().map_or(ratebudget::FailMode::Closed, |replica| {
            replica.budgets.default_policy(scope).enforcement.fail_mode
        });
        let draft = rules::RuleDraft {
            service: None,
            scope: scope.as_str().to_owned(),
            selector: rules::Selector::Domain(domain.as_uuid()),
            rate: limit.per_second(),
            per_ms: Some(1000),
            burst: limit.burst(),
            algorithm: None,
            mode: None,
            fail_mode: Some(fail_mode.as_str().to_owned()),
            priority: None,
            charge: None,
        };
        draft.validate().map_err(|invalid| OperationError::Invalid {
            field: if invalid.field == "rate" { "issuance_per_second" } else { "issuance_burst" },
            reason: invalid.reason.to_string(),
        })
    }

    /// Moves a Domain to another tier, whose templates govern it from then on (on every
    /// replica within a second).
    ///
    /// # Errors
    /// [`OperationError::UnknownDomain`], or a store that could not answer.
    pub async fn set_tier(
        &self,
        actor: audit::Actor,
        domain: Uuid,
        tier: access::Tier,
    ) -> Result<access::Domain, OperationError> {
        let set =
            self.access.set_tier(domain.into(), tier).await?.ok_or(OperationError::UnknownDomain(domain))?;
        tracing::info!(domain = %set.id, %tier, "operator set a domain's tier");
        self.reload_tiers().await;
        let subject = audit::Subject { domain_id: Some(domain), ..audit::Subject::default() };
        self.record(actor, audit::Action::RetierDomain, subject).await?;
        Ok(set)
    }

    /// Enrols a Node into a Domain; its token is in the answer, once.
    ///
    /// # Errors
    /// The enrolment's refusal, or a store that could not answer.
    pub async fn enrol_node(
        &self,
        actor: audit::Actor,
        domain: Uuid,
        name: access::NodeName,
    ) -> Result<access::Enrolment, OperationError> {
        let enrolment = self.access.enrol_node(domain.into(), name).await?;
        let subject = audit::Subject {
            domain_id: Some(domain),
            node_id: Some(enrolment.node.id.as_uuid()),
            ..audit::Subject::default()
        };
        self.record(actor, audit::Action::EnrolNode, subject).await?;
        Ok(enrolment)
    }

    /// Revokes a Node: its token stops authenticating once the database's announcement reaches
    /// each replica (the caller drops it from a credential cache of its own at once).
    ///
    /// # Errors
    /// The revocation's refusal, or a store that could not answer.
    pub async fn revoke_node(
        &self,
        actor: audit::Actor,
        domain: Uuid,
        node: Uuid,
    ) -> Result<(), OperationError> {
        self.access.revoke_node(domain.into(), node.into()).await?;
        let subject =
            audit::Subject { domain_id: Some(domain), node_id: Some(node), ..audit::Subject::default() };
        self.record(actor, audit::Action::RevokeNode, subject).await
    }

    /// Writes a secret of a Domain. Domains belong to the access context and the secrets
    /// context trusts its caller to have checked, so a secret never lands under a Domain that
    /// does not exist.
    ///
    /// # Errors
    /// [`OperationError::UnknownDomain`], the write's refusal, or a store that could not
    /// answer.
    pub async fn put_secret(
        &self,
        actor: audit::Actor,
        secrets: &secrets::SecretsService,
        domain: Uuid,
        name: secrets::SecretName,
        value: secrets::SecretValue,
    ) -> Result<(), OperationError> {
        if self.access.find_domain(domain.into()).await?.is_none() {
            return Err(OperationError::UnknownDomain(domain));
        }
        let subject = audit::Subject {
            domain_id: Some(domain),
            secret_name: Some(name.as_str().to_owned()),
            ..audit::Subject::default()
        };
        secrets.write(domain.into(), name, value).await?;
        self.record(actor, audit::Action::PutSecret, subject).await
    }

    /// Whose id `key` is: a Domain's, a Node's, or nobody's (any more).
    ///
    /// # Errors
    /// A store that could not answer.
    pub async fn holder(&self, key: Uuid) -> Result<Option<Holder>, OperationError> {
        if self.access.find_domain(key.into()).await?.is_some() {
            return Ok(Some(Holder::Domain));
        }
        Ok(self.access.find_node(key.into()).await?.map(|_| Holder::Node))
    }

    /// Every bucket of one key, and whose id it is.
    ///
    /// # Errors
    /// A store that could not answer.
    pub async fn show_budgets(&self, key: Uuid) -> Result<Shown, OperationError> {
        let holder = self.holder(key).await?;
        let buckets = self.buckets.buckets(key.into()).await.map_err(OperationError::Store)?;
        Ok(Shown { holder, buckets })
    }

    /// Forgets `scope`'s bucket of `key`, so the next take on any replica mints it full. An id
    /// no Node or Domain has (any more) is reset all the same (a deleted holder's buckets wait
    /// for the sweep otherwise); an id of the wrong kind for the scope is refused, since the
    /// operator meant another bucket.
    ///
    /// # Errors
    /// [`OperationError::WrongHolder`] (nothing reset), or a store that could not answer.
    pub async fn reset_budget(
        &self,
        actor: audit::Actor,
        scope: Scope,
        key: Uuid,
    ) -> Result<Reset, OperationError> {
        let keyed_by = Holder::keying(scope);
        let holder = self.holder(key).await?;
        if let Some(holder) = holder.filter(|holder| *holder != keyed_by) {
            return Err(OperationError::WrongHolder { key, holder, scope });
        }
        let existed = self.buckets.reset(scope.name(), key.into()).await.map_err(OperationError::Store)?;
        if let Some(replica) = &self.replica {
            replica.precheck.forget(scope.name(), key.into());
        }
        self.record(actor, audit::Action::ResetBudget, keyed_by.subject(key)).await?;
        tracing::info!(%scope, %key, existed, "operator reset a rate budget");
        Ok(Reset { existed, keyed_by, held: holder.is_some() })
    }

    /// Forgets the bucket another service's descriptor of `entries` is decided in (by the rule
    /// that governs it now, resolved as a decision resolves it), so its next request on any
    /// replica finds it full. A serving replica resolves by the rules it decides by; the
    /// command line by the rules as stored.
    ///
    /// # Errors
    /// [`OperationError::Ungoverned`] (nothing reset), or a store that could not answer.
    pub async fn reset_service_bucket(
        &self,
        actor: audit::Actor,
        service: &str,
        entries: &[crate::decide::Entry],
    ) -> Result<ServiceReset, OperationError> {
        if service == rules::OWN_SERVICE {
            // Our own budgets' buckets are a Node's or a Domain's: `reset_budget` resets them.
            return Err(OperationError::Ungoverned { service: service.to_owned() });
        }
        // A replica's own snapshot (what it decides by), else the rules as stored.
        let (held, loaded);
        let snapshot = match &self.replica {
            Some(replica) => {
                held = replica.budgets.compiled_rules().map_err(OperationError::NotLoaded)?;
                &held.snapshot
            }
            None => {
                loaded = self.rules.snapshot().await?;
                &loaded
            }
        };
        let governed = crate::decide::governing_bucket(snapshot, service, entries)
            .ok_or_else(|| OperationError::Ungoverned { service: service.to_owned() })?;
        let name = crate::budgets::service_buckets();
        let existed = self.buckets.reset(name, governed.key).await.map_err(OperationError::Store)?;
        if let Some(replica) = &self.replica {
            replica.precheck.forget(name, governed.key);
        }
        let subject = audit::Subject {
            rule_id: Some(governed.rule.id.to_string()),
            rule_version: Some(governed.rule.version.get()),
            ..audit::Subject::default()
        };
        self.record(actor, audit::Action::ResetServiceBucket, subject).await?;
        tracing::info!(service, rule = %governed.rule.id, existed, "operator reset a service's bucket");
        Ok(ServiceReset { rule_id: governed.rule.id.clone(), existed })
    }

    /// Re-seals every secret under the current key, `batch_size` at a time, telling
    /// `progress` of each batch (its number from 1, and what it did).
    ///
    /// # Errors
    /// [`OperationError::Rekey`] naming the batch that stopped (the batches before it stand).
    pub async fn rekey_secrets(
        &self,
        actor: audit::Actor,
        secrets: &secrets::SecretsService,
        batch_size: std::num::NonZeroUsize,
        progress: &mut (dyn FnMut(usize, &secrets::RekeyBatch) + Send),
    ) -> Result<Rekeyed, OperationError> {
        let mut rekeyed = Rekeyed::default();
        let mut after = None;
        for batch_number in 1.. {
            let batch = secrets
                .rekey_batch(after.as_ref(), batch_size.get())
                .await
                .map_err(|source| OperationError::Rekey { batch: batch_number, source })?;
            progress(batch_number, &batch);
            rekeyed.resealed += batch.resealed;
            rekeyed.sealed_from_plaintext += batch.sealed_from_plaintext;
            rekeyed.replaced_meanwhile += batch.replaced_meanwhile;
            after = batch.next;
            if after.is_none() {
                break;
            }
        }
        self.record(actor, audit::Action::RekeySecrets, audit::Subject::default()).await?;
        Ok(rekeyed)
    }

    /// Writes rule `id` (creates it, or with `if_match` replaces that version of it).
    ///
    /// # Errors
    /// The write's refusal (a version conflict), or a store that could not answer.
    pub async fn put_rule(
        &self,
        actor: audit::Actor,
        id: &rules::RuleId,
        spec: &rules::RuleSpec,
        if_match: Option<rules::Version>,
    ) -> Result<rules::Put, OperationError> {
        let rules_actor = rules_actor(&actor)?;
        let put = self.rules.put(id, spec, if_match, &rules_actor).await?;
        tracing::info!(rule = %id, version = %put.rule().version, actor = rules_actor.as_str(), "operator wrote a rule");
        self.reload_rules().await;
        self.record_rule_change(actor, audit::Action::PutRule, id, put.rule().version).await?;
        Ok(put)
    }

    /// Writes a new version of rule `id` with version `to`'s content (recreating a deleted
    /// rule), if it is at `if_match` when one is named.
    ///
    /// # Errors
    /// As [`Operations::put_rule`].
    pub async fn rollback_rule(
        &self,
        actor: audit::Actor,
        id: &rules::RuleId,
        to: rules::Version,
        if_match: Option<rules::Version>,
    ) -> Result<rules::Put, OperationError> {
        let rules_actor = rules_actor(&actor)?;
        let put = self.rules.rollback(id, to, if_match, &rules_actor).await?;
        tracing::info!(rule = %id, %to, version = %put.rule().version, actor = rules_actor.as_str(), "operator rolled back a rule");
        self.reload_rules().await;
        self.record_rule_change(actor, audit::Action::RollBackRule, id, put.rule().version).await?;
        Ok(put)
    }

    /// Deletes rule `id` if it is at `if_match`; the deletion's version.
    ///
    /// # Errors
    /// As [`Operations::put_rule`].
    pub async fn delete_rule(
        &self,
        actor: audit::Actor,
        id: &rules::RuleId,
        if_match: rules::Version,
    ) -> Result<rules::Version, OperationError> {
        let rules_actor = rules_actor(&actor)?;
        let version = self.rules.delete(id, if_match, &rules_actor).await?;
        tracing::info!(rule = %id, %version, actor = rules_actor.as_str(), "operator deleted a rule");
        self.reload_rules().await;
        self.record_rule_change(actor, audit::Action::DeleteRule, id, version).await?;
        Ok(version)
    }

    /// Makes the rules stand as envoyproxy/ratelimit's configuration `files` say, in one
    /// transaction ([`rules::RulesService::apply`]), each change audited as a `PUT` or a
    /// `DELETE` of the rule is, and heard by every replica; with `dry_run`, only says what it
    /// would do.
    ///
    /// # Errors
    /// A store that could not answer, or rules that kept changing under the apply (nothing
    /// written); an audit entry that could not be written after the changes were.
    pub async fn apply_rule_files(
        &self,
        actor: audit::Actor,
        files: &rules::files::FileRules,
        prune: rules::Prune,
        dry_run: bool,
    ) -> Result<Vec<rules::FileChange>, OperationError> {
        let rules_actor = rules_actor(&actor)?;
        let changes = self.rules.apply(files, prune, dry_run, &rules_actor).await?;
        let written: Vec<&rules::FileChange> =
            changes.iter().filter(|change| change.version.is_some()).collect();
        if written.is_empty() {
            return Ok(changes);
        }
        tracing::info!(changes = written.len(), actor = rules_actor.as_str(), "applied rules from files");
        self.reload_rules().await;
        for change in written {
            let action = match change.applied {
                rules::Applied::Deleted => audit::Action::DeleteRule,
                _ => audit::Action::PutRule,
            };
            let version = change.version.expect("filtered on a version");
            self.record_rule_change(actor.clone(), action, &change.id, version).await?;
        }
        Ok(changes)
    }

    /// Records a rule change: who, what, which rule and the version the change made. The
    /// rule's own history has it too, written with the change itself.
    async fn record_rule_change(
        &self,
        actor: audit::Actor,
        action: audit::Action,
        id: &rules::RuleId,
        version: rules::Version,
    ) -> Result<(), OperationError> {
        let subject = audit::Subject {
            rule_id: Some(id.to_string()),
            rule_version: Some(version.get()),
            ..audit::Subject::default()
        };
        self.record(actor, action, subject).await
    }

    /// Records that `actor` did `action` to `subject`, once it succeeded.
    async fn record(
        &self,
        actor: audit::Actor,
        action: audit::Action,
        subject: audit::Subject,
    ) -> Result<(), OperationError> {
        self.audit.record(&audit::NewEntry { actor, action, subject }).await?;
        Ok(())
    }

    /// Reloads this replica's rules after a change made through it.
    async fn reload_rules(&self) {
        let Some(replica) = &self.replica else { return };
        if let Err(error) = replica.budgets.reload_rules(&self.rules).await {
            tracing::warn!(error = %cause_chain(&error), "cannot reload the rules after a change; the listener will");
        }
    }

    /// Reloads this replica's tier directory after a change made through it.
    async fn reload_tiers(&self) {
        let Some(replica) = &self.replica else { return };
        if let Err(error) = replica.budgets.reload_tiers(&self.access).await {
            tracing::warn!(error = %cause_chain(&error), "cannot reload the tiers after a change; the listener will");
        }
    }
}

/// An operator as a rule's history records it (`created_by`): the name its token is configured
/// under, the same name the audit log records.
fn rules_actor(actor: &audit::Actor) -> Result<rules::Actor, OperationError> {
    rules::Actor::new(actor.as_str()).map_err(OperationError::Actor)
}

#[cfg(test)]
mod tests;
