//! Following the database's announcements on a channel, to keep a per-replica cache in step.
//!
//! A change that must reach every replica at once (a revoked Node, a changed secret) is
//! announced by a trigger when its transaction commits; each replica LISTENs on a connection
//! of its own and tells its cache. An announcement sent while the listener is not connected is
//! lost, so a cache is used only while its listener is: a lost connection suspends it (every
//! request asks the store) until the listener is back, and then it resumes empty
//! (docs/adr/0011).

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use sqlx::ConnectOptions;
use tokio_util::sync::CancellationToken;

/// How long a listener waits before connecting again after a failure.
const RETRY: Duration = Duration::from_millis(500);

/// What a listener keeps in step, and how.
pub trait Follower: Send + Sync {
    /// The channel it listens on.
    fn channel(&self) -> &'static str;

    /// The listener is connected: use the cache again, empty.
    fn resume(&self);

    /// The listener is not connected: stop using the cache, since changes may go unheard.
    fn suspend(&self);

    /// One announcement's payload.
    fn apply(&self, payload: &str);
}

/// Listens for `follower` until `shutdown` is cancelled, on a connection of its own named
/// `application_name`.
pub async fn run(
    database: PgConnectOptions,
    application_name: &'static str,
    follower: impl Follower,
    shutdown: CancellationToken,
) {
    // One connection, for this listener only.
    let pool =
        PgPoolOptions::new().max_connections(1).acquire_timeout(Duration::from_secs(10)).connect_lazy_with(
            database.application_name(application_name).log_statements(tracing::log::LevelFilter::Trace),
        );
    let channel = follower.channel();
    let mut connected_before = false;
    loop {
        let listener = tokio::select! {
            () = shutdown.cancelled() => break,
            listener = listen(&pool, channel) => listener,
        };
        match listener {
            Ok(listener) => {
                follower.resume();
                if connected_before {
                    tracing::info!(channel, "listener reconnected; its cache is in use again");
                }
                connected_before = true;
                if receive(listener, &follower, &shutdown).await.is_break() {
                    break;
                }
                follower.suspend();
                tracing::warn!(
                    channel,
                    "listener lost its connection; every request asks the store until it is back"
                );
            }
            Err(error) => {
                tracing::warn!(channel, %error, "listener cannot connect; retrying");
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    () = tokio::time::sleep(RETRY) => {}
                }
            }
        }
    }
    follower.suspend();
    pool.close().await;
}

async fn listen(pool: &sqlx::PgPool, channel: &str) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    // On a lost connection, return at once instead of reconnecting inside try_recv: the cache
    // must be suspended before anything else happens.
    listener.eager_reconnect(false);
    listener.listen(channel).await?;
    Ok(listener)
}

/// Applies announcements until the connection is lost (`Continue`) or shutdown (`Break`).
async fn receive(
    mut listener: PgListener,
    follower: &impl Follower,
    shutdown: &CancellationToken,
) -> std::ops::ControlFlow<()> {
    loop {
        let notification = tokio::select! {
            () = shutdown.cancelled() => return std::ops::ControlFlow::Break(()),
            notification = listener.try_recv() => notification,
        };
        match notification {
            Ok(Some(notification)) => follower.apply(notification.payload()),
            Ok(None) => return std::ops::ControlFlow::Continue(()),
            Err(error) => {
                tracing::warn!(channel = follower.channel(), %error, "listener failed");
                return std::ops::ControlFlow::Continue(());
            }
        }
    }
}
