//! The budgets every take is sized by: the operators' rules where one governs, the knobs where
//! none does, each Domain in its tier; kept current on every replica.
//!
//! [`RuleBudgets`] is the [`ratebudget::Budgets`] the limiters ask on every take. It holds two
//! things loaded from the database, each with the revision it was read at:
//! - the rules, compiled into a [`rules::Snapshot`] (and, beside each rule, the
//!   [`ratebudget::Policy`] a take carries);
//! - the tier directory: every Domain whose tier is not the default (the access context owns
//!   tiers; the rules only select by them).
//!
//! [`follow`] keeps both current: it hears, through a channel the replica's listener feeds
//! ([`Heard`]), the notification every change sends at commit, so a
//! rule written through any replica governs this one's decisions within milliseconds, and it
//! compares the two revisions with the database every
//! `PLEXSPHERE_RULES_POLL_INTERVAL_MS`, the backstop for a notification missed on a
//! connection that died silently. When the listener (re)connects it reads both again, since
//! whatever changed while nobody listened is unknown. Every load replaces the whole snapshot
//! (rules are operator-written: thousands, not millions), and a snapshot older than the one
//! held is never installed, so concurrent loads cannot go back in time.
//!
//! A change that may let a budget grow makes the guard forget what its pre-check knew of the
//! buckets the change governs ([`Precheck`], which [`ratebudget::Guard`] is): what it learned
//! under the old budget would otherwise refuse, for a moment, what the new one admits.
//!
//! Until both have been loaded once, no take is decided (a 500, never a refusal) and the
//! replica is not ready: deciding on the knobs alone would admit what a rule forbids.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::{Duration, Instant};

use ratebudget::{cause_chain, BoxError, Guard, Key, Name, Policy, Scope};
use rules::RuleRefs;
use rules::{Level, Rule, Selector, Snapshot};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::defaults::DefaultBudgets;

/// What this replica's guard learned of buckets, which a budget that may have grown makes it
/// forget. [`ratebudget::Guard`] is one; a unit test's is a mock.
#[cfg_attr(test, mockall::automock)]
pub trait Precheck: Send + Sync + std::fmt::Debug {
    /// Forgets one bucket.
    fn forget(&self, name: Name, key: Key);
    /// Forgets every bucket under `name`.
    fn forget_every_bucket_of(&self, name: Name);
    /// How many buckets it remembers, for the metrics.
    fn remembered_buckets(&self) -> u64;
}

impl Precheck for Guard {
    fn forget(&self, name: Name, key: Key) {
        Guard::forget(self, name, key);
    }

    fn forget_every_bucket_of(&self, name: Name) {
        Guard::forget_every_bucket_of(self, name);
    }

    fn remembered_buckets(&self) -> u64 {
        Guard::remembered_buckets(self)
    }
}

/// What the metrics show of the snapshot, the tier directory and the guard.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Reading {
    /// The rules' revision the snapshot holds (-1 before the first load).
    pub snapshot_version: i64,
    /// Seconds since the snapshot was last known current (loaded, or its revision confirmed).
    pub snapshot_age_seconds: f64,
    /// The tiers' revision the directory holds (-1 before the first load).
    pub tiers_version: i64,
    /// Buckets the guard's pre-check and fallback remember.
    pub precheck_buckets: u64,
}

impl Default for Reading {
    /// Nothing loaded.
    fn default() -> Self {
        Reading { snapshot_version: -1, snapshot_age_seconds: 0.0, tiers_version: -1, precheck_buckets: 0 }
    }
}

/// The budget every other service's buckets are under: one name for all of them, each bucket
/// keyed by its descriptor's runtime key (which holds the service).
pub fn service_buckets() -> Name {
    static NAME: OnceLock<Name> = OnceLock::new();
    *NAME.get_or_init(|| Name::new("service_requests").expect("a valid budget name"))
}

/// The budget the buckets of Envoy's limit overrides are under: an override says its own
/// limit, up to a year's, so the sweep keeps these for a year and a day idle
/// ([`RuleBudgets::retained`]) rather than judge them by rules they do not follow.
pub fn override_buckets() -> Name {
    static NAME: OnceLock<Name> = OnceLock::new();
    *NAME.get_or_init(|| Name::new("service_overrides").expect("a valid budget name"))
}

/// A Domain's tier as the rules select by it: the same four, by the same text.
pub fn rules_tier(tier: access::Tier) -> rules::Tier {
    match tier {
        access::Tier::Free => rules::Tier::Free,
        access::Tier::Standard => rules::Tier::Standard,
        access::Tier::Premium => rules::Tier::Premium,
        access::Tier::Enterprise => rules::Tier::Enterprise,
    }
}

/// The rules compiled, with the policy each one gives a take, index for index.
#[derive(Debug)]
pub struct CompiledRules {
    /// The rules.
    pub snapshot: Snapshot,
    /// Each rule's policy, at its index in the snapshot.
    pub policies: Vec<Policy>,
}

impl CompiledRules {
    /// `snapshot` with each rule's policy, numbered by `refs` (usage counts name rules by
    /// these numbers).
    fn with_refs(snapshot: Snapshot, refs: &RuleRefs) -> CompiledRules {
        let policies = snapshot.rules().iter().map(|rule| rule.spec.policy(refs.intern(&rule.id))).collect();
        CompiledRules { snapshot, policies }
    }
}

/// The tier directory: every Domain off the default tier.
#[derive(Debug)]
struct Tiers {
    revision: i64,
    of: HashMap<Uuid, rules::Tier>,
}

#[derive(Debug, Default)]
struct State {
    rules: Option<Arc<CompiledRules>>,
    tiers: Option<Arc<Tiers>>,
    /// When the rules were last known current.
    confirmed_at: Option<Instant>,
}

/// Rules and tiers are not loaded yet: nothing may be decided.
#[derive(Debug, thiserror::Error)]
#[error("this replica has not loaded the rate-budget rules and Domain tiers yet")]
pub struct NotLoaded;

/// What governs one scope for one Domain, and why.
#[derive(Clone, Debug)]
pub struct Explained {
    /// The scope.
    pub scope: Scope,
    /// The policy its takes carry.
    pub policy: Policy,
    /// The rule that governs, and its level; `None`: the knobs.
    pub governed_by: Option<(Level, Rule)>,
    /// Rules that select the Domain for this scope too, and lost, in precedence order.
    pub outranked: Vec<(Level, Rule)>,
}

/// The policies of every take, from the rules, the tiers and the knob defaults.
#[derive(Debug)]
pub struct RuleBudgets {
    defaults: DefaultBudgets,
    state: RwLock<State>,
    guard: Arc<dyn Precheck>,
    refs: RuleRefs,
}

/// The tier of Domains the directory does not name.
fn default_tier() -> rules::Tier {
    rules_tier(access::Tier::DEFAULT)
}

impl RuleBudgets {
    /// Budgets defaulting to `defaults`, forgetting what `guard` learned when a budget may
    /// grow, numbering rules with `refs`. Nothing is decided until [`RuleBudgets::reload`]
    /// (or [`follow`]) has loaded the rules and tiers once.
    pub fn new(defaults: DefaultBudgets, guard: Arc<dyn Precheck>, refs: RuleRefs) -> RuleBudgets {
        RuleBudgets { defaults, state: RwLock::default(), guard, refs }
    }

    /// The policy of `scope` where no rule governs: its default budget, enforced.
    pub fn default_policy(&self, scope: Scope) -> Policy {
        self.defaults.policy(scope)
    }

    /// The rules this replica decides by now.
    ///
    /// # Errors
    /// [`NotLoaded`] before the rules were loaded.
    pub fn compiled_rules(&self) -> Result<Arc<CompiledRules>, NotLoaded> {
        read(&self.state).rules.clone().ok_or(NotLoaded)
    }

    /// Whether `service` has rules in the snapshot held (a bounded set of metric labels).
    pub fn has_service_rules(&self, service: &str) -> bool {
        read(&self.state).rules.as_ref().is_some_and(|rules| rules.snapshot.has_service(service))
    }

    /// Whether the rules and tiers have been loaded: the replica decides only then.
    pub fn loaded(&self) -> bool {
        let state = read(&self.state);
        state.rules.is_some() && state.tiers.is_some()
    }

    /// The names whose buckets the sweep must keep idle for longer than the hour, and for how
    /// long: every other service's buckets (they are one name) until the slowest of its rules
    /// has refilled them, which is the longest refill of any service rule this replica holds,
    /// and a year and a day before the rules are loaded; the buckets of Envoy's limit
    /// overrides (which follow no rule) a year and a day. Our own scopes' budgets refill within
    /// the hour (`ratebudget::Limit::new`), so none of theirs is here.
    ///
    /// Whatever rule governs a bucket now, its tokens were not negative when last taken from,
    /// so once idle for the longest refill of the current rules it is full under any of them:
    /// deleting it is what the next take would mint. A rule that slows a refill is heard by
    /// the sweeping leader within a second, as by every replica; a snapshot not confirmed
    /// current within `fresh_within` (the listener down and the poll failing) is not trusted
    /// to say how slow the rules are, and the buckets are kept a year and a day.
    pub fn retained(&self, fresh_within: Duration) -> Vec<(Name, Duration)> {
        let state = read(&self.state);
        let fresh = state.confirmed_at.is_some_and(|at| at.elapsed() <= fresh_within);
        let longest = match &state.rules {
            Some(rules) if fresh => rules
                .snapshot
                .rules()
                .iter()
                .zip(&rules.policies)
                .filter(|(rule, _)| matches!(rule.spec.target(), rules::Target::Service { .. }))
                .map(|(_, policy)| policy.limit.refill_time())
                .max()
                .unwrap_or_default(),
            _ => ratebudget::Limit::MAX_REFILL_TIME,
        };
        let overrides = (override_buckets(), ratebudget::Limit::MAX_REFILL_TIME);
        if longest <= ratebudget::IDLE_RETENTION {
            vec![overrides]
        } else {
            vec![(service_buckets(), longest), overrides]
        }
    }

    /// What `/metrics` shows of the snapshot, the directory and the guard.
    pub fn reading(&self) -> Reading {
        let state = read(&self.state);
        Reading {
            snapshot_version: state.rules.as_ref().map_or(-1, |rules| rules.snapshot.revision()),
            snapshot_age_seconds: state.confirmed_at.map_or(0.0, |at| at.elapsed().as_secs_f64()),
            tiers_version: state.tiers.as_ref().map_or(-1, |tiers| tiers.revision),
            precheck_buckets: self.guard.remembered_buckets(),
        }
    }

    /// What governs each scope for `domain`, in `tier`, on this replica now, and why; with the
    /// snapshot's revision.
    ///
    /// # Errors
    /// [`NotLoaded`] before the rules were loaded.
    pub fn explain(&self, domain: Uuid, tier: access::Tier) -> Result<(i64, Vec<Explained>), NotLoaded> {
        let rules = read(&self.state).rules.clone().ok_or(NotLoaded)?;
        let tier = rules_tier(tier);
        let explained = Scope::ALL
            .into_iter()
            .map(|scope| {
                let mut candidates = rules.snapshot.candidates(scope, domain, tier);
                let winner = candidates.next();
                Explained {
                    scope,
                    policy: winner
                        .map_or_else(|| self.default_policy(scope), |won| rules.policies[won.index]),
                    governed_by: winner.map(|won| (won.level, won.rule.clone())),
                    outranked: candidates.map(|lost| (lost.level, lost.rule.clone())).collect(),
                }
            })
            .collect();
        Ok((rules.snapshot.revision(), explained))
    }

    /// Reads the rules again and installs them (unless a newer snapshot is held already).
    ///
    /// # Errors
    /// When the rules could not be read; the snapshot held stays.
    pub async fn reload_rules(&self, rules: &rules::RulesService) -> Result<(), rules::RepositoryError> {
        let snapshot = rules.snapshot().await?;
        self.install_rules(snapshot);
        Ok(())
    }

    /// Reads the tier directory again and installs it (unless a newer one is held already).
    ///
    /// # Errors
    /// When the tiers could not be read; the directory held stays.
    pub async fn reload_tiers(&self, access: &access::AccessService) -> Result<(), access::RepositoryError> {
        self.install_tiers(access.tiers().await?);
        Ok(())
    }

    /// Reads both again: at start, and whenever changes may have been missed.
    ///
    /// # Errors
    /// The first that could not be read, as a cause for the log.
    pub async fn reload(&self, sources: &Sources) -> Result<(), BoxError> {
        self.reload_rules(&sources.rules).await?;
        self.reload_tiers(&sources.access).await?;
        Ok(())
    }

    /// Compares the revisions held with the database's, and reloads whichever moved on: the
    /// backstop for a missed notification.
    ///
    /// # Errors
    /// The first revision or load that could not be read, as a cause for the log.
    pub async fn check(&self, sources: &Sources) -> Result<(), BoxError> {
        let revision = sources.rules.revision().await?;
        let held = read(&self.state).rules.as_ref().map(|rules| rules.snapshot.revision());
        if held == Some(revision) {
            write(&self.state).confirmed_at = Some(Instant::now());
        } else {
            self.reload_rules(&sources.rules).await?;
        }
        let revision = sources.access.tier_revision().await?;
        let held = read(&self.state).tiers.as_ref().map(|tiers| tiers.revision);
        if held != Some(revision) {
            self.reload_tiers(&sources.access).await?;
        }
        Ok(())
    }

    /// Installs `snapshot`, unless a newer one is held already, and makes the guard forget the
    /// buckets of every budget that may have grown since the one held.
    pub fn install_rules(&self, snapshot: Snapshot) {
        let compiled = Arc::new(CompiledRules::with_refs(snapshot, &self.refs));
        let replaced = {
            let mut state = write(&self.state);
            let held = state.rules.clone();
            if held.as_ref().is_some_and(|held| held.snapshot.revision() > compiled.snapshot.revision()) {
                return;
            }
            state.rules = Some(compiled.clone());
            state.confirmed_at = Some(Instant::now());
            held
        };
        if let Some(held) = replaced {
            if held.snapshot.revision() != compiled.snapshot.revision() {
                tracing::info!(
                    from = held.snapshot.revision(),
                    to = compiled.snapshot.revision(),
                    rules = compiled.snapshot.rules().len(),
                    "installed a new rate-budget rules snapshot"
                );
            }
            forget(&*self.guard, compiled.snapshot.grown_since(&held.snapshot));
            // A service's buckets are keyed by its requests: forget all of them.
            if !compiled.snapshot.services_grown_since(&held.snapshot).is_empty() {
                self.guard.forget_every_bucket_of(service_buckets());
            }
        }
    }

    /// Installs `directory`, unless a newer one is held already, and makes the guard forget the
    /// buckets of every Domain that moved tier.
    pub fn install_tiers(&self, directory: access::TierDirectory) {
        let of =
            directory.tiers.into_iter().map(|(domain, tier)| (domain.as_uuid(), rules_tier(tier))).collect();
        let tiers = Arc::new(Tiers { revision: directory.revision, of });
        let replaced = {
            let mut state = write(&self.state);
            let held = state.tiers.clone();
            if held.as_ref().is_some_and(|held| held.revision > tiers.revision) {
                return;
            }
            state.tiers = Some(tiers.clone());
            held
        };
        if let Some(held) = replaced {
            let moved = held
                .of
                .iter()
                .filter(|(domain, tier)| tiers.of.get(*domain) != Some(*tier))
                .chain(tiers.of.iter().filter(|(domain, tier)| held.of.get(*domain) != Some(*tier)))
                .map(|(domain, _)| *domain);
            // A Domain that moved tier may now have a larger budget in any scope.
            let selectors: HashSet<Selector> = moved.map(Selector::Domain).collect();
            forget(
                &*self.guard,
                selectors.into_iter().flat_map(|selector| Scope::ALL.map(|scope| (scope, selector))),
            );
        }
    }
}

impl ratebudget::Budgets for RuleBudgets {
    fn policy(&self, scope: Scope, domain: Key) -> Result<Policy, BoxError> {
        let state = read(&self.state);
        let (Some(rules), Some(tiers)) = (&state.rules, &state.tiers) else {
            return Err(NotLoaded.into());
        };
        let domain = domain.as_uuid();
        let tier = tiers.of.get(&domain).copied().unwrap_or_else(default_tier);
        Ok(match rules.snapshot.resolve(scope, domain, tier) {
            Some(governing) => rules.policies[governing.index],
            None => self.default_policy(scope),
        })
    }
}

/// Makes the guard forget the buckets governed at each (scope, selector): one Domain's own
/// bucket where the scope is keyed by the Domain and the selector names it, else the whole
/// scope (the guard does not know which Nodes belong to which Domain, or which tier).
fn forget(guard: &dyn Precheck, governed: impl IntoIterator<Item = (Scope, Selector)>) {
    let mut scopes = HashSet::new();
    for (scope, selector) in governed {
        match selector {
            Selector::Domain(domain) if scope.is_per_domain() => guard.forget(scope.name(), domain.into()),
            _ => {
                scopes.insert(scope);
            }
        }
    }
    for scope in scopes {
        guard.forget_every_bucket_of(scope.name());
    }
}

/// Where the rules and tiers are read from: services on the background pool.
#[derive(Clone)]
pub struct Sources {
    /// The rules.
    pub rules: rules::RulesService,
    /// The Domains' tiers.
    pub access: access::AccessService,
}

/// What the replica's listener tells [`follow`] it heard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Heard {
    /// The listener (re)connected: whatever changed while nobody listened is unknown.
    Connected,
    /// A rule changed ([`rules::CHANGES_CHANNEL`]); the payload is the revision it made, if it
    /// reads as one.
    Rules(Option<i64>),
    /// A Domain's tier changed ([`access::TIER_CHANNEL`]).
    Tiers,
}

/// Keeps `budgets` current until `shutdown`: reloads on what the listener hears (both on every
/// (re)connection, the one that changed on each announcement), and checks the revisions every
/// `poll`, the backstop for a notification missed on a connection that died silently.
pub async fn follow(
    budgets: Arc<RuleBudgets>,
    sources: Sources,
    mut heard: tokio::sync::mpsc::UnboundedReceiver<Heard>,
    poll: Duration,
    shutdown: CancellationToken,
) {
    let mut next_check = tokio::time::Instant::now() + poll;
    let mut listener_gone = false;
    loop {
        let event = tokio::select! {
            // Shutdown first: the listener ends on the same signal, and its end must not be
            // taken for an event to wait on.
            biased;
            () = shutdown.cancelled() => return,
            event = heard.recv(), if !listener_gone => match event {
                Some(event) => Some(event),
                // The listener is gone: the poll alone keeps the rules current. Waiting for
                // what will never come inside this arm would also stop watching for shutdown.
                None => {
                    listener_gone = true;
                    continue;
                }
            },
            () = tokio::time::sleep_until(next_check) => None,
        };
        match event {
            None => {
                next_check = tokio::time::Instant::now() + poll;
                if let Err(error) = budgets.check(&sources).await {
                    tracing::warn!(error = %cause_chain(error.as_ref()), "cannot check the rate-budget rules and Domain tiers are current");
                }
            }
            Some(Heard::Connected) => reload(&budgets, &sources).await,
            Some(Heard::Rules(announced)) => {
                let held = read(&budgets.state).rules.as_ref().map(|rules| rules.snapshot.revision());
                // Notifications of changes a load already holds cost nothing.
                if announced.is_none() || held < announced {
                    if let Err(error) = budgets.reload_rules(&sources.rules).await {
                        tracing::warn!(error = %cause_chain(&error), "cannot reload the rate-budget rules; the poll will retry");
                    }
                }
            }
            Some(Heard::Tiers) => {
                if let Err(error) = budgets.reload_tiers(&sources.access).await {
                    tracing::warn!(error = %cause_chain(&error), "cannot reload the Domain tiers; the poll will retry");
                }
            }
        }
    }
}

async fn reload(budgets: &RuleBudgets, sources: &Sources) {
    if let Err(error) = budgets.reload(sources).await {
        tracing::warn!(error = %cause_chain(error.as_ref()), "cannot load the rate-budget rules and Domain tiers; the poll will retry");
    }
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    // Every value behind these locks is replaced whole; a panic cannot tear one.
    lock.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests;
