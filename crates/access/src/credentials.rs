//! Node credentials authenticated recently, the access context's read cache (as the secrets
//! context keeps its own), kept per replica so a Node's requests do not each
//! pay a round trip to look its token up, and forgotten when a revocation is announced.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Authenticated Nodes by the SHA-256 of their token, with when they were authenticated.
#[derive(Debug, Default)]
struct Entries {
    nodes: HashMap<[u8; 32], (crate::AuthenticatedNode, Instant)>,
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
pub struct Lookup(u64);

impl CredentialCache {
    /// How long an authenticated token is trusted without asking the store again.
    pub const TTL: Duration = Duration::from_secs(10);

    /// An empty cache holding at most `capacity` tokens; bypassed until [`CredentialCache::resume`].
    pub fn new(capacity: usize) -> CredentialCache {
        CredentialCache { entries: Arc::default(), capacity }
    }

    /// Forgets Node `node`'s credential, and makes every lookup in flight forget what it found.
    pub fn revoke(&self, node: crate::NodeId) {
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
    pub fn get(&self, token_hash: &[u8; 32]) -> Result<crate::AuthenticatedNode, Lookup> {
        let entries = self.lock();
        match entries.nodes.get(token_hash) {
            Some((node, stored_at)) if entries.listening && stored_at.elapsed() < Self::TTL => Ok(*node),
            _ => Err(Lookup(entries.epoch)),
        }
    }

    /// Keeps what a lookup found, unless a revocation came while it ran: the store's answer may
    /// predate it.
    pub fn insert(&self, Lookup(epoch): Lookup, token_hash: [u8; 32], node: crate::AuthenticatedNode) {
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
mod tests;
