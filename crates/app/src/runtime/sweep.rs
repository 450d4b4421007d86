//! The `rate-budget-sweep` loop: the leader deletes buckets idle for over an hour (another
//! service's for as long as its slowest rule takes to refill, `service::RuleBudgets::retained`),
//! and the rules' usage older than [`USAGE_RETENTION`].
//!
//! The retention is not a tuning choice. Every budget of our own refills to full within seconds
//! of being left alone, so a bucket idle for an hour is a full bucket, and deleting it is
//! exactly what the next take would mint; another service's day- or year-long quota is full
//! only once its refill has run, so its buckets are kept that long. What the sweep reclaims is
//! the rows of Nodes, Domains and callers that are gone.
//!
//! The loop carries no readiness probe: a sweep that never ran costs rows, not correctness,
//! because a take refills from the stored instant whatever the row's age.
//!
//! Clocks: `refilled_at` was written by whichever replica took last, on its clock, and the next
//! take will be judged on another replica's. Every replica's clock is within
//! `PLEXSPHERE_MAX_CLOCK_SKEW_MS` of the database's (it does not decide otherwise,
//! `ratebudget::discipline`), so two of them are within twice that of each other: the sweep deletes only
//! buckets idle for the retention plus twice the bound on its own clock, and does not sweep at
//! all while its clock is untrusted. A deleted bucket is therefore full on every replica's
//! clock, whatever the skew within the bound.

use std::sync::Arc;
use std::time::Duration;

use ratebudget::{Clock, Store};
use service::RuleBudgets;
use tokio_util::sync::CancellationToken;

use crate::observation::metrics::Metrics;
use crate::runtime::leader::Leadership;
use ratebudget::{ClockStatus, UntrustedClock};

/// The loop's name, as it appears in logs.
pub const LOOP_NAME: &str = "rate-budget-sweep";

/// The longest one batch statement may take before the sweep gives up until the next tick.
/// A batch takes tens of milliseconds (BENCHMARKS.md); this only bounds a hang, such as a
/// silent network, that would otherwise hold up shutdown and leadership hand-over.
const BATCH_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a bucket must be idle before the sweep deletes it: the rate-budget store's
/// retention, which every budget is required to refill within.
pub const RETENTION: Duration = ratebudget::IDLE_RETENTION;

/// How long the rules' usage rows are kept: a week of minutes, enough to compare a shadow
/// rule's would-be refusals with last week's traffic.
pub const USAGE_RETENTION: chrono::TimeDelta = chrono::TimeDelta::days(7);

/// What one tick of the loop did.
#[derive(Debug)]
pub enum SweepOutcome {
    /// This replica does not lead, so it left the table alone.
    NotLeader,
    /// The sweep ran and deleted this many idle buckets.
    Swept {
        /// Rows deleted.
        deleted: u64,
    },
    /// The sweep failed; the next tick tries again.
    Failed(SweepError),
}

/// Why a sweep stopped before it was done; the batches before stay deleted.
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    /// The store could not delete a batch.
    #[error("a sweep batch failed")]
    Store(#[from] ratebudget::Error),
    /// A batch did not finish within `BATCH_TIMEOUT`.
    #[error("a sweep batch did not finish within {0:?}")]
    TimedOut(Duration),
    /// The replica's clock is not within its bound of the database's, so idleness cannot be
    /// judged; nothing was deleted.
    #[error("the clock cannot be trusted")]
    UntrustedClock(#[from] UntrustedClock),
}

/// Deletes every bucket idle since before `now - RETENTION - skew_margin` (of each name in
/// `retained`, since before `now - its retention - skew_margin`), then every named limiter's
/// key whose budget was back to full at `now - skew_margin`, one batch statement at a time, for
/// as long as `keep_going` allows between batches; returns how many it deleted.
///
/// # Errors
/// [`SweepError`] when a batch failed or hung; the batches before it stay deleted.
pub async fn sweep_once(
    store: &Store,
    clock: &dyn Clock,
    skew_margin: Duration,
    retained: &[(ratebudget::Name, Duration)],
    mut keep_going: impl FnMut() -> bool,
) -> Result<u64, SweepError> {
    let idle_for = |retention: Duration| {
        chrono::TimeDelta::from_std(retention + skew_margin)
            .expect("a year and a minute at most is a valid time delta")
    };
    let margin = chrono::TimeDelta::from_std(skew_margin).expect("a minute at most is a valid time delta");
    let now = clock.now();
    let mut sweep = store.sweep_idle(now - idle_for(RETENTION)).and_expired(now - margin);
    for (name, retention) in retained {
        sweep = sweep.retaining(*name, now - idle_for(*retention));
    }
    while keep_going() {
        match tokio::time::timeout(BATCH_TIMEOUT, sweep.next_batch()).await {
            Err(_) => return Err(SweepError::TimedOut(BATCH_TIMEOUT)),
            Ok(None) => break,
            Ok(Some(batch)) => batch?,
        };
    }
    Ok(sweep.deleted())
}

/// One tick: sweeps while this replica leads and is not shutting down (checked before every
/// batch, so a replica that loses leadership mid-sweep stops within one batch), then deletes
/// usage past its retention, and logs and counts what happened.
pub async fn tick(
    (store, rules, budgets, rules_fresh_within): (&Store, &rules::RulesService, &RuleBudgets, Duration),
    (clock, status): (&dyn Clock, &ClockStatus),
    leadership: &Leadership,
    metrics: &Metrics,
    shutdown: &CancellationToken,
) -> SweepOutcome {
    if !leadership.is_leader() {
        return SweepOutcome::NotLeader;
    }
    // Twice the bound: the replica that wrote refilled_at and the one that will take next may
    // each be off by the bound, in opposite directions.
    let margin = 2 * status.max_skew();
    let swept = match status.check() {
        Ok(()) => {
            let retained = budgets.retained(rules_fresh_within);
            sweep_once(store, clock, margin, &retained, || leadership.is_leader() && !shutdown.is_cancelled())
                .await
        }
        Err(untrusted) => Err(untrusted.into()),
    };
    if swept.is_ok() && leadership.is_leader() {
        // Usage is bookkeeping, not budgets: its failure is logged and retried next tick,
        // and does not count as a failed sweep.
        let before = clock.now() - USAGE_RETENTION;
        match tokio::time::timeout(BATCH_TIMEOUT, rules.prune_usage(before)).await {
            Ok(Ok(pruned)) => {
                tracing::info!(loop_name = LOOP_NAME, pruned, "deleted rule usage past its retention")
            }
            Ok(Err(error)) => {
                tracing::warn!(loop_name = LOOP_NAME, error = %ratebudget::cause_chain(&error), "cannot delete old rule usage; the next tick retries")
            }
            Err(_) => tracing::warn!(loop_name = LOOP_NAME, "deleting old rule usage did not finish in time"),
        }
    }
    match swept {
        Ok(deleted) => {
            tracing::info!(loop_name = LOOP_NAME, deleted, "swept idle rate budgets");
            metrics.sweep(Some(deleted));
            SweepOutcome::Swept { deleted }
        }
        Err(error) => {
            tracing::warn!(loop_name = LOOP_NAME, error = %ratebudget::cause_chain(&error), "sweep failed; the next tick retries");
            metrics.sweep(None);
            SweepOutcome::Failed(error)
        }
    }
}

/// Sweeps when this replica becomes leader and every `interval` while it leads, until
/// `shutdown`. A follower waits for leadership and never touches the table.
pub async fn run(
    (store, rules, budgets, rules_fresh_within): (Store, rules::RulesService, Arc<RuleBudgets>, Duration),
    (clock, status): (Arc<dyn Clock>, ClockStatus),
    mut leadership: Leadership,
    metrics: Metrics,
    interval: Duration,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = leadership.wait_until(true) => {}
        }
        // A new leader sweeps at once (whoever led before may have died just before its tick),
        // as soon as its clock is measured: idleness cannot be judged before.
        while status.check().is_err() {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(ratebudget::discipline::RETRY_INTERVAL) => {}
            }
        }
        tick(
            (&store, &rules, &budgets, rules_fresh_within),
            (clock.as_ref(), &status),
            &leadership,
            &metrics,
            &shutdown,
        )
        .await;
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
    }
}
