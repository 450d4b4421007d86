//! The `rate-budget-sweep` loop: the leader deletes buckets idle for over an hour.
//!
//! The retention is not a tuning choice. Every shipped budget refills to full within seconds
//! of being left alone, so a bucket idle for an hour is a full bucket, and deleting it is
//! exactly what the next take would mint. What the sweep reclaims is the rows of Nodes and
//! Domains that are gone.
//!
//! The loop carries no readiness probe: a sweep that never ran costs rows, not correctness,
//! because a take refills from the stored instant whatever the row's age.

use std::sync::Arc;
use std::time::Duration;

use ratebudget::{Clock, Store};
use tokio_util::sync::CancellationToken;

use crate::leader::Leadership;
use crate::metrics::Metrics;

/// The loop's name, as it appears in logs.
pub const LOOP_NAME: &str = "rate-budget-sweep";

/// The longest one batch statement may take before the sweep gives up until the next tick.
/// A batch takes tens of milliseconds (BENCHMARKS.md); this only bounds a hang, such as a
/// silent network, that would otherwise hold up shutdown and leadership hand-over.
const BATCH_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a bucket must be idle before the sweep deletes it: the rate-budget store's
/// retention, which every budget is required to refill within.
pub const RETENTION: Duration = ratebudget::IDLE_RETENTION;

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
    /// A batch did not finish within [`BATCH_TIMEOUT`].
    #[error("a sweep batch did not finish within {0:?}")]
    TimedOut(Duration),
}

/// Deletes every bucket idle since before `now - RETENTION`, then every named limiter's key
/// whose budget is back to full, one batch statement at a time,
/// for as long as `keep_going` allows between batches; returns how many it deleted.
///
/// # Errors
/// [`SweepError`] when a batch failed or hung; the batches before it stay deleted.
pub async fn sweep_once(
    store: &Store,
    clock: &dyn Clock,
    mut keep_going: impl FnMut() -> bool,
) -> Result<u64, SweepError> {
    let retention = chrono::TimeDelta::from_std(RETENTION).expect("an hour is a valid time delta");
    let now = clock.now();
    let mut sweep = store.sweep_idle(now - retention).and_expired(now);
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
/// batch, so a replica that loses leadership mid-sweep stops within one batch), and logs and
/// counts what happened.
pub async fn tick(
    store: &Store,
    clock: &dyn Clock,
    leadership: &Leadership,
    metrics: &Metrics,
    shutdown: &CancellationToken,
) -> SweepOutcome {
    if !leadership.is_leader() {
        return SweepOutcome::NotLeader;
    }
    match sweep_once(store, clock, || leadership.is_leader() && !shutdown.is_cancelled()).await {
        Ok(deleted) => {
            tracing::info!(loop_name = LOOP_NAME, deleted, "swept idle rate budgets");
            metrics.sweep(Some(deleted));
            SweepOutcome::Swept { deleted }
        }
        Err(error) => {
            tracing::warn!(loop_name = LOOP_NAME, error = %crate::http::cause_chain(&error), "sweep failed; the next tick retries");
            metrics.sweep(None);
            SweepOutcome::Failed(error)
        }
    }
}

/// Sweeps when this replica becomes leader and every `interval` while it leads, until
/// `shutdown`. A follower waits for leadership and never touches the table.
pub async fn run(
    store: Store,
    clock: Arc<dyn Clock>,
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
        // A new leader sweeps at once: whoever led before may have died just before its tick.
        tick(&store, clock.as_ref(), &leadership, &metrics, &shutdown).await;
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
    }
}
