//! What the replica's listener ([`crate::runtime::listener`]) keeps in step: credentials, secrets,
//! the guard's pre-check, and the rules and tiers.
//!
//! The revocations: how a revoked Node's token stops working on every replica.
//!
//! Deleting a Node announces it on [`access::NODE_REVOKED_CHANNEL`] when the deletion commits
//! (migration 0031's trigger). Each replica's listener hears it and drops the Node from its
//! [`CredentialCache`], so a revocation reaches every replica about a round trip
//! after it commits, not when cache entries expire (docs/adr/0011).
//!
//! An announcement sent while the listener is not connected is lost, so the cache is used only
//! while it is: a lost connection suspends the cache (every request asks the store) until the
//! listener is back, and then the cache starts empty. The same holds for the secrets a replica
//! keeps, announced on [`secrets::SECRET_CHANGED_CHANNEL`] (migration 0010).
//!
//! A reset of a bucket reaches every replica's guard on `ratebudget`'s reset channel, and a
//! rule or tier change reaches `service::follow` on theirs ([`rules_and_tiers`]).

use std::sync::Arc;

use access::CredentialCache;
use service::Heard;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};

use crate::observation::metrics::Metrics;
use crate::runtime::listener::Follower;

/// The rules and tiers channels' followers, and what they hear, for `service::follow`: they
/// pass it on to its task, which reads the database.
pub fn rules_and_tiers() -> (Vec<Box<dyn Follower>>, UnboundedReceiver<Heard>) {
    let (tell, heard) = tokio::sync::mpsc::unbounded_channel();
    let followers: Vec<Box<dyn Follower>> = vec![
        Box::new(Changes { channel: rules::CHANGES_CHANNEL, tell: tell.clone() }),
        Box::new(Changes { channel: access::TIER_CHANNEL, tell }),
    ];
    (followers, heard)
}

/// One channel's follower: tells `service::follow` what it heard.
struct Changes {
    channel: &'static str,
    tell: UnboundedSender<Heard>,
}

impl Follower for Changes {
    fn channel(&self) -> &'static str {
        self.channel
    }

    fn resume(&self) {
        // Both followers resume at once; reading twice costs a statement, and the newer
        // snapshot wins whichever lands last.
        if self.channel == rules::CHANGES_CHANNEL {
            let _ = self.tell.send(Heard::Connected);
        }
    }

    /// The poll is the backstop while nobody listens.
    fn suspend(&self) {}

    fn apply(&self, payload: &str) {
        let heard = if self.channel == rules::CHANGES_CHANNEL {
            Heard::Rules(payload.parse().ok())
        } else {
            Heard::Tiers
        };
        let _ = self.tell.send(heard);
    }
}

/// The credential cache, and the gauge saying whether revocations reach it.
pub struct Revocations {
    /// The cache.
    pub cache: CredentialCache,
    /// Where the gauge is.
    pub metrics: Metrics,
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

/// The secrets this replica keeps, and the gauge saying whether changes reach them.
pub struct SecretChanges(pub secrets::SecretCache, pub Metrics);

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

/// The guard's pre-check, told of every reset ([`ratebudget::Guard::hear_reset`]): a reset is
/// the one thing that adds tokens, so the guard forgets the bucket; and, on every
/// (re)connection, everything it knew, since resets may have been missed meanwhile.
pub struct Resets(pub Arc<ratebudget::Guard>);

impl Follower for Resets {
    fn channel(&self) -> &'static str {
        ratebudget::RESET_CHANNEL
    }

    fn resume(&self) {
        self.0.forget_all();
    }

    /// While nobody listens the guard keeps deciding: what it knew stays true until a reset,
    /// and on reconnection it forgets everything.
    fn suspend(&self) {}

    fn apply(&self, payload: &str) {
        self.0.hear_reset(payload);
    }
}

/// The RLQS allocator's announcements: a bucket whose shares should be decided again now (a
/// report freed capacity, or found its holder short of its fair share). Every stream holding
/// the bucket hears it and answers at once. Unheard (the listener down), each waits for its
/// own next report instead: slower, never more than the rule.
pub struct QuotaRebalances(pub tokio::sync::broadcast::Sender<uuid::Uuid>);

impl Follower for QuotaRebalances {
    fn channel(&self) -> &'static str {
        "plexsphere_quota"
    }

    fn resume(&self) {}

    fn suspend(&self) {}

    fn apply(&self, payload: &str) {
        if let Ok(key) = payload.parse() {
            // No stream listening is no one to tell.
            let _ = self.0.send(key);
        }
    }
}
