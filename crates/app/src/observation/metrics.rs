//! What `/metrics` exposes, in the OpenMetrics text format Prometheus scrapes.
//!
//! Each process (and each instance a test starts) has a registry of its own rather than a
//! global recorder, so two replicas in one test process report their own leadership.
//!
//! The reference names its OpenTelemetry instruments `ratelimit.decisions` and
//! `ratelimit.fallbacks`; here they are `plexsphere_rate_budget_decisions_total` (every
//! outcome, labelled) and the `fallback_granted`/`fallback_refused` outcomes of it, with
//! `plexsphere_rate_budget_fallback_active` saying when a scope decides without the store.

use std::fmt::Write as _;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Which budget a decision was about: a rate-budget scope, labelled with the text the table
/// stores, so the two can never drift apart.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct ScopeLabel(pub ratebudget::Scope);

impl EncodeLabelValue for ScopeLabel {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        encoder.write_str(self.0.as_str())
    }
}

/// How a decision came out. `error` is a budget that could not be evaluated (HTTP 500), never
/// counted as a refusal; a take cut off by the request's deadline counts as `error` too.
/// `shadow_refused` is a refusal by a budget in shadow mode, whose request was admitted;
/// `open_granted` a take admitted without a decision because the store could not answer and
/// its fail mode is open.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types, missing_docs)]
pub enum Outcome {
    granted,
    refused,
    precheck_refused,
    fallback_granted,
    fallback_refused,
    shadow_refused,
    open_granted,
    error,
}

impl Outcome {
    /// Every outcome, in the order the operator page lists them.
    pub const ALL: [Outcome; 8] = [
        Outcome::granted,
        Outcome::refused,
        Outcome::precheck_refused,
        Outcome::fallback_granted,
        Outcome::fallback_refused,
        Outcome::shadow_refused,
        Outcome::open_granted,
        Outcome::error,
    ];

    /// The label's text.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::granted => "granted",
            Outcome::refused => "refused",
            Outcome::precheck_refused => "precheck_refused",
            Outcome::fallback_granted => "fallback_granted",
            Outcome::fallback_refused => "fallback_refused",
            Outcome::shadow_refused => "shadow_refused",
            Outcome::open_granted => "open_granted",
            Outcome::error => "error",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DecisionLabels {
    scope: ScopeLabel,
    outcome: Outcome,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NamedLabels {
    limiter: &'static str,
    outcome: Outcome,
}

/// A decision for another service: the service (one with rules, else `other`, so the label
/// values stay as few as the services given rules) and `ok`, `over_limit` or `error`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServiceLabels {
    service: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RuleLabels {
    service: String,
    rule: String,
    verdict: &'static str,
}

/// A budget by its name: one of this project's scopes, or the budget other services'
/// decisions spend (names come from code, never from requests).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BudgetLabels {
    budget: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ScopeLabels {
    scope: ScopeLabel,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabels {
    pool: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SweepLabels {
    outcome: SweepOutcomeLabel,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
enum SweepOutcomeLabel {
    ok,
    error,
}

/// Reads a connection set's usage when `/metrics` is scraped: (in use, waiting), with
/// `None` for waiting where the set cannot tell.
type PoolProbe = Box<dyn Fn() -> (usize, Option<usize>) + Send + Sync>;

type LimitsProbe = Box<dyn Fn() -> service::budgets::Reading + Send + Sync>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FlushLabels {
    outcome: SweepOutcomeLabel,
}

/// What one look at `PLEXSPHERE_RULES_DIR` came to.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum RulesDirOutcome {
    /// Its files changed, and the rules now stand as they say.
    applied,
    /// A file was refused: nothing of any file was applied.
    refused,
    /// The store could not answer: tried again at the next look.
    error,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RulesDirLabels {
    outcome: RulesDirOutcome,
}

/// The most distinct rule labels the per-rule decision counts take (a file's
/// `detailed_metric` names each value); decisions past it are counted under `other`, so a
/// caller's values cannot grow the registry without bound.
const MAX_RULE_LABELS: usize = 5_000;

/// The process's metrics; cheap to clone (one reference count: every request clones it, and
/// a clone of each family's own handle was most of a request's CPU), clones share the registry.
#[derive(Clone)]
pub struct Metrics(Arc<Families>);

/// What [`Metrics`] shares.
pub struct Families {
    registry: Registry,
    leader: Gauge,
    revocations_listening: Gauge,
    secret_changes_listening: Gauge,
    decisions: Family<DecisionLabels, Counter>,
    named_decisions: Family<NamedLabels, Counter>,
    service_decisions: Family<ServiceLabels, Counter>,
    decide_duration: Histogram,
    rule_decisions: Family<RuleLabels, Counter>,
    take_duration: Family<ScopeLabels, Histogram>,
    fallback_active: Family<ScopeLabels, Gauge>,
    connections_in_use: Family<PoolLabels, Gauge>,
    connections_waiting: Family<PoolLabels, Gauge>,
    pools: Arc<Mutex<Vec<(&'static str, PoolProbe)>>>,
    sweeps: Family<SweepLabels, Counter>,
    swept_rows: Counter,
    clock_offset: Gauge<f64, AtomicU64>,
    rules_snapshot_version: Gauge,
    rules_snapshot_age: Gauge<f64, AtomicU64>,
    domain_tiers_version: Gauge,
    precheck_buckets: Gauge,
    limits_probe: Arc<Mutex<Option<LimitsProbe>>>,
    usage_flushes: Family<FlushLabels, Counter>,
    rules_dir_applies: Family<RulesDirLabels, Counter>,
    rule_labels: Mutex<std::collections::HashSet<(String, String)>>,
    leased_grants: Family<BudgetLabels, Counter>,
    leased_tokens: Family<BudgetLabels, Counter<f64, AtomicU64>>,
    lease_refunded_tokens: Family<BudgetLabels, Counter<f64, AtomicU64>>,
    /// The RLQS allocator's.
    pub(crate) quota: super::quota_metrics::QuotaFamilies,
}

impl std::ops::Deref for Metrics {
    type Target = Families;

    fn deref(&self) -> &Families {
        &self.0
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// A fresh registry with every metric registered (and the leader gauge at 0).
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("plexsphere");
        let leader = Gauge::default();
        registry.register(
            "leader",
            "1 on the replica that runs the background loops, 0 on the others",
            leader.clone(),
        );
        let revocations_listening = Gauge::default();
        let secret_changes_listening = Gauge::default();
        registry.register(
            "secret_change_listener_connected",
            "1 while this replica hears of changed secrets, so it answers reads from its cache of them",
            secret_changes_listening.clone(),
        );
        registry.register(
            "revocation_listener_connected",
            "1 while revocations reach this replica's credential cache, 0 while it is bypassed",
            revocations_listening.clone(),
        );
        let decisions = Family::<DecisionLabels, Counter>::default();
        registry.register(
            "rate_budget_decisions",
            "Rate-budget decisions by scope and outcome (error: the budget could not be evaluated)",
            decisions.clone(),
        );
        let named_decisions = Family::<NamedLabels, Counter>::default();
        registry.register(
            "named_limit_decisions",
            "Decisions of named (GCRA) limiters, such as auth_failure, by limiter and outcome",
            named_decisions.clone(),
        );
        let service_decisions = Family::<ServiceLabels, Counter>::default();
        registry.register(
            "decide_decisions",
            "Decisions for other services (POST /v1/decide, Envoy's ShouldRateLimit), by service (one with rules, else other) and outcome (ok, over_limit, forbidden, invalid: malformed as a message, error)",
            service_decisions.clone(),
        );
        let decide_duration =
            Histogram::new([0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0]);
        registry.register(
            "decide_duration_seconds",
            "How long a request for another service took to decide, from the rules to the answer",
            decide_duration.clone(),
        );
        let rule_decisions = Family::<RuleLabels, Counter>::default();
        registry.register(
            "decide_rule_decisions",
            "Descriptors of other services' requests, by service, governing rule and verdict (within_limit, near_limit: a fifth of the burst or less left, over_limit, shadow_over_limit), as envoyproxy/ratelimit counts a rule's hits",
            rule_decisions.clone(),
        );
        let take_duration = Family::<ScopeLabels, Histogram>::new_with_constructor(|| {
            Histogram::new([0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0])
        });
        registry.register(
            "rate_budget_take_duration_seconds",
            "How long a take took to decide, pre-check and fallback included, by scope",
            take_duration.clone(),
        );
        let fallback_active = Family::<ScopeLabels, Gauge>::default();
        registry.register(
            "rate_budget_fallback_active",
            "1 while the scope decides from this replica's fallback buckets because the shared store is failing",
            fallback_active.clone(),
        );
        let connections_in_use = Family::<PoolLabels, Gauge>::default();
        registry.register(
            "db_connections_in_use",
            "Database connections of a pool in use right now",
            connections_in_use.clone(),
        );
        let connections_waiting = Family::<PoolLabels, Gauge>::default();
        registry.register(
            "db_connections_waiting",
            "Callers waiting for a connection of a pool (only where the pool can tell)",
            connections_waiting.clone(),
        );
        let sweeps = Family::<SweepLabels, Counter>::default();
        registry.register(
            "rate_budget_sweeps",
            "Runs of the rate-budget-sweep loop on this replica",
            sweeps.clone(),
        );
        let swept_rows = Counter::default();
        registry.register(
            "rate_budget_swept_rows",
            "Idle rate-budget rows deleted by this replica",
            swept_rows.clone(),
        );
        let clock_offset = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "clock_offset_seconds",
            "The database's clock minus this replica's wall clock, as last measured (decisions use the database's)",
            clock_offset.clone(),
        );
        let rules_snapshot_version = Gauge::default();
        registry.register(
            "rules_snapshot_version",
            "The rules' revision this replica's compiled snapshot holds (how many rule changes it has heard of; -1 before the first load)",
            rules_snapshot_version.clone(),
        );
        let rules_snapshot_age = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "rules_snapshot_age_seconds",
            "Seconds since this replica last knew its rules snapshot current (loaded it, or found its revision unchanged)",
            rules_snapshot_age.clone(),
        );
        let domain_tiers_version = Gauge::default();
        registry.register(
            "domain_tiers_version",
            "The Domain tiers' revision this replica's tier directory holds (-1 before the first load)",
            domain_tiers_version.clone(),
        );
        let precheck_buckets = Gauge::default();
        registry.register(
            "rate_budget_precheck_buckets",
            "Buckets this replica's guard remembers for its pre-check and fallback (a rule change that may grow a budget forgets those it governs)",
            precheck_buckets.clone(),
        );
        let usage_flushes = Family::<FlushLabels, Counter>::default();
        registry.register(
            "rule_usage_flushes",
            "Flushes of this replica's per-rule decision counts to the usage rows (error: kept for the next)",
            usage_flushes.clone(),
        );
        let rules_dir_applies = Family::<RulesDirLabels, Counter>::default();
        registry.register(
            "rules_dir_applies",
            "Applies of PLEXSPHERE_RULES_DIR's files by the leader, by outcome (refused: a file envoyproxy/ratelimit would refuse; nothing applied)",
            rules_dir_applies.clone(),
        );
        let leased_grants = Family::<BudgetLabels, Counter>::default();
        registry.register(
            "rate_budget_leased_grants",
            "Takes this replica granted from its lease of a hot bucket, without a statement (docs/adr/0034)",
            leased_grants.clone(),
        );
        let leased_tokens = Family::<BudgetLabels, Counter<f64, AtomicU64>>::default();
        registry.register(
            "rate_budget_leased_tokens",
            "Tokens this replica's leases took from shared buckets",
            leased_tokens.clone(),
        );
        let lease_refunded_tokens = Family::<BudgetLabels, Counter<f64, AtomicU64>>::default();
        registry.register(
            "rate_budget_lease_refunded_tokens",
            "Tokens this replica's leases did not grant and gave back to shared buckets",
            lease_refunded_tokens.clone(),
        );
        let quota = super::quota_metrics::QuotaFamilies::register(&mut registry);
        Metrics(Arc::new(Families {
            quota,
            registry,
            leader,
            revocations_listening,
            secret_changes_listening,
            decisions,
            named_decisions,
            service_decisions,
            decide_duration,
            rule_decisions,
            take_duration,
            fallback_active,
            connections_in_use,
            connections_waiting,
            pools: Arc::default(),
            sweeps,
            swept_rows,
            clock_offset,
            rules_snapshot_version,
            rules_snapshot_age,
            domain_tiers_version,
            precheck_buckets,
            limits_probe: Arc::default(),
            usage_flushes,
            rules_dir_applies,
            rule_labels: Mutex::default(),
            leased_grants,
            leased_tokens,
            lease_refunded_tokens,
        }))
    }

    /// Records whether the secret-change listener is connected (and the secret cache in use).
    pub fn set_secret_changes_listening(&self, listening: bool) {
        self.secret_changes_listening.set(i64::from(listening));
    }

    /// Records whether the revocation listener is connected (and the credential cache in use).
    pub fn set_revocations_listening(&self, listening: bool) {
        self.revocations_listening.set(i64::from(listening));
    }

    /// Records whether this replica leads.
    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    /// Counts one decision on one scope.
    pub fn decision(&self, scope: ratebudget::Scope, outcome: Outcome) {
        self.decisions.get_or_create(&DecisionLabels { scope: ScopeLabel(scope), outcome }).inc();
    }

    /// Every decision counted since this process started, by scope and outcome, leaving out
    /// the pairs never counted: the counter `/metrics` exposes, read for the operator page and
    /// the OpenTelemetry export.
    pub fn decision_counts(&self) -> Vec<(ratebudget::Scope, Outcome, u64)> {
        let mut counts = Vec::new();
        for scope in ratebudget::Scope::ALL {
            for outcome in Outcome::ALL {
                let labels = DecisionLabels { scope: ScopeLabel(scope), outcome };
                if let Some(counter) = self.decisions.get(&labels) {
                    counts.push((scope, outcome, counter.get()));
                }
            }
        }
        counts
    }

    /// Whether this replica leads, as last recorded.
    pub fn leading(&self) -> bool {
        self.leader.get() == 1
    }

    /// Counts one decision of a named limiter.
    pub fn named_decision(&self, limiter: &'static str, outcome: Outcome) {
        self.named_decisions.get_or_create(&NamedLabels { limiter, outcome }).inc();
    }

    /// Counts one take of `budget` granted from this replica's lease.
    pub fn leased_grant(&self, budget: &'static str) {
        self.leased_grants.get_or_create(&BudgetLabels { budget }).inc();
    }

    /// Counts what a lease of a bucket of `budget` took and gave back.
    pub fn lease(&self, budget: &'static str, leased: f64, refunded: f64) {
        self.leased_tokens.get_or_create(&BudgetLabels { budget }).inc_by(leased);
        self.lease_refunded_tokens.get_or_create(&BudgetLabels { budget }).inc_by(refunded);
    }

    /// Counts one request decided for another service.
    pub fn service_decision(&self, service: &str, outcome: service::decide::Outcome) {
        let outcome = outcome.as_str();
        self.service_decisions.get_or_create(&ServiceLabels { service: service.to_owned(), outcome }).inc();
    }

    /// Records how long a take on `scope` took.
    pub fn take_duration(&self, scope: ratebudget::Scope, took: Duration) {
        self.take_duration
            .get_or_create(&ScopeLabels { scope: ScopeLabel(scope) })
            .observe(took.as_secs_f64());
    }

    /// Records whether `scope` decides from its fallback.
    pub fn set_fallback_active(&self, scope: ratebudget::Scope, active: bool) {
        self.fallback_active.get_or_create(&ScopeLabels { scope: ScopeLabel(scope) }).set(i64::from(active));
    }

    /// Reports `pool`'s usage on every scrape from `probe`.
    pub fn watch_pool(
        &self,
        pool: &'static str,
        probe: impl Fn() -> (usize, Option<usize>) + Send + Sync + 'static,
    ) {
        lock(&self.pools).push((pool, Box::new(probe)));
    }

    /// Reports the rules snapshot, tier directory and guard on every scrape from `probe`.
    pub fn watch_limits(&self, probe: impl Fn() -> service::budgets::Reading + Send + Sync + 'static) {
        *lock(&self.limits_probe) = Some(Box::new(probe));
    }

    /// Counts one flush of rule usage counts.
    pub fn usage_flush(&self, ok: bool) {
        let outcome = if ok { SweepOutcomeLabel::ok } else { SweepOutcomeLabel::error };
        self.usage_flushes.get_or_create(&FlushLabels { outcome }).inc();
    }

    /// Counts one apply of `PLEXSPHERE_RULES_DIR`.
    pub fn rules_dir_apply(&self, outcome: RulesDirOutcome) {
        self.rules_dir_applies.get_or_create(&RulesDirLabels { outcome }).inc();
    }

    /// Counts one sweep and the rows it deleted (`None` when it failed).
    pub fn sweep(&self, deleted: Option<u64>) {
        let outcome = if deleted.is_some() { SweepOutcomeLabel::ok } else { SweepOutcomeLabel::error };
        self.sweeps.get_or_create(&SweepLabels { outcome }).inc();
        self.swept_rows.inc_by(deleted.unwrap_or(0));
    }

    /// Records the last measured offset of the database's clock from this replica's.
    pub fn set_clock_offset(&self, seconds: f64) {
        self.clock_offset.set(seconds);
    }

    /// The registry in the OpenMetrics text format.
    pub fn render(&self) -> String {
        for (pool, probe) in lock(&self.pools).iter() {
            let (in_use, waiting) = probe();
            self.connections_in_use.get_or_create(&PoolLabels { pool }).set(in_use as i64);
            if let Some(waiting) = waiting {
                self.connections_waiting.get_or_create(&PoolLabels { pool }).set(waiting as i64);
            }
        }
        if let Some(probe) = lock(&self.limits_probe).as_ref() {
            let reading = probe();
            self.rules_snapshot_version.set(reading.snapshot_version);
            self.rules_snapshot_age.set(reading.snapshot_age_seconds);
            self.domain_tiers_version.set(reading.tiers_version);
            self.precheck_buckets.set(i64::try_from(reading.precheck_buckets).unwrap_or(i64::MAX));
        }
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The probes are only ever set whole; a panic cannot leave one half-written.
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl service::DecideObserver for Metrics {
    fn decided(&self, service: &str, outcome: service::decide::Outcome, took: Duration) {
        self.service_decision(service, outcome);
        self.0.decide_duration.observe(took.as_secs_f64());
    }

    fn ruled(&self, service: &str, rule: &str, verdict: service::decide::Verdict) {
        let rule = {
            let mut known = lock(&self.0.rule_labels);
            let pair = (service.to_owned(), rule.to_owned());
            if known.contains(&pair) || known.len() < MAX_RULE_LABELS {
                known.insert(pair);
                rule
            } else {
                "other"
            }
        };
        let labels =
            RuleLabels { service: service.to_owned(), rule: rule.to_owned(), verdict: verdict.as_str() };
        self.0.rule_decisions.get_or_create(&labels).inc();
    }
}
