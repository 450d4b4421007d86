//! Following resets from every replica: a reset is the one thing that adds tokens, so each
//! one makes the guard forget its bucket.

use std::sync::Arc;
use std::time::Duration;

use super::Guard;
use crate::{Key, Name, NamedKey};

/// Follows resets from every replica until `shutdown`: each one makes `guard` forget its
/// bucket, so the next take asks the store (which mints it full).
///
/// When the listening connection is lost, notifications sent meanwhile are lost too, so on
/// every reconnect the guard forgets everything, which is always safe.
pub async fn follow_resets(
    pool: sqlx::PgPool,
    guard: Arc<Guard>,
    shutdown: impl std::future::Future<Output = ()> + Send,
) {
    tokio::pin!(shutdown);
    loop {
        let mut listener = loop {
            match listen(&pool).await {
                Ok(listener) => break listener,
                Err(error) => {
                    tracing::warn!(%error, "cannot listen for rate-budget resets; retrying");
                    tokio::select! {
                        () = &mut shutdown => return,
                        () = tokio::time::sleep(Duration::from_secs(1)) => {}
                    }
                }
            }
        };
        // Anything reset while nobody listened is unknown.
        guard.forget_all();
        loop {
            let message = tokio::select! {
                () = &mut shutdown => return,
                message = listener.try_recv() => message,
            };
            match message {
                Ok(Some(notification)) => guard.hear_reset(notification.payload()),
                // The connection was lost; try_recv reconnects on the next call, but what was
                // sent in between is gone.
                Ok(None) => guard.forget_all(),
                Err(error) => {
                    tracing::warn!(%error, "lost the rate-budget reset listener; reconnecting");
                    break;
                }
            }
        }
    }
}

async fn listen(pool: &sqlx::PgPool) -> Result<sqlx::postgres::PgListener, sqlx::Error> {
    let mut listener = sqlx::postgres::PgListener::connect_with(pool).await?;
    listener.listen(crate::store::RESET_CHANNEL).await?;
    Ok(listener)
}

/// What a reset notification names.
pub(super) enum Reset {
    Budget(Name, Key),
    Named(Name, NamedKey),
}

/// `name:uuid` ([`Store::reset`](crate::Store::reset)) or `named:limiter:hex`
/// ([`Store::reset_named`](crate::Store::reset_named)).
pub(super) fn parse(payload: &str) -> Option<Reset> {
    if let Some(named) = payload.strip_prefix("named:") {
        let (limiter, hex) = named.split_once(':')?;
        let mut key = [0u8; 32];
        if hex.len() != 64 {
            return None;
        }
        for (i, byte) in key.iter_mut().enumerate() {
            *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        return Some(Reset::Named(Name::new(limiter).ok()?, NamedKey(key)));
    }
    let (name, key) = payload.split_once(':')?;
    Some(Reset::Budget(Name::new(name).ok()?, uuid::Uuid::parse_str(key).ok()?.into()))
}
