//! The revocation listener: how a revoked Node's token stops working on every replica.
//!
//! Deleting a Node announces it on [`access::NODE_REVOKED_CHANNEL`] when the deletion commits
//! (migration 0031's trigger). Each replica LISTENs on a connection of its own and drops the
//! Node from its [`CredentialCache`], so a revocation reaches every replica about a round trip
//! after it commits, not when cache entries expire (docs/adr/0011).
//!
//! An announcement sent while the listener is not connected is lost, so the cache is used only
//! while it is: a lost connection suspends the cache (every request asks the store) until the
//! listener is back, and then the cache starts empty. The same holds for the secrets a replica
//! keeps, announced on [`secrets::SECRET_CHANGED_CHANNEL`] (migration 0010); both follow
//! their channel through `crate::listener`.

use sqlx::postgres::PgConnectOptions;
use tokio_util::sync::CancellationToken;

use crate::http::CredentialCache;
use crate::listener::{self, Follower};
use crate::metrics::Metrics;

/// Listens until `shutdown` is cancelled, keeping `cache` in step with revocations.
pub async fn run(
    database: PgConnectOptions,
    cache: CredentialCache,
    metrics: Metrics,
    shutdown: CancellationToken,
) {
    listener::run(database, "plexsphere-revocations", Revocations { cache, metrics }, shutdown).await;
}

/// The credential cache, and the gauge saying whether revocations reach it.
struct Revocations {
    cache: CredentialCache,
    metrics: Metrics,
}

impl Follower for Revocations {
    fn channel(&self) -> &'static str {
        access::NODE_REVOKED_CHANNEL
    }

    fn resume(&self) {
        self.cache.resume();
        self.metrics.set_revocations_listening(true);
    }

    fn suspend(&self) {
        self.cache.suspend();
        self.metrics.set_revocations_listening(false);
    }

    /// One announcement: a Node's id, or `*` for all of them.
    fn apply(&self, payload: &str) {
        if payload == "*" {
            tracing::info!("every node credential was revoked");
            self.cache.revoke_all();
            return;
        }
        match uuid::Uuid::parse_str(payload) {
            Ok(node) => {
                tracing::debug!(%node, "node credential revoked");
                self.cache.revoke(node.into());
            }
            Err(_) => {
                // Not from the trigger: forget everything rather than keep what may be revoked.
                tracing::warn!(payload, "unreadable revocation announcement; forgetting every credential");
                self.cache.revoke_all();
            }
        }
    }
}

/// Listens until `shutdown` is cancelled, keeping `cache` in step with changed secrets
/// (migration 0010).
pub async fn run_secret_changes(
    database: PgConnectOptions,
    cache: secrets::SecretCache,
    metrics: Metrics,
    shutdown: CancellationToken,
) {
    listener::run(database, "plexsphere-secret-changes", SecretChanges(cache, metrics), shutdown).await;
}

/// The secrets this replica keeps, and the gauge saying whether changes reach them.
struct SecretChanges(secrets::SecretCache, Metrics);

impl Follower for SecretChanges {
    fn channel(&self) -> &'static str {
        secrets::SECRET_CHANGED_CHANNEL
    }

    fn resume(&self) {
        self.0.resume();
        self.1.set_secret_changes_listening(true);
    }

    fn suspend(&self) {
        self.0.suspend();
        self.1.set_secret_changes_listening(false);
    }

    /// One announcement: `domain_id:name`, or `*` for every secret.
    fn apply(&self, payload: &str) {
        let parsed = payload.split_once(':').and_then(|(domain, name)| {
            Some((uuid::Uuid::parse_str(domain).ok()?, secrets::SecretName::parse(name).ok()?))
        });
        match parsed {
            Some((domain, name)) => self.0.forget(domain.into(), &name),
            // '*', or not from the trigger: forget everything rather than keep what changed.
            None => self.0.forget_all(),
        }
    }
}
