//! What the composition root puts around every rate-budget decision, without the contexts
//! knowing: the guard's observer, which counts decisions by scope and outcome (and by rule,
//! for the usage rows; a take the guard declined because this replica's clock cannot be
//! trusted, `ratebudget::discipline`, counts as an error, HTTP 500, never a refusal),
//! logs what shadow rules would have refused, records the `RateLimit` fields of the
//! response, and keeps each bucket's recent levels for the operator page ([`crate::observation::fill`]).
//!
//! The limiters decide through a [`ratebudget::Guard`], which tells its [`Observer`] about
//! each decision on the deciding request's own task.

use std::cell::RefCell;
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use ratebudget::{Decision, Enforcement, Observer, RuleRef, Scope, Source, Take, Undecided, Which};
use ratebudget_tower::Reading;
use smallvec::SmallVec;

use crate::observation::fill::{Decided, FillHistory};
use crate::observation::metrics::{Metrics, Outcome};
use rules::{Counted, RuleRefs, Usage};
use service::budgets::service_buckets;

/// The budgets a take spends, as the observer counts them: the position, the scope (`None`:
/// another service's bucket, counted by its rule only), and its enforcement. A named take
/// counts under the scope it stands for, when it stands for one.
fn budgets(take: &Take) -> SmallVec<[(Which, Option<Scope>, Enforcement); 2]> {
    match take {
        Take::Named(spend) => spend
            .limiter
            .scope()
            .map(|scope| (Which::First, Some(scope), spend.enforcement))
            .into_iter()
            .collect(),
        // This project's takes are of its scopes' budgets, and other services' of theirs; a
        // budget of any other name is neither, and not counted.
        _ => take
            .spends()
            .filter(|(_, spend)| spend.name.scope().is_some() || spend.name == service_buckets())
            .map(|(which, spend)| (which, spend.name.scope(), spend.enforcement))
            .collect(),
    }
}

/// Counts a take that was not decided as `error` on every budget it spends.
fn count_undecided(metrics: &Metrics, take: &Take) {
    if let Take::Named(spend) = take {
        if spend.limiter.scope().is_none() {
            metrics.named_decision(spend.limiter.as_str(), Outcome::error);
        }
    }
    for (_, scope, _) in budgets(take) {
        if let Some(scope) = scope {
            metrics.decision(scope, Outcome::error);
        }
    }
}

/// The most often one rule's shadow refusals are logged: the first at once, then one line
/// at most this often, saying how many there were since.
const SHADOW_LOG_EVERY: Duration = Duration::from_secs(10);

/// Counts decisions (by scope, and by rule for the usage rows), logs what shadow rules would
/// have refused, and records the binding bucket for the response's fields.
#[derive(Debug)]
pub struct DecisionObserver {
    metrics: Metrics,
    usage: Arc<Usage>,
    refs: RuleRefs,
    fill: FillHistory,
    /// Per rule: when its shadow refusals were last logged, and how many since.
    shadow_logged: Mutex<HashMap<RuleRef, (Instant, u64)>>,
}

impl DecisionObserver {
    /// An observer counting into `metrics` and, per rule, into `usage`, and keeping levels
    /// in `fill`; `refs` names the rules in the log.
    pub fn new(metrics: Metrics, usage: Arc<Usage>, refs: RuleRefs, fill: FillHistory) -> DecisionObserver {
        for scope in Scope::ALL {
            metrics.set_fallback_active(scope, false);
        }
        DecisionObserver { metrics, usage, refs, fill, shadow_logged: Mutex::default() }
    }

    /// Keeps the levels `decision` left in the shared buckets it looked at. A decision of the
    /// fallback (or of none, failing open) says nothing about the shared bucket, so it is not
    /// kept; a refusal whose level is unknown (a concurrent take won the last tokens under
    /// the lock) reads as empty, which is what it may as well be.
    fn record_fill(&self, take: &Take, decision: &Decision, source: Source, now: DateTime<Utc>) {
        if matches!(source, Source::Fallback | Source::Open) {
            return;
        }
        match decision {
            Decision::Granted(grant) => {
                for (which, spend) in take.spends() {
                    if let (Some(fill), Some(scope)) = (grant.remaining(which), spend.name.scope()) {
                        let level = spend.limit.level(fill, now);
                        self.fill.record(scope, spend.key, now, level, spend.limit.burst(), Decided::Granted);
                    }
                }
            }
            Decision::Refused(refusal) => {
                if let Some((spend, scope)) =
                    take.spend(refusal.which).and_then(|spend| Some((spend, spend.name.scope()?)))
                {
                    let level = refusal.judged.map_or(0.0, |fill| spend.limit.level(fill, now).max(0.0));
                    let decided =
                        if spend.enforcement.is_shadow() { Decided::ShadowRefused } else { Decided::Refused };
                    self.fill.record(scope, spend.key, now, level, spend.limit.burst(), decided);
                }
            }
            Decision::InsufficientCapacity(_) => {}
        }
    }

    fn count(&self, scope: Option<Scope>, enforcement: Enforcement, now: DateTime<Utc>, outcome: Outcome) {
        if let Some(scope) = scope {
            self.metrics.decision(scope, outcome);
        }
        let Some(rule) = enforcement.rule else { return };
        let counted = match outcome {
            Outcome::granted | Outcome::fallback_granted | Outcome::open_granted => Counted::Granted,
            Outcome::refused | Outcome::precheck_refused | Outcome::fallback_refused => Counted::Refused,
            Outcome::shadow_refused => Counted::ShadowRefused,
            Outcome::error => return,
        };
        self.usage.count(rule, now, counted);
    }

    /// Logs a shadow refusal: the first of a rule at once, then at most one line every
    /// [`SHADOW_LOG_EVERY`] with the number since, so a flood does not flood the log.
    fn log_shadow_refusal(
        &self,
        scope: Option<Scope>,
        enforcement: Enforcement,
        retry_after: Option<Duration>,
    ) {
        let Some(rule) = enforcement.rule else { return };
        let suppressed = {
            let mut logged = lock(&self.shadow_logged);
            let now = Instant::now();
            match logged.get_mut(&rule) {
                Some((last, since)) if now.duration_since(*last) < SHADOW_LOG_EVERY => {
                    *since += 1;
                    return;
                }
                Some((last, since)) => {
                    let suppressed = *since;
                    (*last, *since) = (now, 0);
                    suppressed
                }
                None => {
                    logged.insert(rule, (now, 0));
                    0
                }
            }
        };
        let rule_id = self.refs.id(rule).map(|id| id.to_string()).unwrap_or_default();
        tracing::info!(
            rule_id,
            scope = scope.map_or("(another service's)", Scope::as_str),
            retry_after_ms = retry_after.map(|wait| wait.as_millis() as u64),
            also_since_last_line = suppressed,
            "a shadow rule would have refused this request; admitted"
        );
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
        let spent = budgets(take);
        for (_, scope, _) in &spent {
            if let Some(scope) = scope {
                self.metrics.take_duration(*scope, elapsed);
            }
        }
        let (decision, source) = match outcome {
            Ok(decided) => decided,
            Err(_) => return count_undecided(&self.metrics, take),
        };
        if let Take::Named(spend) = take {
            if spend.limiter.scope().is_none() {
                let outcome = match (decision, source) {
                    (Decision::Granted(_), Source::Fallback) => Outcome::fallback_granted,
                    (Decision::Granted(_), Source::Open) => Outcome::open_granted,
                    (Decision::Granted(_), _) => Outcome::granted,
                    (_, Source::Precheck) => Outcome::precheck_refused,
                    (_, Source::Fallback) => Outcome::fallback_refused,
                    (_, _) => Outcome::refused,
                };
                return self.metrics.named_decision(spend.limiter.as_str(), outcome);
            }
        }
        if source == Source::Lease {
            for (_, spend) in take.spends() {
                self.metrics.leased_grant(spend.name.as_str());
            }
        }
        self.record_fill(take, decision, source, now);
        if matches!(source, Source::Fallback | Source::Open) {
            for (_, scope, _) in &spent {
                if let Some(scope) = scope {
                    self.metrics.set_fallback_active(*scope, true);
                }
            }
        }
        let refused = match decision {
            // A pair is all-or-nothing: a grant is a grant on both budgets.
            Decision::Granted(_) => {
                let outcome = match source {
                    Source::Fallback => Outcome::fallback_granted,
                    Source::Open => Outcome::open_granted,
                    Source::Store | Source::Precheck | Source::Lease => Outcome::granted,
                };
                for (_, scope, enforcement) in &spent {
                    self.count(*scope, *enforcement, now, outcome);
                }
                None
            }
            // Only the bucket that refused was decided on.
            Decision::Refused(refusal) => Some((refusal.which, Some(refusal.retry_after), source)),
            Decision::InsufficientCapacity(never) => Some((never.which, None, Source::Store)),
        };
        if let Some((which, retry_after, source)) = refused {
            if let Some((_, scope, enforcement)) = spent.iter().find(|(position, _, _)| *position == which) {
                let outcome = match source {
                    _ if enforcement.is_shadow() => Outcome::shadow_refused,
                    Source::Precheck => Outcome::precheck_refused,
                    Source::Fallback => Outcome::fallback_refused,
                    Source::Store | Source::Open | Source::Lease => Outcome::refused,
                };
                self.count(*scope, *enforcement, now, outcome);
                if enforcement.is_shadow() {
                    self.log_shadow_refusal(*scope, *enforcement, retry_after);
                }
            }
        }
        // Another service's decision is that service's to report (`service::decide`), never
        // the fields of the request that asked for it.
        let ours = spent.iter().all(|(_, scope, _)| scope.is_some());
        if let Some(reading) = Reading::binding(take, decision, now).filter(|_| ours) {
            record_reading(reading);
        }
    }

    fn abandoned(&self, take: &Take, elapsed: Duration) {
        for (_, scope, _) in budgets(take) {
            if let Some(scope) = scope {
                self.metrics.take_duration(scope, elapsed);
            }
        }
        count_undecided(&self.metrics, take);
    }

    fn leased(&self, name: ratebudget::Name, leased: &ratebudget::Leased) {
        self.metrics.lease(name.as_str(), leased.leased, leased.refunded);
    }

    fn store_failing(&self, failing: bool) {
        // Scopes say they decide without the store when one of their takes does (their rules
        // decide which); all of them stop when the store answers again.
        if !failing {
            for scope in Scope::ALL {
                self.metrics.set_fallback_active(scope, false);
            }
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The log's bookkeeping is replaced whole; a panic cannot tear it.
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

tokio::task_local! {
    /// The readings of the decisions made on a task inside [`collect_readings`].
    static READINGS: RefCell<Vec<Reading>>;
}

/// Runs `work`, collecting what each decision it makes says about its binding bucket (the
/// `RateLimit` fields of a response, `crate::http::rate_limit_headers`).
pub async fn collect_readings<T>(work: impl Future<Output = T>) -> (T, Vec<Reading>) {
    READINGS
        .scope(RefCell::new(Vec::new()), async {
            let output = work.await;
            (output, READINGS.with(RefCell::take))
        })
        .await
}

/// Notes a reading for the work [`collect_readings`] runs; outside it, it is dropped.
fn record_reading(reading: Reading) {
    let _ = READINGS.try_with(|readings| readings.borrow_mut().push(reading));
}
