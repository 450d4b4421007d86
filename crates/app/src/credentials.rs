//! Node credentials authenticated recently, kept per replica so a Node's requests do not each
//! pay a round trip to look its token up, and forgotten when a revocation is announced.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Authenticated Nodes by the SHA-256 of their token, with when they were authenticated.
#[derive(Debug, Default)]
struct Entries {
    nodes: HashMap<[u8; 32], (access::AuthenticatedNode, Instant)>,
    /// Bumped by every invalidation, so a lookup that raced one does not cache what it found.
    epoch: u64,
    /// Whether revocations reach this cache now; while they do not, it is bypassed.
    listening: bool,
}

/// Node credentials authenticated recently, so a Node's requests do not each pay a round trip
/// to look its token up.
///
/// Revocation reaches it through the database: deleting a Node announces it (migration 0031),
/// and the replica's revocation listener calls [`CredentialCache::revoke`], on every replica,
/// within moments. The cache is used only while that listener is connected
/// ([`CredentialCache::resume`]); while it is not, announcements could be missed, so every
/// request asks the store. An entry also lives at most [`CredentialCache::TTL`], the backstop
/// for a listener whose connection went silent without failing. Only tokens the store
/// confirmed are kept, so a flood of made-up tokens cannot fill it.
#[derive(Clone, Debug)]
pub struct CredentialCache {
    entries: Arc<Mutex<Entries>>,
    capacity: usize,
}

/// A lookup's ticket: the cache's epoch when it started (see [`CredentialCache::insert`]).
pub(crate) struct Lookup(u64);

impl CredentialCache {
    /// How long an authenticated token is trusted without asking the store again.
    pub const TTL: Duration = Duration::from_secs(10);

    /// An empty cache holding at most `capacity` tokens; bypassed until [`CredentialCache::resume`].
    pub fn new(capacity: usize) -> CredentialCache {
        CredentialCache { entries: Arc::default(), capacity }
    }

    /// Forgets Node `node`'s credential, and makes every lookup in flight forget what it found.
    pub fn revoke(&self, node: access::NodeId) {
        let mut entries = self.lock();
        entries.epoch += 1;
        entries.nodes.retain(|_, (cached, _)| cached.node_id != node);
    }

    /// Forgets every credential (all Nodes were deleted at once).
    pub fn revoke_all(&self) {
        let mut entries = self.lock();
        entries.epoch += 1;
        entries.nodes.clear();
    }

    /// Revocations reach the cache again: start afresh, since any could have been missed.
    pub fn resume(&self) {
        let mut entries = self.lock();
        entries.epoch += 1;
        entries.nodes.clear();
        entries.listening = true;
    }

    /// Revocations may not reach the cache: forget everything and ask the store until
    /// [`CredentialCache::resume`].
    pub fn suspend(&self) {
        let mut entries = self.lock();
        entries.epoch += 1;
        entries.nodes.clear();
        entries.listening = false;
    }

    /// The Node `token_hash` authenticated recently, or a ticket to look it up with.
    pub(crate) fn get(&self, token_hash: &[u8; 32]) -> Result<access::AuthenticatedNode, Lookup> {
        let entries = self.lock();
        match entries.nodes.get(token_hash) {
            Some((node, stored_at)) if entries.listening && stored_at.elapsed() < Self::TTL => Ok(*node),
            _ => Err(Lookup(entries.epoch)),
        }
    }

    /// Keeps what a lookup found, unless a revocation came while it ran: the store's answer may
    /// predate it.
    pub(crate) fn insert(
        &self,
        Lookup(epoch): Lookup,
        token_hash: [u8; 32],
        node: access::AuthenticatedNode,
    ) {
        let mut entries = self.lock();
        if !entries.listening || entries.epoch != epoch {
            return;
        }
        if entries.nodes.len() >= self.capacity {
            entries.nodes.retain(|_, (_, stored_at)| stored_at.elapsed() < Self::TTL);
            if entries.nodes.len() >= self.capacity {
                // Still full of live entries: start over rather than track recency on the hot path.
                entries.nodes.clear();
            }
        }
        entries.nodes.insert(token_hash, (node, Instant::now()));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        // Entries are plain values; a panic elsewhere cannot leave one half-written.
        self.entries.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node() -> access::AuthenticatedNode {
        access::AuthenticatedNode { node_id: access::NodeId::random(), domain_id: access::DomainId::random() }
    }

    fn listening_cache() -> CredentialCache {
        let cache = CredentialCache::new(10);
        cache.resume();
        cache
    }

    #[test]
    fn a_revocation_during_a_lookup_keeps_the_lookups_answer_out_of_the_cache() {
        let cache = listening_cache();
        let node = node();
        let Err(lookup) = cache.get(&[1; 32]) else { panic!("an empty cache holds nothing") };
        // The store answered before the revocation committed; the announcement arrives first.
        cache.revoke(node.node_id);
        cache.insert(lookup, [1; 32], node);
        assert!(cache.get(&[1; 32]).is_err());
    }

    #[test]
    fn a_revocation_forgets_only_that_nodes_credentials() {
        let cache = listening_cache();
        let (revoked, kept) = (node(), node());
        for (hash, node) in [([1; 32], revoked), ([2; 32], kept)] {
            let Err(lookup) = cache.get(&hash) else { panic!("not cached yet") };
            cache.insert(lookup, hash, node);
        }
        cache.revoke(revoked.node_id);
        assert!(cache.get(&[1; 32]).is_err());
        assert_eq!(cache.get(&[2; 32]).ok(), Some(kept));
    }

    #[test]
    fn while_revocations_cannot_arrive_the_cache_is_bypassed() {
        let cache = CredentialCache::new(10);
        let Err(lookup) = cache.get(&[1; 32]) else { panic!("not cached yet") };
        cache.insert(lookup, [1; 32], node());
        assert!(cache.get(&[1; 32]).is_err(), "a cache never resumed keeps nothing");
        cache.resume();
        let Err(lookup) = cache.get(&[1; 32]) else { panic!("not cached yet") };
        cache.insert(lookup, [1; 32], node());
        assert!(cache.get(&[1; 32]).is_ok());
        cache.suspend();
        assert!(cache.get(&[1; 32]).is_err());
    }
}
