//! What `/metrics` exposes, in the OpenMetrics text format Prometheus scrapes.
//!
//! Each process (and each instance a test starts) has a registry of its own rather than a
//! global recorder, so two replicas in one test process report their own leadership.

use std::sync::Arc;

use std::fmt::Write as _;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
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

/// How a decision came out: `error` is a budget that could not be evaluated (HTTP 500),
/// never counted as a refusal.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types, missing_docs)]
pub enum Outcome {
    granted,
    refused,
    error,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DecisionLabels {
    scope: ScopeLabel,
    outcome: Outcome,
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

/// The process's metrics; cheap to clone, clones share the registry.
#[derive(Clone, Debug)]
pub struct Metrics {
    registry: Arc<Registry>,
    leader: Gauge,
    revocations_listening: Gauge,
    decisions: Family<DecisionLabels, Counter>,
    sweeps: Family<SweepLabels, Counter>,
    swept_rows: Counter,
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
        Metrics { registry: Arc::new(registry), leader, revocations_listening, decisions, sweeps, swept_rows }
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
    pub fn decision(&self, scope: ScopeLabel, outcome: Outcome) {
        self.decisions.get_or_create(&DecisionLabels { scope, outcome }).inc();
    }

    /// Counts one outcome for both buckets of a two-budget take.
    pub fn pair_decision(&self, first: ScopeLabel, second: ScopeLabel, outcome: Outcome) {
        self.decision(first, outcome);
        self.decision(second, outcome);
    }

    /// Counts one sweep and the rows it deleted (`None` when it failed).
    pub fn sweep(&self, deleted: Option<u64>) {
        let outcome = if deleted.is_some() { SweepOutcomeLabel::ok } else { SweepOutcomeLabel::error };
        self.sweeps.get_or_create(&SweepLabels { outcome }).inc();
        self.swept_rows.inc_by(deleted.unwrap_or(0));
    }

    /// The registry in the OpenMetrics text format.
    pub fn render(&self) -> String {
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
