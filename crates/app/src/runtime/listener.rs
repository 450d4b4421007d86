//! Following the database's announcements, to keep what a replica holds in step with every
//! other replica's changes: one connection, LISTENing on every channel, telling each follower
//! what arrives on its own.
//!
//! A change that must reach every replica at once (a reset bucket, a changed rule or tier, a
//! revoked Node, a changed secret) is announced when its transaction commits. An announcement
//! sent while the listener is not connected is lost, so what a follower keeps is used only
//! while the listener is connected: a lost connection suspends every follower (a cache is then
//! not used; every request asks the store) until the listener is back, and then each resumes
//! as if it had missed everything (a cache empty, the guard's pre-check forgetting, the rules
//! read again) (docs/adr/0011).

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use sqlx::ConnectOptions;
use tokio_util::sync::CancellationToken;

/// How long the listener waits before connecting again after a failure.
const RETRY: Duration = Duration::from_millis(500);

/// What the listener keeps in step, and how.
pub trait Follower: Send + Sync {
    /// The channel it follows.
    fn channel(&self) -> &'static str;

    /// The listener is connected (again): whatever was announced meanwhile is unknown.
    fn resume(&self);

    /// The listener is not connected: changes may go unheard until it is back.
    fn suspend(&self);

    /// One announcement's payload.
    fn apply(&self, payload: &str);
}

/// Listens for every one of `followers` until `shutdown` is cancelled, on one connection of
/// its own, the replica's only LISTENing session.
pub async fn run(database: PgConnectOptions, followers: Vec<Box<dyn Follower>>, shutdown: CancellationToken) {
    let pool =
        PgPoolOptions::new().max_connections(1).acquire_timeout(Duration::from_secs(10)).connect_lazy_with(
            database.application_name("plexsphere-listener").log_statements(tracing::log::LevelFilter::Trace),
        );
    let channels: Vec<&'static str> = followers.iter().map(|follower| follower.channel()).collect();
    let mut connected_before = false;
    loop {
        let listener = tokio::select! {
            () = shutdown.cancelled() => break,
            listener = listen(&pool, &channels) => listener,
        };
        match listener {
            Ok(listener) => {
                followers.iter().for_each(|follower| follower.resume());
                if connected_before {
                    tracing::info!(?channels, "listener reconnected; what it keeps in step is in use again");
                }
                connected_before = true;
                if receive(listener, &followers, &shutdown).await.is_break() {
                    break;
                }
                followers.iter().for_each(|follower| follower.suspend());
                tracing::warn!(
                    ?channels,
                    "listener lost its connection; caches are not used until it is back"
                );
            }
            Err(error) => {
                tracing::warn!(?channels, %error, "listener cannot connect; retrying");
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    () = tokio::time::sleep(RETRY) => {}
                }
            }
        }
    }
    followers.iter().for_each(|follower| follower.suspend());
    pool.close().await;
}

async fn listen(pool: &sqlx::PgPool, channels: &[&'static str]) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    // On a lost connection, return at once instead of reconnecting inside try_recv: the
    // followers must be suspended before anything else happens.
    listener.eager_reconnect(false);
    listener.listen_all(channels.iter().copied()).await?;
    Ok(listener)
}

/// Applies announcements until the connection is lost (`Continue`) or shutdown (`Break`).
async fn receive(
    mut listener: PgListener,
    followers: &[Box<dyn Follower>],
    shutdown: &CancellationToken,
) -> std::ops::ControlFlow<()> {
    loop {
        let notification = tokio::select! {
            () = shutdown.cancelled() => return std::ops::ControlFlow::Break(()),
            notification = listener.try_recv() => notification,
        };
        match notification {
            Ok(Some(notification)) => followers
                .iter()
                .filter(|follower| follower.channel() == notification.channel())
                .for_each(|follower| follower.apply(notification.payload())),
            Ok(None) => return std::ops::ControlFlow::Continue(()),
            Err(error) => {
                tracing::warn!(%error, "listener failed");
                return std::ops::ControlFlow::Continue(());
            }
        }
    }
}
