//! The leader's sweep of the RLQS allocator's rows that no longer count
//! (`plexsphere.quota_sweep`): shares whose assignments expired long ago, buckets with no share
//! whose pool would be full anyway. Beside the rate-budget sweep, at its interval; only the
//! leader sweeps.

use std::time::Duration;

use service::quota::QuotaService;
use tokio_util::sync::CancellationToken;

use crate::runtime::leader::Leadership;

/// The loop's name, as logs and the tasks' list say it.
pub const LOOP_NAME: &str = "the RLQS sweep";

/// Sweeps when this replica becomes leader and every `interval` while it leads, until
/// `shutdown`.
pub async fn run(
    quota: QuotaService,
    mut leadership: Leadership,
    interval: Duration,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = leadership.wait_until(true) => {}
        }
        match quota.sweep().await {
            Ok(deleted) => {
                tracing::debug!(loop_name = LOOP_NAME, deleted, "swept RLQS rows that no longer count")
            }
            Err(error) => {
                tracing::warn!(loop_name = LOOP_NAME, error = %ratebudget::cause_chain(&error), "the RLQS sweep failed; the next tick retries");
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
    }
}
