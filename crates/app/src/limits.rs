//! What the composition root learns from every rate-budget decision, without the contexts
//! knowing: metrics by scope and outcome, and the `RateLimit` fields of the response.
//!
//! The limiters decide through a [`ratebudget::Guard`], which tells its [`Observer`] about
//! each decision on the deciding request's own task; this is that observer.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use ratebudget::{Decision, FailMode, Observer, Scope, Source, Take, Undecided};

use crate::http::rate_limit_headers;
use crate::metrics::{Metrics, Outcome};

/// Counts decisions and records the binding bucket for the response's fields.
#[derive(Debug)]
pub struct DecisionObserver {
    metrics: Metrics,
    fail_modes: HashMap<Scope, FailMode>,
}

impl DecisionObserver {
    /// An observer counting into `metrics`; `fail_modes` says which scopes fall back to
    /// local decisions when the store fails (for the fallback gauge).
    pub fn new(metrics: Metrics, fail_modes: HashMap<Scope, FailMode>) -> DecisionObserver {
        for scope in Scope::ALL {
            metrics.set_fallback_active(scope, false);
        }
        DecisionObserver { metrics, fail_modes }
    }
}

impl Observer for DecisionObserver {
    fn decided(
        &self,
        take: &Take,
        now: DateTime<Utc>,
        outcome: Result<(&Decision, Source), &Undecided>,
        elapsed: Duration,
    ) {
        for (_, spend) in take.spends() {
            self.metrics.take_duration(spend.scope, elapsed);
        }
        let (decision, source) = match outcome {
            Ok(decided) => decided,
            Err(_) => {
                for (_, spend) in take.spends() {
                    self.metrics.decision(spend.scope, Outcome::error);
                }
                return;
            }
        };
        match decision {
            // A pair is all-or-nothing: a grant is a grant on both budgets.
            Decision::Granted(_) => {
                let outcome =
                    if source == Source::Fallback { Outcome::fallback_granted } else { Outcome::granted };
                for (_, spend) in take.spends() {
                    self.metrics.decision(spend.scope, outcome);
                }
            }
            // Only the bucket that refused was decided on.
            Decision::Refused(refusal) => {
                let outcome = match source {
                    Source::Store => Outcome::refused,
                    Source::Precheck => Outcome::precheck_refused,
                    Source::Fallback => Outcome::fallback_refused,
                };
                if let Some(spend) = take.spend(refusal.which) {
                    self.metrics.decision(spend.scope, outcome);
                }
            }
            Decision::InsufficientCapacity(never) => {
                if let Some(spend) = take.spend(never.which) {
                    self.metrics.decision(spend.scope, Outcome::refused);
                }
            }
        }
        if let Some(reading) = rate_limit_headers::binding(take, decision, now) {
            rate_limit_headers::record(reading);
        }
    }

    fn abandoned(&self, take: &Take, elapsed: Duration) {
        for (_, spend) in take.spends() {
            self.metrics.take_duration(spend.scope, elapsed);
            self.metrics.decision(spend.scope, Outcome::error);
        }
    }

    fn store_failing(&self, failing: bool) {
        for (scope, mode) in &self.fail_modes {
            if *mode == FailMode::Local {
                self.metrics.set_fallback_active(*scope, failing);
            }
        }
    }
}
