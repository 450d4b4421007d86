//! What the composition root puts around every rate-budget decision, without the contexts
//! knowing: a gate that does not decide at all while this replica's clock cannot be trusted
//! (`crate::clock`; such a take is an error, HTTP 500, never a refusal), and the guard's
//! observer, which counts decisions by scope and outcome and records the `RateLimit` fields
//! of the response.
//!
//! The limiters decide through a [`ratebudget::Guard`], which tells its [`Observer`] about
//! each decision on the deciding request's own task.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use ratebudget::{Decider, Decision, FailMode, Observer, Scope, Source, Take, Undecided};

use crate::clock::ClockStatus;
use crate::http::rate_limit_headers;
use crate::metrics::{Metrics, Outcome};

/// Decides through `inner` only while the clock decisions are made on can be trusted.
///
/// It sits in front of the guard, so that an untrusted clock neither reaches the store nor
/// lets a `local` scope decide from its fallback: no decision at all is the only safe one.
#[derive(Debug)]
pub struct ClockGate {
    inner: Arc<dyn Decider>,
    clock: ClockStatus,
    metrics: Metrics,
}

impl ClockGate {
    /// A gate in front of `inner`, asking `clock` before every take and counting what it
    /// stops as `outcome="error"`.
    pub fn new(inner: Arc<dyn Decider>, clock: ClockStatus, metrics: Metrics) -> ClockGate {
        ClockGate { inner, clock, metrics }
    }
}

#[async_trait::async_trait]
impl Decider for ClockGate {
    async fn decide(&self, take: Take, now: DateTime<Utc>) -> Result<Decision, Undecided> {
        if let Err(untrusted) = self.clock.check() {
            count_undecided(&self.metrics, &take);
            return Err(Undecided::Declined(Box::new(untrusted)));
        }
        self.inner.decide(take, now).await
    }
}

/// Counts a take that was not decided as `error` on every budget it spends.
fn count_undecided(metrics: &Metrics, take: &Take) {
    if let Take::Named(spend) = take {
        metrics.named_decision(spend.limiter.as_str(), Outcome::error);
    }
    for (_, spend) in take.spends() {
        metrics.decision(spend.scope, Outcome::error);
    }
}

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
            Err(_) => return count_undecided(&self.metrics, take),
        };
        if let Take::Named(spend) = take {
            let outcome = match (decision, source) {
                (Decision::Granted(_), Source::Fallback) => Outcome::fallback_granted,
                (Decision::Granted(_), _) => Outcome::granted,
                (_, Source::Precheck) => Outcome::precheck_refused,
                (_, Source::Fallback) => Outcome::fallback_refused,
                (_, Source::Store) => Outcome::refused,
            };
            return self.metrics.named_decision(spend.limiter.as_str(), outcome);
        }
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
        }
        count_undecided(&self.metrics, take);
    }

    fn store_failing(&self, failing: bool) {
        for (scope, mode) in &self.fail_modes {
            if *mode == FailMode::Local {
                self.metrics.set_fallback_active(*scope, failing);
            }
        }
    }
}
