//! The revocation listener: how a revoked Node's token stops working on every replica.
//!
//! Deleting a Node announces it on [`access::NODE_REVOKED_CHANNEL`] when the deletion commits
//! (migration 0031's trigger). Each replica LISTENs on a connection of its own and drops the
//! Node from its [`CredentialCache`], so a revocation reaches every replica about a round trip
//! after it commits, not when cache entries expire (docs/adr/0011).
//!
//! An announcement sent while the listener is not connected is lost, so the cache is used only
//! while it is: a lost connection suspends the cache (every request asks the store) until the
//! listener is back, and then the cache starts empty.

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use sqlx::ConnectOptions;
use tokio_util::sync::CancellationToken;

use crate::http::CredentialCache;
use crate::metrics::Metrics;

/// How long the listener waits before connecting again after a failure.
const RETRY: Duration = Duration::from_millis(500);

/// Listens until `shutdown` is cancelled, keeping `cache` in step with revocations.
pub async fn run(
    database: PgConnectOptions,
    cache: CredentialCache,
    metrics: Metrics,
    shutdown: CancellationToken,
) {
    // One connection, for this listener only.
    let pool =
        PgPoolOptions::new().max_connections(1).acquire_timeout(Duration::from_secs(10)).connect_lazy_with(
            database
                .application_name("plexsphere-revocations")
                .log_statements(tracing::log::LevelFilter::Trace),
        );
    let mut connected_before = false;
    loop {
        let listener = tokio::select! {
            () = shutdown.cancelled() => break,
            listener = listen(&pool) => listener,
        };
        match listener {
            Ok(listener) => {
                cache.resume();
                metrics.set_revocations_listening(true);
                if connected_before {
                    tracing::info!("revocation listener reconnected; credential cache in use again");
                }
                connected_before = true;
                if receive(listener, &cache, &shutdown).await.is_break() {
                    break;
                }
                cache.suspend();
                tracing::warn!(
                    "revocation listener lost its connection; every request asks the store until it is back"
                );
            }
            Err(error) => {
                tracing::warn!(%error, "revocation listener cannot connect; retrying");
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    () = tokio::time::sleep(RETRY) => {}
                }
            }
        }
    }
    cache.suspend();
    metrics.set_revocations_listening(false);
    pool.close().await;
}

async fn listen(pool: &sqlx::PgPool) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    // On a lost connection, return at once instead of reconnecting inside try_recv: the cache
    // must be suspended before anything else happens.
    listener.eager_reconnect(false);
    listener.listen(access::NODE_REVOKED_CHANNEL).await?;
    Ok(listener)
}

/// Applies announcements until the connection is lost (`Continue`) or shutdown (`Break`).
async fn receive(
    mut listener: PgListener,
    cache: &CredentialCache,
    shutdown: &CancellationToken,
) -> std::ops::ControlFlow<()> {
    loop {
        let notification = tokio::select! {
            () = shutdown.cancelled() => return std::ops::ControlFlow::Break(()),
            notification = listener.try_recv() => notification,
        };
        match notification {
            Ok(Some(notification)) => apply(notification.payload(), cache),
            Ok(None) => return std::ops::ControlFlow::Continue(()),
            Err(error) => {
                tracing::warn!(%error, "revocation listener failed");
                return std::ops::ControlFlow::Continue(());
            }
        }
    }
}

/// One announcement: a Node's id, or `*` for all of them.
fn apply(payload: &str, cache: &CredentialCache) {
    if payload == "*" {
        tracing::info!("every node credential was revoked");
        cache.revoke_all();
        return;
    }
    match uuid::Uuid::parse_str(payload) {
        Ok(node) => {
            tracing::debug!(%node, "node credential revoked");
            cache.revoke(node.into());
        }
        Err(_) => {
            // Not from the trigger: forget everything rather than keep what may be revoked.
            tracing::warn!(payload, "unreadable revocation announcement; forgetting every credential");
            cache.revoke_all();
        }
    }
}
